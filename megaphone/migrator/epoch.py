"""One epoch's lifecycle on the driver, in named phases that are timed and can be crash-tested.

``admit`` (take plans handed over, ask adaptive policies, save the routing) → ``layout`` (who
owns, ships and installs what) → ``launch`` (build the epoch's Spark job) → ``collect`` (run it:
exports, shuffle, every worker's install, apply and commit; outputs and metrics come back in
the job's results as an Arrow table, which becomes a DataFrame when the caller wants one; the
job is run again if the store service died under it) → ``commit`` (the epoch's outputs kept
for replay, then the driver's commit record: the epoch's commit point) → ``cleanup`` (old
outputs). The workers' phases ``export``, ``install`` and ``apply`` run inside ``collect``.
Each phase's seconds go to the epoch's metrics (``phases_s``), its wall-clock span to the
epoch's SnailTrail trace (:mod:`megaphone.migrator.trace`, with the workers' marks), and each
phase is a crash-injection point of the same name (:mod:`megaphone.migrator.faults`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession

from megaphone.migrator.commit import Commit
from megaphone.migrator.epoch_spec import EpochSpec
from megaphone.migrator.faults import crash_point
from megaphone.migrator.inbox import take_plans
from megaphone.migrator.layout import EpochLayout, commit_record, epoch_layout
from megaphone.migrator.plan_queue import PlanQueue, PolicyInputs
from megaphone.migrator.spark_job import MapSides, epoch_job, epoch_metrics, split_results
from megaphone.migrator.statedir import StateDir
from megaphone.migrator.trace import epoch_trace, take_marks, trace_enabled
from megaphone.migrator.updates import Update, UpdateError
from megaphone.plans.plan import MigrationPlan
from megaphone.records import EpochMetrics
from megaphone.snailtrail import EpochTrace

log = logging.getLogger("megaphone.epoch")

#: The driver's phases of an epoch, in order.
DRIVER_PHASES = ("admit", "layout", "launch", "collect", "commit", "cleanup")
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
class Admission:
    """A batch admitted to an epoch: its record columns and update, and the pipeline's state
    directory, plan queue and last commit (the state directory is created on first use)."""

    columns: dict[str, Column]
    update: Update
    state: StateDir
    queue: PlanQueue
    committed: Commit


@dataclass(frozen=True)
class EpochHost:
    """All an epoch sees of its pipeline.

    ``admit(batch)`` checks a batch (:class:`Admission`); ``submit(plan)`` takes a plan posted
    from elsewhere; ``policy_inputs(lag_s)`` is what adaptive plans' policies see;
    ``stateful_workers()`` the workers that may hold state; ``spec(batch, update, layout)``
    the metadata of the epoch's tasks; ``outputs_frame(outputs)`` the outputs as a DataFrame.
    The epoch reports back through ``track_load(bins, records)`` (records applied per bin),
    ``committed(commit)`` (at its commit point) and ``recorded(record, trace)`` (its metrics
    record, as stored, and its trace, None when tracing is off).
    """

    spark: SparkSession
    local_dir: str
    keep_outputs: int
    map_sides: MapSides
    admit: Callable[[DataFrame], Admission]
    submit: Callable[[MigrationPlan], Any]
    policy_inputs: Callable[[float], PolicyInputs]
    stateful_workers: Callable[[], list[int]]
    spec: Callable[[DataFrame, Update, EpochLayout], EpochSpec]
    outputs_frame: Callable[[pa.Table], DataFrame]
    track_load: Callable[[np.ndarray, np.ndarray], None]
    committed: Callable[[Commit], None]
    recorded: Callable[[EpochMetrics, EpochTrace | None], None]


class EpochRun:
    """Runs epoch ``epoch`` of ``host``'s pipeline through :data:`DRIVER_PHASES` (call
    :meth:`run` once)."""

    def __init__(self, host: EpochHost, epoch: int, batch: DataFrame,
                 stream: dict[str, Any] | None, input_end: float | None, *,
                 want_frame: bool = True) -> None:
        self.host = host
        self.want_frame = want_frame
        #: The outputs as a DataFrame, after :meth:`run` (when ``want_frame``).
        self.frame: DataFrame | None = None
        self.batch = batch
        self.stream = stream
        self.input_end = input_end
        self.epoch = epoch
        self.phases: dict[str, float] = {}
        #: Each phase's wall-clock ``(start, end)``, for the trace.
        self.spans: dict[str, tuple[float, float]] = {}
        self.attempts = 0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time phase ``name`` into :attr:`phases` and pass its crash point at its end."""
        started, wall = time.perf_counter(), time.time()
        yield
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started
        self.spans[name] = (self.spans.get(name, (wall, 0.0))[0], time.time())
        if name != "commit":  # the commit's crash point is inside its write (before rename)
            crash_point(name, self.epoch, self.host.local_dir)

    def run(self) -> pa.Table:
        """Run the epoch end to end and return its outputs (also in :attr:`frame` as a
        DataFrame when ``want_frame``)."""
        host, epoch = self.host, self.epoch
        started = time.time()
        with self.phase("admit"):
            admitted = host.admit(self.batch)  # creates the state dir on first use
            state, queue = admitted.state, admitted.queue
            take_plans(state, host.submit)  # plans posted by `megaphone migrate` elsewhere
            lag = max(0.0, started - self.input_end) if self.input_end is not None else 0.0
            with queue.lock:
                # saved before the job, so a re-run routes alike
                if queue.steps_due(epoch, host.policy_inputs(lag)):
                    queue.table.save(state.routing_path)
        with self.phase("layout"):
            with queue.lock:
                layout = epoch_layout(queue.table, admitted.committed, epoch,
                                      host.stateful_workers())
            spec = host.spec(self.batch, admitted.update, layout)
        with self.phase("launch"):
            map_side = host.map_sides.get(layout.version, admitted.columns, spec,
                                          lambda: queue.table.owners(epoch))

            def job() -> DataFrame:
                return epoch_job(host.spark, self.batch, map_side, spec, layout.partitions)

            first = job()
        with self.phase("collect"):
            results = split_results(self._collect(first, job))
            outputs = results.outputs
            if self.want_frame:
                # Before the commit point: after it, no JVM call may fail (or be interrupted by
                # a stream's stop) and leave a committed epoch the caller was told had failed.
                self.frame = host.outputs_frame(outputs)
        finished = time.time()
        with self.phase("commit"):
            report = epoch_metrics(layout, started, finished, results,
                                   self.stream.get("batch_id") if self.stream else None)
            record = report.record
            marks = take_marks(record)  # for the trace, not stored with the metrics
            host.track_load(results.load_bins, results.load_counts)
            if self.input_end is not None and record.latency_s is None:
                record.latency_s = finished - self.input_end
            # The outputs are kept (for replay) before the commit point, written in parallel
            # with the commit record: their fsyncs overlap.
            kept = _WRITER.submit(state.write_outputs, epoch, outputs)
            try:
                with queue.lock:
                    queue.committed(epoch, report.bytes_by_bin)
                    stream = self.stream if self.stream is not None else admitted.committed.stream
                    commit = commit_record(layout, stream, queue.to_list(), record.per_worker,
                                           admitted.committed)
                    state.write_commit(commit, after=kept.result)  # the epoch's commit point
                    host.committed(commit)
            finally:
                concurrent.futures.wait([kept])
        with self.phase("cleanup"):
            state.prune_outputs(epoch - host.keep_outputs + 1)
        record.job_attempts = self.attempts
        record.phases_s = dict(self.phases)
        stored = record.to_dict()
        state.append_metrics(stored)  # a crash before this line loses the line, not the epoch
        trace = epoch_trace(epoch, self.spans, marks, layout.outgoing, layout.incoming) \
            if trace_enabled() else None
        if trace is not None:
            state.traces.append(trace)
        host.recorded(record, trace)
        return outputs

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

