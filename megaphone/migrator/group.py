"""A group of consecutive epochs run as one Spark job (Drizzle's group scheduling; docs/groups.md).

The driver's phases are an epoch's (:class:`~megaphone.migrator.epoch.EpochRun`), once for the
whole group: ``admit`` (plans handed over, the steps due at the group's first epoch, which may
end the group early: :meth:`~megaphone.migrator.plan_queue.PlanQueue.group_end`) → ``layout``
(the first epoch's moves; later epochs move nothing) → ``launch`` (one job over the records
of every epoch, each carrying its label) → ``collect`` (every worker applies and commits the
epochs in order) → ``commit`` (per epoch, in order: its outputs kept, then its commit record;
a crash between two leaves the driver at the last one written, and recovery rolls workers
back to it) → ``cleanup``. Every epoch keeps its own metrics record, with its group.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from megaphone.migrator import columns as C
from megaphone.migrator.commit import Commit, stream_with_epoch
from megaphone.migrator.epoch import _WRITER, EpochHost, EpochRun
from megaphone.migrator.epoch_spec import EpochSpec, with_labels
from megaphone.migrator.inbox import take_plans
from megaphone.migrator.layout import EpochLayout, commit_record, epoch_layout
from megaphone.migrator.plan_queue import PlanQueue
from megaphone.migrator.spark_job import (
    EpochResults,
    epoch_job,
    epoch_metrics,
    split_group_results,
)
from megaphone.migrator.statedir import StateDir
from megaphone.migrator.trace import epoch_trace, take_marks, trace_enabled
from megaphone.migrator.updates import Update
from megaphone.operators.process import watermark
from megaphone.plans.policy import MigrationPolicy
from megaphone.records import EpochMetrics, WorkerMetrics


@dataclass(frozen=True)
class GroupInput:
    """The epochs still to run from one batch: its records (``batch``), the name of its epoch
    column (``column``), the labels left in order, and per label the largest event time of
    its records (``None`` where none, or without event time). For a stream's micro-batch,
    ``stream`` is its stream record so far (each epoch's commit adds the epoch to its
    ``epochs``: :func:`~megaphone.migrator.commit.stream_with_epoch`) and ``keep_from`` its
    first epoch: the batch's kept outputs are not pruned before it is done (a replay reads
    them)."""

    batch: DataFrame
    column: str
    labels: tuple[int, ...]
    max_event_times: tuple[int | None, ...]
    stream: dict[str, Any] | None = None
    keep_from: int | None = None


class GroupRun(EpochRun):
    """Runs the next group of at most ``limit`` epochs of ``source`` from epoch ``epoch``
    (call :meth:`run` once; :attr:`size` epochs ran, with the outputs :meth:`run` returns)."""

    def __init__(self, host: EpochHost, epoch: int, source: GroupInput, limit: int,
                 input_end: float | None,
                 adaptive: Callable[[MigrationPolicy], int] | None = None) -> None:
        super().__init__(host, epoch, source.batch, None, input_end, want_frame=False)
        self.source = source
        self.limit = max(1, min(limit, len(source.labels)))
        self.adaptive = adaptive  # epochs a group may last while an adaptive plan runs
        #: Epochs in the group (known after ``admit``).
        self.size = 0
        #: The group's job: launched (``launch``) and run (``collect``) seconds.
        self.job_s = 0.0
        #: The metrics records of the group's epochs, once committed.
        self.records: list[EpochMetrics] = []
        self._marks: dict[int, WorkerMetrics] = {}

    @property
    def last(self) -> int:
        """The group's last epoch."""
        return self.epoch + max(self.size, 1) - 1

    def run(self) -> list[pa.Table]:  # type: ignore[override]
        """Run the group end to end; each epoch's outputs, in order."""
        host, epoch = self.host, self.epoch
        started = time.time()
        with self.phase("admit"):
            admitted = host.admit(self.batch)
            state, queue = admitted.state, admitted.queue
            take_plans(state, host.submit)
            lag = max(0.0, started - self.input_end) if self.input_end is not None else 0.0
            with queue.lock:
                if queue.steps_due(epoch, host.policy_inputs(lag)):
                    queue.table.save(state.routing_path)
                self.size = queue.group_end(epoch, epoch + self.limit - 1,
                                            self.adaptive) - epoch + 1
        labels = self.source.labels[:self.size]
        with self.phase("layout"):
            with queue.lock:
                layout = epoch_layout(queue.table, admitted.committed, epoch,
                                      host.stateful_workers())
            spec = self._group_spec(host.spec(self.batch, admitted.update, layout),
                                    admitted.committed, labels, admitted.update)
        with self.phase("launch"):
            column = F.col(self.source.column)
            columns = {**admitted.columns, C.LABEL: column.cast("long")}
            map_side = host.map_sides.get(layout.version, columns, spec,
                                          lambda: queue.table.owners(epoch))
            rows = self.batch.where(column.between(labels[0], labels[-1]))

            def job() -> DataFrame:
                return epoch_job(host.spark, rows, map_side, spec, layout.partitions)

            first = job()
        with self.phase("collect"):
            results = split_group_results(self._collect(first, job),
                                          range(epoch, epoch + self.size))
        finished = time.time()
        self.job_s = self.phases["launch"] + self.phases["collect"]
        with self.phase("commit"):
            self._commit_all(state, queue, layout, results, labels, admitted.committed,
                             (started, finished))
        with self.phase("cleanup"):
            keep = self.last - host.keep_outputs + 1
            state.prune_outputs(keep if self.source.keep_from is None
                                else min(keep, self.source.keep_from))
        if trace_enabled():  # the group's phases with its first epoch's workers' marks, for
            # `megaphone explain`; not handed to policies, which read an epoch's times from it
            state.traces.append(epoch_trace(epoch, self.spans, self._marks, layout.outgoing,
                                            layout.incoming))
        share = {name: seconds / self.size for name, seconds in self.phases.items()}
        for record in self.records:
            record.job_attempts = self.attempts
            record.phases_s = share
            state.append_metrics(record.to_dict())
            host.recorded(record, None)
        return [r.outputs for r in results]

    def _group_spec(self, spec: EpochSpec, committed: Commit, labels: Sequence[int],
                    update: Update) -> EpochSpec:
        """The group's task spec: its labels, its shuffle's label column and, for an
        event-time operator, each epoch's watermark (from the largest event time committed
        and those of the group's earlier epochs: exactly what one job per epoch would use)."""
        watermarks: tuple[int | None, ...] = ()
        if update.is_process:
            marks, high = [], committed.max_event_time
            for i in range(len(labels)):
                marks.append(watermark(high, update.fn.lateness_us))
                top = self.source.max_event_times[i]
                if top is not None and (high is None or top > high):
                    high = top
            watermarks = tuple(marks)
        return dataclasses.replace(spec, labels=tuple(labels), watermarks=watermarks,
                                   shuffle_schema=with_labels(spec.shuffle_schema))

    def _commit_all(self, state: StateDir, queue: PlanQueue, layout: EpochLayout,
                    results: list[EpochResults], labels: Sequence[int], before: Commit,
                    span: tuple[float, float]) -> None:
        """Commit the group's epochs in order: each one's outputs kept, then its commit record.
        Bins that moved at the first epoch stay pending drops until the next group's first
        epoch (a retried group job may export them again)."""
        host, (started, finished) = self.host, span
        stream = self.source.stream
        for i, result in enumerate(results):
            epoch = self.epoch + i
            at = layout if i == 0 else dataclasses.replace(layout, epoch=epoch)
            report = epoch_metrics(at, started, finished, result, None)
            record = report.record
            marks = take_marks(record)  # for the trace (the first epoch's), not the metrics
            if i:
                record.bins_moved = 0  # the group's moves happened at its first epoch
            else:
                self._marks = marks
            record.group, record.group_size, record.label = self.epoch, self.size, labels[i]
            record.duration_s = (finished - started) / self.size
            if stream is not None:  # a stream's micro-batch: the epoch is one of its epochs
                stream = stream_with_epoch(stream, epoch)
                record.batch_id = stream.get("batch_id")
            host.track_load(result.load_bins, result.load_counts)
            if self.input_end is not None and record.latency_s is None:
                record.latency_s = finished - self.input_end
            kept = _WRITER.submit(state.write_outputs, epoch, result.outputs)
            try:
                with queue.lock:
                    queue.committed(epoch, report.bytes_by_bin)
                    commit = commit_record(at, before.stream if stream is None else stream,
                                           queue.to_list(),
                                           record.per_worker, before)
                    commit.label = labels[i]
                    state.write_commit(commit, after=kept.result)  # the epoch's commit point
                    host.committed(commit)
            finally:
                concurrent.futures.wait([kept])
            before = commit
            self.records.append(record)
