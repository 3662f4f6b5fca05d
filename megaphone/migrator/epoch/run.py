"""A run of G >= 1 consecutive epochs as one Spark job (one epoch is a group of one; a batch
run by its epoch column runs its labels in groups: docs/groups.md), in the named phases
:data:`DRIVER_PHASES`, each timed into the metrics (``phases_s``, shared evenly in a group)
and the trace, and each a crash point (docs/worker-store.md, "The epoch in named phases").
Only the group's first epoch moves bins, and the steps due then may end the group early
(:meth:`~megaphone.plans.plan_queue.PlanQueue.group_end`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from megaphone.migrator.epoch.routing_operator import (
    EpochLayout,
    commit_record,
    epoch_layout,
    epoch_spec,
    ran_on,
)
from megaphone.migrator.epoch.spark_job import (
    EpochReport,
    PassedOn,
    epoch_job,
    report_epochs,
    run_job,
    task_results,
)
from megaphone.migrator.epoch.state_holder import POLICY_HISTORY
from megaphone.migrator.epoch.state_reader import bins_by_owner
from megaphone.migrator.statedir.commit import StreamPosition
from megaphone.migrator.statedir.faults import crash_point
from megaphone.migrator.statedir.inbox import PlanInbox
from megaphone.migrator.task.columns import LABEL
from megaphone.migrator.task.spec import EpochSpec, row_bytes_bound, with_labels
from megaphone.migrator.task.transfer import receivers_pull
from megaphone.migrator.task.updates import Update
from megaphone.migrator.trace import epoch_trace, take_marks, trace_enabled
from megaphone.operators.process import watermark
from megaphone.plans.plan_queue import PolicyInputs
from megaphone.records import EpochMetrics
from megaphone.routing.placement import away
from megaphone.spark import check_python_workers, task_slots

if TYPE_CHECKING:
    from pyspark.accumulators import Accumulator
    from pyspark.sql import SparkSession

    from megaphone.migrator.epoch.groups import GroupSizes
    from megaphone.migrator.epoch.hot_keys import HotKeys
    from megaphone.migrator.epoch.schemas import PipelineSchema
    from megaphone.migrator.epoch.spark_job import MapSides
    from megaphone.migrator.epoch.state_holder import StateHolder


class DriverState(Protocol):
    """What a run reads and updates of the driver that starts it: what a pipeline's epochs
    keep from one to the next (:class:`~megaphone.migrator.epoch.driver.EpochDriver` has it).
    Declared here, so that the run does not import the driver that imports it."""

    spark: SparkSession
    holder: StateHolder
    schema: PipelineSchema
    hot: HotKeys
    groups: GroupSizes
    map_sides: MapSides
    bin_load: np.ndarray
    task_slots: int | None
    task_results: Accumulator | None
    last_watermark: tuple[int, int | None] | None

    def outputs_schema(self) -> T.StructType:
        """The Spark schema of the pipeline's outputs."""
        ...

    def host_slots(self, hosts: Sequence[str]) -> dict[str, int]:
        """Each host's task slots, for the commit record (empty when unknown)."""
        ...

    def outputs_frame(self, outputs: pa.Table) -> DataFrame:
        """An epoch's outputs as a DataFrame."""
        ...

#: The driver's phases of an epoch, in order.
DRIVER_PHASES = ("admit", "layout", "submit", "collect", "commit", "cleanup")
#: The workers' phases, inside ``collect``.
WORKER_PHASES = ("export", "receive", "install", "apply")
#: Every phase name: crash points and timings use these.
PHASES = DRIVER_PHASES + WORKER_PHASES
#: Bins each old owner's store writes ahead of their moves (docs/transfer.md, "Bins written
#: ahead"): a few epochs' worth of moves at the deadline policy's pace on the billion-key run.
AHEAD_BINS = 16
#: Weight of the newest epoch in the per-bin load (records per bin, exponentially smoothed).
LOAD_SMOOTHING = 0.3
#: The driver's clock for an epoch's processing time (seconds; tests replace it).
processing_clock: Callable[[], float] = time.time


@dataclass(frozen=True)
class EpochSource:
    """The epochs still to run from one batch. Without an epoch ``column``: one epoch of the
    whole ``batch``. With one: the ``labels`` left in order and, per label, the largest event
    time of its records (``None`` where none, or without event time). ``stream`` is the
    micro-batch's stream position so far, for a stream's batch (each epoch's commit adds
    itself to it; the batch's kept outputs are not pruned before it is done: a replay reads
    them)."""

    batch: DataFrame
    column: str | None = None
    labels: tuple[int, ...] = ()
    max_event_times: tuple[int | None, ...] = ()
    stream: StreamPosition | None = None

    @property
    def count(self) -> int:
        """Epochs left in the source."""
        return len(self.labels) if self.column is not None else 1


class EpochRun:
    """Runs the next group of at most ``limit`` epochs of ``source`` after the last commit of
    ``driver``'s pipeline through :data:`DRIVER_PHASES` (call :meth:`run` once; :attr:`size`
    epochs ran). The run does the work of its epochs itself (admission, task spec, commits,
    metrics) and reads of its driver only what epochs keep from one to the next."""

    # Set by :meth:`prepare`: the group's start (``time.time()``), who holds which bins, and
    # the spec every task of its job gets.
    started: float
    layout: EpochLayout
    spec: EpochSpec

    def __init__(self, driver: DriverState, source: EpochSource, limit: int,
                 input_end: float | None) -> None:
        self.driver = driver
        self.holder = driver.holder
        self.epoch = self.holder.epoch + 1
        self.source = source
        self.limit = max(1, min(limit, source.count))
        self.input_end = input_end
        #: Epochs in the group (known after ``admit``).
        self.size = 0
        self.phases: dict[str, float] = {}
        #: Each phase's wall-clock ``(start, end)``, for the trace.
        self.spans: dict[str, tuple[float, float]] = {}
        #: Runs of the group's job (more than one when it failed for a retryable reason).
        self.attempts = 0
        #: The metrics records of the group's epochs, once committed.
        self.records: list[EpochMetrics] = []

    @property
    def last(self) -> int:
        """The group's last epoch."""
        return self.epoch + max(self.size, 1) - 1

    @property
    def grouped(self) -> bool:
        """True when the epochs run by their label (a batch's epoch column)."""
        return self.source.column is not None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time phase ``name`` into :attr:`phases` and pass its crash point at its end."""
        started, wall = time.perf_counter(), time.time()
        yield
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started
        self.spans[name] = (self.spans.get(name, (wall, 0.0))[0], time.time())
        if name != "commit":  # the commit's crash point is inside its write (before rename)
            crash_point(name, self.epoch, self.holder.local_dir)

    def run(self, before_commit: Callable[[pa.Table], None] | None = None) -> list[pa.Table]:
        """Run the group end to end; each epoch's outputs, in order. ``before_commit(outputs)``
        is called with the first epoch's outputs before any commit point (where a JVM call
        may still fail and leave nothing committed). A failure before the group's last commit
        point leaves the holder to roll its workers back. Before the pipeline's first epoch, the
        session's Python workers are checked once (:func:`~megaphone.spark.check_python_workers`):
        workers that cannot run megaphone fail the run before it changes anything."""
        check_python_workers(self.driver.spark)
        try:
            self.prepare()
            with self.phase("submit"):
                first = self.job()
            with self.phase("collect"):
                table, self.attempts = run_job(first, self.job, self.epoch,
                                                row_bytes_bound(self.spec))
                reports = self.reports(table)
                if before_commit is not None:
                    before_commit(reports[0].outputs)
            return self.finish(reports)
        except BaseException:
            self.holder.failed(self.last)
            raise

    def prepare(self) -> None:
        """The phases before the job: ``admit`` (the batch checked, the plans' steps due, the
        group's size) and ``layout`` (who holds which bins, the tasks' spec)."""
        driver, holder, epoch = self.driver, self.holder, self.epoch
        self.started = started = time.time()
        with self.phase("admit"):
            self._columns, update, shuffle, outputs = self._admit()  # state dir made at first use
            state, queue = holder.state_dir, holder.plans
            inbox = PlanInbox.of_state_dir(state)  # plans posted by `megaphone migrate`
            inbox.take(queue.to_list(), holder.submit_plan)
            lag = max(0.0, started - self.input_end) if self.input_end is not None else 0.0
            with queue.lock:
                # saved before the job, so a re-run routes alike
                if queue.steps_due(epoch, self._policy_inputs(lag)):
                    queue.table.save(state.paths.routing)
                self.size = queue.group_end(epoch, epoch + self.limit - 1,
                                            driver.groups.adaptive) - epoch + 1
        with self.phase("layout"):
            with queue.lock:
                self.layout = epoch_layout(queue.table, holder.commit, epoch, state)
            self.spec = self._spec(update, shuffle, outputs, self.layout,
                                   self.source.labels[:self.size], started)

    def job(self, passed_on: PassedOn | None = None) -> DataFrame:
        """The group's Spark job over its source's batch (a new DataFrame each call: a rerun
        needs one); ``passed_on``: as :func:`~megaphone.migrator.epoch.spark_job.epoch_job`'s."""
        driver, spec, layout = self.driver, self.spec, self.layout
        rows, columns = self.source.batch, self._columns
        if self.grouped:
            labels = spec.labels
            label = F.col(self.source.column)
            columns = {**columns, LABEL: label.cast("long")}
            rows = rows.where(label.between(labels[0], labels[-1]))
        queue = self.holder.plans
        map_side = driver.map_sides.get(layout.version, columns, spec,
                                        lambda: queue.table.owners(layout.epoch))
        return epoch_job(driver.spark, rows, map_side, spec, layout.partitions, passed_on)

    def passed_on(self) -> PassedOn:
        """A new hand-over of the group's results for a job whose rows are its outputs (a
        stage of a chain run as one job)."""
        driver = self.driver
        if driver.task_results is None:
            driver.task_results = task_results(driver.spark)
        return PassedOn(driver.task_results, driver.outputs_schema())

    def reports(self, table: pa.Table) -> list[EpochReport]:
        """Each epoch's report from the group job's results ``table``."""
        stream = self.source.stream
        return report_epochs(table, self.layout, self.spec, self.started,
                             stream.batch_id if stream is not None else None)

    def finish(self, reports: list[EpochReport]) -> list[pa.Table]:
        """The phases after the job: ``commit`` (each epoch's, in order) and ``cleanup`` (kept
        outputs pruned), then the group's metrics and trace recorded; each epoch's outputs."""
        holder, epoch, layout = self.holder, self.epoch, self.layout
        state, stream = holder.state_dir, self.source.stream
        with self.phase("commit"):
            self._commit_all(layout, reports)
        self.driver.last_watermark = (self.last, self.spec.watermark) \
            if self.spec.update.is_process and not self.grouped else None
        with self.phase("cleanup"):
            keep = self.last - holder.config.keep_outputs + 1
            if stream is not None:  # a stream's batch keeps its epochs' outputs (a replay reads)
                keep = min(keep, (stream.epoch_list() or [epoch])[0])
            state.drop_outputs([e for e in state.output_epochs() if e < keep])
        share = {name: seconds / self.size for name, seconds in self.phases.items()}
        for record in self.records:
            record.job_attempts, record.phases_s = self.attempts, dict(share)
        marks = [take_marks(record) for record in self.records]  # the trace's, not metrics
        trace = epoch_trace(epoch, self.spans, marks[0], layout.outgoing, layout.incoming) \
            if trace_enabled() else None  # the group's phases, its first epoch's workers
        if trace is not None:
            state.append_trace(trace)  # a group's is for `megaphone explain`, not policies
        holder.recorded(self.records, None if self.grouped else trace)
        return [r.outputs for r in reports]

    def _admit(self) -> tuple[dict[str, Column], Update, pa.Schema, pa.Schema]:
        """Check the batch against the pipeline (creating the state dir on first use): its
        record columns (``key``, and ``value`` and ``_t`` where used), its update, and its
        tasks' shuffle and outputs schemas."""
        holder, schema, batch = self.holder, self.driver.schema, self.source.batch
        key_type, value_type = schema.batch_types(batch.schema)
        update = schema.update(holder.manifest, value_type)
        columns = schema.record_columns(key_type, update)
        if holder.key_type not in (None, key_type):  # known once there is state, or given
            raise TypeError(f"key column {schema.key!r} holds {key_type} keys but the "
                            f"pipeline's keys are {holder.key_type}")
        if holder.state is None:
            holder.create(key_type)
        state = holder.state_dir
        if value_type is not None and update.is_builtin and \
                state.manifest.get("value_kind") is None:
            state.set_manifest("value_kind", update.value_kind)  # fixed from now on
        if update.is_process and value_type is not None:
            stored = state.manifest.get("value_type")
            if stored is None:
                state.set_manifest("value_type", value_type.json())
            elif (theirs := T._parse_datatype_json_string(stored)) != value_type:
                raise TypeError(f"value column {schema.value!r} is {value_type.simpleString()} "
                                f"but the pipeline's are {theirs.simpleString()}")
        shuffle, outputs = schema.task_schemas(key_type, update, batch.schema, state.manifest)
        return columns, update, shuffle, outputs

    def _policy_inputs(self, lag_s: float) -> PolicyInputs:
        """What adaptive plans' policies see before the group (metadata only)."""
        driver, holder = self.driver, self.holder
        load = driver.bin_load

        def sizes() -> dict[int, int]:
            return dict(enumerate(holder.bin_sizes().bytes.tolist()))

        def records() -> dict[int, float]:
            hot = np.flatnonzero(load)
            return dict(zip(hot.tolist(), load[hot].tolist(), strict=True))

        if driver.task_slots is None:  # asked once
            driver.task_slots = task_slots(driver.spark)
        metrics, traces = holder.metrics, holder.traces
        return PolicyInputs(
            history=lambda: list(metrics)[-POLICY_HISTORY:], bin_bytes=sizes,
            bin_records=records, lag_s=lag_s, parallelism=driver.task_slots,
            traces=lambda: tuple(traces), homes=holder.commit.worker_homes(),
            host_slots=holder.commit.slots)

    def _spec(self, update: Update, shuffle: pa.Schema, outputs: pa.Schema, layout: EpochLayout,
              labels: tuple[int, ...], started: float) -> EpochSpec:
        """The metadata every task of the group gets (built by
        :func:`~megaphone.migrator.epoch.routing_operator.epoch_spec`): for a group its labels
        and labelled shuffle; for an event-time operator each epoch's watermark, as one job per
        epoch would have it (docs/groups.md, "Event time"), and one processing time from
        :data:`processing_clock` (an operator with ``processing_time`` gets it as watermark)."""
        holder = self.holder
        config, committed = holder.config, holder.commit
        fields: dict[str, Any] = {}
        if update.is_process:
            owners = holder.routing.owners(layout.epoch)
            marks, high = [], committed.max_event_time
            for top in self.source.max_event_times[:len(labels)]:
                marks.append(watermark(high, update.fn.lateness_us))
                if top is not None and (high is None or top > high):
                    high = top
            first = watermark(committed.max_event_time, update.fn.lateness_us)
            now = round(processing_clock() * 1_000_000)
            if getattr(update.fn, "processing_time", False):  # its timers are due by the clock
                first, marks = now, [now] * len(marks)
            fields = {"watermark": first, "processing_time_us": now,
                      "owned": {w: tuple(b) for w, b in bins_by_owner(owners).items()},
                      "watermarks": tuple(marks)}
        if self.grouped:
            fields["labels"], shuffle = tuple(labels), with_labels(shuffle)
        return epoch_spec(
            holder.state_dir, layout, committed, holder.routing,
            update=update,
            output_schema=outputs,
            chunk_bytes=config.chunk_bytes,
            transfer=config.transfer,
            has_event_time=config.event_time is not None,
            shuffle_schema=shuffle,
            local_dir=holder.local_dir,
            run_id=holder.run_id,
            ahead=holder.plans.upcoming(AHEAD_BINS),
            started_at=started,
            pull_exports=receivers_pull(self.driver.local_slots, holder.state_dir.manifest,
                                        config.transfer),
            combine_outputs=self.driver.combine_outputs,
            **fields,
            **self.driver.hot.spec_fields(update, layout, self.driver.task_slots or 1),
        )

    def _commit_all(self, layout: EpochLayout, reports: list[EpochReport]) -> None:
        """Commit the group's epochs in order (:meth:`StateDir.commit_epoch`: each one's outputs
        kept, then its commit record). Bins that moved at the first epoch stay pending drops
        until the next group's first epoch (a retried group job may export them again)."""
        holder, load = self.holder, self.driver.bin_load
        queue, before = holder.plans, holder.commit
        stream = self.source.stream
        for report in reports:
            record = report.record
            at = dataclasses.replace(layout, epoch=record.epoch)
            if stream is not None and self.grouped:  # the epoch is one of the batch's epochs
                stream = stream.with_epoch(record.epoch)
            load *= 1.0 - LOAD_SMOOTHING  # the driver's smoothed per-bin load
            load += LOAD_SMOOTHING * report.load
            if self.input_end is not None and record.latency_s is None:
                record.latency_s = record.finished - self.input_end
            with queue.lock:
                queue.committed(record.epoch, report.bytes_by_bin)
                commit = commit_record(at, before.stream if stream is None else stream,
                                       queue.to_list(), record.per_worker, before,
                                       self.driver.host_slots)
                if self.grouped:
                    commit.label = record.label
                record.away = away(commit.worker_homes(), ran_on(record.per_worker))
                holder.state_dir.commit_epoch(commit, report.outputs)  # the epoch's commit point
                holder.commit = commit
            before = commit
            self.records.append(record)
