"""A run of G >= 1 consecutive epochs as one Spark job, in named phases that are timed and can
be crash-tested. One epoch is a group of one (G = 1); a batch run by its epoch column runs its
labels in groups (Drizzle's group scheduling; docs/groups.md).

``admit`` (take plans handed over, ask adaptive policies, save the routing; the steps due at
the group's first epoch may end the group early:
:meth:`~megaphone.plans.plan_queue.PlanQueue.group_end`) → ``layout`` (the routing operator F:
who owns, ships and installs what; only the first epoch moves bins) → ``submit`` (build the
job over the records of every epoch, each carrying its label in a group) → ``collect`` (run it:
exports, shuffle, every worker's install, then each epoch applied and committed in order; the
outputs and metrics come back in the job's results; the job is run again if the store service
died under it) → ``commit`` (per epoch, in order: its outputs kept for replay, then the
driver's commit record, the epoch's commit point; a crash between two leaves the driver at
the last one written, and recovery rolls workers back to it) → ``cleanup`` (old outputs).
The workers' phases ``export``, ``install`` and ``apply`` run inside ``collect``. Each phase's
seconds go to the epochs' metrics (``phases_s``, shared evenly in a group), its wall-clock span
to the SnailTrail trace (:mod:`megaphone.migrator.trace`, with the workers' marks), and each
phase is a crash-injection point of the same name (:mod:`megaphone.migrator.statedir.faults`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from megaphone.migrator.epoch.routing_operator import EpochLayout, commit_record, epoch_layout
from megaphone.migrator.epoch.spark_job import (
    EpochResults,
    epoch_job,
    epoch_metrics,
    split_group_results,
    split_results,
)
from megaphone.migrator.statedir.commit import StreamPosition
from megaphone.migrator.statedir.faults import crash_point
from megaphone.migrator.statedir.inbox import take_plans
from megaphone.migrator.task.columns import LABEL
from megaphone.migrator.task.updates import UpdateError
from megaphone.migrator.trace import epoch_trace, take_marks, trace_enabled
from megaphone.plans.policy import MigrationPolicy
from megaphone.records import EpochMetrics, WorkerMetrics

if TYPE_CHECKING:
    from megaphone.migrator.epoch.driver import Admission, EpochDriver

log = logging.getLogger("megaphone.epoch")

#: The driver's phases of an epoch, in order.
DRIVER_PHASES = ("admit", "layout", "submit", "collect", "commit", "cleanup")
#: The workers' phases, inside ``collect``.
WORKER_PHASES = ("export", "receive", "install", "apply")
#: Every phase name: crash points and timings use these.
PHASES = DRIVER_PHASES + WORKER_PHASES
#: Runs of an epoch's job before its error is raised, when it failed for a reason in
#: :data:`RETRYABLE`.
JOB_ATTEMPTS = 3
#: Failures an epoch's job is run again for (it is idempotent: workers that committed replay
#: their outputs, the others apply): the store service failed, or Spark lost an executor after
#: some result tasks had finished and cannot rerun only the lost part of a Python map stage
#: ("indeterminate output").
RETRYABLE = ("StoreUnavailable", "LeaseLost", "A shuffle map stage with indeterminate output")


def retryable(error_text: str) -> bool:
    """Whether a failed epoch job (its Spark error's text) is run again."""
    return any(mark in error_text for mark in RETRYABLE)


#: Writes an epoch's outputs file while the driver writes its commit record.
_WRITER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="megaphone-outputs")


@dataclass(frozen=True)
class EpochSource:
    """The epochs still to run from one batch. Without an epoch ``column``: one epoch of the
    whole ``batch``. With one: the ``labels`` left in order and, per label, the largest event
    time of its records (``None`` where none, or without event time). ``stream`` is the
    micro-batch's stream position so far, for a stream's batch (each epoch's commit adds
    itself to it), and ``keep_from`` the batch's first epoch: its kept outputs are not pruned
    before the batch is done (a replay reads them)."""

    batch: DataFrame
    column: str | None = None
    labels: tuple[int, ...] = ()
    max_event_times: tuple[int | None, ...] = ()
    stream: StreamPosition | None = None
    keep_from: int | None = None

    @property
    def count(self) -> int:
        """Epochs left in the source."""
        return len(self.labels) if self.column is not None else 1


class EpochRun:
    """Runs the next group of at most ``limit`` epochs of ``source`` from epoch ``epoch``
    through :data:`DRIVER_PHASES` for ``driver`` (call :meth:`run` once; :attr:`size` epochs
    ran). ``adaptive(policy)``: epochs a group may last while an adaptive plan runs."""

    def __init__(self, driver: EpochDriver, epoch: int, source: EpochSource, limit: int,
                 input_end: float | None,
                 adaptive: Callable[[MigrationPolicy], int] | None = None) -> None:
        self.driver = driver
        self.epoch = epoch
        self.source = source
        self.limit = max(1, min(limit, source.count))
        self.adaptive = adaptive
        self.input_end = input_end
        #: Epochs in the group (known after ``admit``).
        self.size = 0
        self.phases: dict[str, float] = {}
        #: Each phase's wall-clock ``(start, end)``, for the trace.
        self.spans: dict[str, tuple[float, float]] = {}
        self.attempts = 0
        #: The metrics records of the group's epochs, once committed.
        self.records: list[EpochMetrics] = []
        #: The first epoch's outputs (the whole batch's without an epoch column), collected.
        self.outputs: list[pa.Table] = []
        self._marks: dict[int, WorkerMetrics] = {}

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
            crash_point(name, self.epoch, self.driver.local_dir)

    def run(self, before_commit: Callable[[pa.Table], None] | None = None) -> list[pa.Table]:
        """Run the group end to end; each epoch's outputs, in order. ``before_commit(outputs)``
        is called with the first epoch's outputs before any commit point (where a JVM call
        may still fail and leave nothing committed)."""
        driver, epoch = self.driver, self.epoch
        started = time.time()
        with self.phase("admit"):
            admitted = driver.admit(self.source.batch)  # creates the state dir on first use
            state, queue = admitted.state, admitted.queue
            take_plans(state, driver.holder.submit)  # plans posted by `megaphone migrate`
            lag = max(0.0, started - self.input_end) if self.input_end is not None else 0.0
            with queue.lock:
                # saved before the job, so a re-run routes alike
                if queue.steps_due(epoch, driver.policy_inputs(lag)):
                    queue.table.save(state.routing_path)
                self.size = queue.group_end(epoch, epoch + self.limit - 1,
                                            self.adaptive) - epoch + 1
        labels = self.source.labels[:self.size]
        with self.phase("layout"):
            with queue.lock:
                layout = epoch_layout(queue.table, admitted.committed, epoch,
                                      driver.holder.stateful_workers())
            spec = driver.spec(self.source, admitted, layout, labels)
        with self.phase("submit"):
            columns, rows = admitted.columns, self.source.batch
            if self.source.column is not None:
                label = F.col(self.source.column)
                columns = {**columns, LABEL: label.cast("long")}
                rows = rows.where(label.between(labels[0], labels[-1]))
            map_side = driver.map_sides.get(layout.version, columns, spec,
                                            lambda: queue.table.owners(epoch))

            def job() -> DataFrame:
                return epoch_job(driver.spark, rows, map_side, spec, layout.partitions)

            first = job()
        with self.phase("collect"):
            table = self._collect(first, job)
            results = split_group_results(table, range(epoch, epoch + self.size)) \
                if self.grouped else [split_results(table)]
            if before_commit is not None:
                before_commit(results[0].outputs)
        finished = time.time()
        with self.phase("commit"):
            self._commit_all(admitted, layout, results, labels, (started, finished))
        with self.phase("cleanup"):
            keep = self.last - driver.keep_outputs + 1
            state.prune_outputs(keep if self.source.keep_from is None
                                else min(keep, self.source.keep_from))
        trace = epoch_trace(epoch, self.spans, self._marks, layout.outgoing, layout.incoming) \
            if trace_enabled() else None
        if trace is not None:  # the group's phases with its first epoch's workers' marks
            state.traces.append(trace)
        share = {name: seconds / self.size for name, seconds in self.phases.items()}
        for record in self.records:
            record.job_attempts = self.attempts
            record.phases_s = dict(share)
            state.append_metrics(record.to_dict())  # a crash before it loses the line only
            # a group's trace is for `megaphone explain`, not for policies, which read an
            # epoch's times from it
            driver.recorded(record, None if self.grouped else trace)
        return [r.outputs for r in results]

    def _commit_all(self, admitted: Admission, layout: EpochLayout, results: list[EpochResults],
                    labels: tuple[int, ...], span: tuple[float, float]) -> None:
        """Commit the group's epochs in order: each one's outputs kept (written in parallel
        with its commit record: their fsyncs overlap), then its commit record. Bins that moved
        at the first epoch stay pending drops until the next group's first epoch (a retried
        group job may export them again)."""
        driver, (started, finished) = self.driver, span
        state, queue, before = admitted.state, admitted.queue, admitted.committed
        stream = self.source.stream
        for i, result in enumerate(results):
            epoch = self.epoch + i
            at = layout if i == 0 else dataclasses.replace(layout, epoch=epoch)
            if stream is not None and self.grouped:  # the epoch is one of the batch's epochs
                stream = stream.with_epoch(epoch)
            report = epoch_metrics(at, started, finished, result,
                                   stream.batch_id if stream is not None else None)
            record = report.record
            marks = take_marks(record)  # for the trace (the first epoch's), not the metrics
            if i:
                record.bins_moved = 0  # the group's moves happened at its first epoch
            else:
                self._marks = marks
            if self.grouped:
                record.group, record.group_size, record.label = self.epoch, self.size, labels[i]
            record.duration_s = (finished - started) / self.size
            driver.track_load(result.load_bins, result.load_counts)
            if self.input_end is not None and record.latency_s is None:
                record.latency_s = finished - self.input_end
            kept = _WRITER.submit(state.write_outputs, epoch, result.outputs)
            try:
                with queue.lock:
                    queue.committed(epoch, report.bytes_by_bin)
                    commit = commit_record(at, before.stream if stream is None else stream,
                                           queue.to_list(), record.per_worker, before)
                    if self.grouped:
                        commit.label = labels[i]
                    state.write_commit(commit, after=kept.result)  # the epoch's commit point
                    driver.holder.committed(commit)
            finally:
                concurrent.futures.wait([kept])
            before = commit
            self.records.append(record)

    def _collect(self, job: DataFrame, rebuild: Callable[[], DataFrame]) -> pa.Table:
        """Run the job; again if it failed for a :data:`RETRYABLE` reason (the epoch is idempotent:
        workers that committed replay their outputs, the others apply). A rerun is a new
        DataFrame: adaptive execution keeps a failed stage's error in the old one's plan. A
        general update that failed on a key is raised as its :class:`UpdateError`, not as the
        Spark error that carried it (kept in its ``__context__``)."""
        while True:
            self.attempts += 1
            if self.attempts > 1:
                job = rebuild()
            try:
                return job.toArrow()
            except Exception as exc:
                text = str(exc)
                failed = UpdateError.from_text(text)
                if failed is not None:
                    raise failed from None
                if self.attempts >= JOB_ATTEMPTS or not retryable(text):
                    raise
                log.warning("epoch %d: its job failed (%s); running it again (attempt %d)",
                            self.epoch, text.splitlines()[0][:200], self.attempts + 1)
