"""One epoch's lifecycle on the driver, in named phases that are timed and can be crash-tested.

``admit`` (take plans handed over, ask adaptive policies, save the routing) → ``layout`` (who
owns, ships and installs what) → ``launch`` (build the epoch's Spark job) → ``collect`` (run it:
exports, shuffle, every worker's install, apply and commit; outputs and metrics come back in
the job's results as an Arrow table, which becomes a DataFrame when the caller wants one; the
job is run again if the store service died under it) → ``commit`` (the epoch's outputs kept
for replay, then the driver's commit record: the epoch's commit point) → ``cleanup`` (old
outputs). The workers' phases ``export``, ``install`` and ``apply`` run inside ``collect``.
Each phase's seconds go to the epoch's metrics (``phases_s``) and each phase is a
crash-injection point of the same name (:mod:`megaphone.migrator.faults`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame

from megaphone.migrator.faults import crash_point
from megaphone.migrator.inbox import take_plans
from megaphone.migrator.layout import EpochLayout, epoch_layout
from megaphone.migrator.spark_job import epoch_job, epoch_metrics, map_projection, split_results
from megaphone.migrator.statedir import Commit

if TYPE_CHECKING:
    from megaphone.migrator.pipeline import Pipeline

log = logging.getLogger("megaphone.epoch")

#: The driver's phases of an epoch, in order.
DRIVER_PHASES = ("admit", "layout", "launch", "collect", "commit", "cleanup")
#: The workers' phases, inside ``collect``.
WORKER_PHASES = ("export", "install", "apply")
#: Every phase name: crash points and timings use these.
PHASES = DRIVER_PHASES + WORKER_PHASES
#: Runs of an epoch's job before its error is raised, when the store service died under it.
JOB_ATTEMPTS = 3
#: What a failure of the store service looks like in a Spark error (the epoch is rerun).
_RETRYABLE = ("StoreUnavailable", "LeaseLost")
#: Writes an epoch's outputs file while the driver writes its commit record.
_WRITER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="megaphone-outputs")


class EpochRun:
    """Runs one epoch of ``pipe`` through :data:`DRIVER_PHASES` (call :meth:`run` once)."""

    def __init__(self, pipe: Pipeline, batch: DataFrame, stream: dict[str, Any] | None,
                 input_end: float | None, *, want_frame: bool = True) -> None:
        self.pipe = pipe
        self.want_frame = want_frame
        #: The outputs as a DataFrame, after :meth:`run` (when ``want_frame``).
        self.frame: DataFrame | None = None
        self.batch = batch
        self.stream = stream
        self.input_end = input_end
        self.epoch = pipe.epoch + 1
        self.phases: dict[str, float] = {}
        self.attempts = 0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time phase ``name`` into :attr:`phases` and pass its crash point at its end."""
        started = time.perf_counter()
        yield
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started
        if name != "commit":  # the commit's crash point is inside its write (before rename)
            crash_point(name, self.epoch, self.pipe.local_dir)

    def run(self) -> pa.Table:
        """Run the epoch end to end and return its outputs (also in :attr:`frame` as a
        DataFrame when ``want_frame``)."""
        pipe, epoch = self.pipe, self.epoch
        started = time.time()
        with self.phase("admit"):
            columns, update = pipe._prepare(self.batch)  # creates the state dir on first use
            state, queue = pipe.state_dir, pipe._queue
            assert queue is not None
            take_plans(state, pipe.migrate)  # plans posted by `megaphone migrate` elsewhere
            lag = max(0.0, started - self.input_end) if self.input_end is not None else 0.0
            with queue.lock:
                # saved before the job, so a re-run routes alike
                if queue.steps_due(epoch, pipe._policy_inputs(lag)):
                    pipe.routing.save(state.routing_path)
        with self.phase("layout"):
            with queue.lock:
                layout = epoch_layout(pipe.routing, pipe._commit, epoch, pipe._stateful_workers())
            spec = pipe._spec(self.batch, update, layout)
        with self.phase("launch"):
            shape = (layout.version, spec.shuffle_schema, tuple(columns))
            if pipe._projection is None or pipe._projection[0] != shape:
                pipe._projection = (shape, map_projection(columns, pipe.routing.owners(epoch),
                                                          spec))
            map_side = pipe._projection[1]

            def job() -> DataFrame:
                return epoch_job(pipe.spark, self.batch, map_side, spec, layout.partitions)

            first = job()
        with self.phase("collect"):
            outputs, rows = split_results(self._collect(first, job))
            if self.want_frame:
                # Before the commit point: after it, no JVM call may fail (or be interrupted by
                # a stream's stop) and leave a committed epoch the caller was told had failed.
                self.frame = pipe._outputs_frame(outputs)
        finished = time.time()
        with self.phase("commit"):
            record = epoch_metrics(layout, started, finished, rows,
                                   self.stream.get("batch_id") if self.stream else None)
            bytes_by_bin = record.pop("bytes_by_bin")
            pipe._track_load(*record.pop("records_by_bin"))
            if self.input_end is not None and record["latency_s"] is None:
                record["latency_s"] = finished - self.input_end
            # The outputs are kept (for replay) before the commit point, written in parallel
            # with the commit record: their fsyncs overlap.
            kept = _WRITER.submit(state.write_outputs, epoch, outputs)
            try:
                with queue.lock:
                    queue.committed(epoch, bytes_by_bin)
                    commit = self._commit_record(layout, queue.to_list(), record["per_worker"])
                    state.write_commit(commit, after=kept.result)  # the epoch's commit point
                    pipe._commit = commit
            finally:
                concurrent.futures.wait([kept])
        with self.phase("cleanup"):
            state.prune_outputs(epoch - pipe.keep_outputs + 1)
        record["job_attempts"] = self.attempts
        record["phases_s"] = dict(self.phases)
        state.append_metrics(record)  # a crash before this line loses the line, not the epoch
        pipe._metrics.append(record)
        return outputs

    def _collect(self, job: DataFrame, rebuild: Callable[[], DataFrame]) -> pa.Table:
        """Run the job; again if the store service died under it (the epoch is idempotent:
        workers that committed replay their outputs, the others apply). A rerun is a new
        DataFrame: adaptive execution keeps a failed stage's error in the old one's plan."""
        while True:
            self.attempts += 1
            if self.attempts > 1:
                job = rebuild()
            try:
                return job.toArrow()
            except Exception as exc:
                text = str(exc)
                if self.attempts >= JOB_ATTEMPTS or not any(m in text for m in _RETRYABLE):
                    raise
                log.warning("epoch %d: the store service failed (%s); running the epoch's job "
                            "again (attempt %d)", self.epoch, text.splitlines()[0][:200],
                            self.attempts + 1)

    def _commit_record(self, layout: EpochLayout, plans: list[dict[str, Any]],
                       per_worker: dict[str, dict[str, Any]]) -> Commit:
        stream = self.stream if self.stream is not None else self.pipe._commit.stream
        return Commit(epoch=self.epoch, state_version=layout.version,
                      pending_drops=[[m.bin, m.src] for m in layout.moves], stream=stream,
                      plans=plans, tokens={w: m["token"] for w, m in per_worker.items()
                                           if m.get("token")})
