"""The Spark side of an epoch: one job that routes records, ships moving state and applies.

The map side gives records their bin and worker in the JVM and the old owners export moving
bins (:func:`~megaphone.migrator.task.state_operator.export_worker`; on one host the receivers
read them in their own tasks instead, ``EpochSpec.pull_exports``); one shuffle
(``repartitionById``) brings both to partition ``w`` = worker ``w``, whose task
(:func:`~megaphone.migrator.task.state_operator.apply_worker`) returns its outputs and reports
in the job's results, not through a shared filesystem.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from megaphone.migrator.epoch.routing_operator import EpochLayout
from megaphone.migrator.task.columns import (
    BIN,
    KEY,
    KIND,
    LOAD_BINS,
    LOAD_COUNTS,
    OUT_EPOCH,
    REPORT,
    RESULT_COLUMNS,
    WORKER,
    RowKind,
)
from megaphone.migrator.task.hot_split import fold_partials, pass_and_fold
from megaphone.migrator.task.spec import EpochSpec
from megaphone.migrator.task.state_operator import apply_worker, export_worker, result_schema
from megaphone.migrator.task.updates import UpdateError
from megaphone.plans.hot_keys import epoch_summary
from megaphone.records import EpochMetrics, WorkerMetrics, WorkerReport
from megaphone.routing.bins import bin_column, owner_column
from megaphone.spark import adaptive_off, byte_cap_unchecked, no_rows
from megaphone.state_backends.wire import batch_to_ipc, ipc_to_batches

log = logging.getLogger("megaphone.epoch")

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


def _fixed_projection(columns: dict[str, Column], spec: EpochSpec
                      ) -> tuple[list[Column | None], Column]:
    """The map side of an epoch but its routing: the records' shuffle columns (``None`` where
    the worker goes, :func:`_with_owners`) and their bin.

    ``columns`` are the batch's record columns by name (``key`` and, where used, ``value``,
    ``_t``: :mod:`~megaphone.migrator.task.columns`). A null key is a key of its own, as in
    ``groupBy``: ``xxhash64`` of null is its seed, so it lives in bin 0.
    """
    bin_ = bin_column(columns[KEY], spec.num_bins, spec.key_type)
    exprs: list[Column | None] = []
    for f in spec.shuffle_schema:
        if f.name == BIN:
            exprs.append(bin_.alias(BIN))
        elif f.name == WORKER:
            exprs.append(None)
        elif f.name in columns:
            exprs.append(columns[f.name].alias(f.name))
        else:  # every row of the map side is a record
            value = int(RowKind.RECORD) if f.name == KIND else None
            exprs.append(F.lit(value).cast(from_arrow_type(f.type)).alias(f.name))
    return exprs, bin_


def _with_owners(fixed: list[Column | None], bin_: Column, owners: np.ndarray) -> list[Column]:
    """The map side under one routing version (``owners``: the worker of every bin)."""
    worker = owner_column(owners, bin_).alias(WORKER)
    return [worker if e is None else e for e in fixed]


class MapSides:
    """The map side of the last epoch's job. Its columns but the worker are kept while the
    shuffle schema and record columns hold (building them costs the driver a few hundred JVM
    calls: 20-50 ms a moving epoch); the worker column is kept while the routing version holds.
    """

    def __init__(self) -> None:
        self._fixed: tuple[tuple, list[Column | None], Column] | None = None
        self._last: tuple[int, list[Column]] | None = None

    def get(self, version: int, columns: dict[str, Column], spec: EpochSpec,
            owners: Callable[[], np.ndarray]) -> list[Column]:
        """The map side for routing ``version`` (whose ``owners()`` are asked on a miss)."""
        shape = (spec.shuffle_schema, tuple(columns))
        if self._fixed is None or self._fixed[0] != shape:
            self._fixed = (shape, *_fixed_projection(columns, spec))
            self._last = None
        if self._last is None or self._last[0] != version:
            self._last = (version, _with_owners(self._fixed[1], self._fixed[2], owners()))
        return self._last[1]


def epoch_job(spark: SparkSession, batch: DataFrame, map_side: list[Column], spec: EpochSpec,
              partitions: int, passed_on: PassedOn | None = None) -> DataFrame:
    """The epoch's job; collecting it runs the epoch and yields its outputs and reports
    (:func:`split_results`). The map side is one projection: each DataFrame operation costs the
    driver an analysis.

    With ``passed_on`` (a stage of a chain run as one job: docs/operators.md, "A chain's epoch
    in one job"), the workers' outputs are the job's rows, for the next stage to read, and all
    their results go to the driver through ``passed_on`` instead.
    """
    routed = batch.select(*map_side)
    spark_shuffle = T.StructType([T.StructField(f.name, from_arrow_type(f.type))
                                  for f in spec.shuffle_schema])
    if spec.split_keys:  # in a group, per key and epoch label
        routed = split_hot(routed, spec, spark_shuffle)
    senders = [] if spec.pull_exports else sorted(spec.outgoing)
    if senders:
        exports = spark.range(0, len(senders), 1, len(senders)).mapInArrow(
            functools.partial(_export_task, spec, senders), spark_shuffle)
        routed = routed.unionByName(exports)
    routed = routed.unionByName(no_rows(spark, spark_shuffle))
    workers = routed.repartitionById(partitions, F.col(WORKER))
    if passed_on is not None:
        task = functools.partial(_pass_on_task, spec, passed_on.results, passed_on.token)
        return workers.mapInArrow(task, passed_on.outputs)
    results = from_arrow_schema(result_schema(spec.output_schema, spec.grouped))
    return workers.mapInArrow(functools.partial(_apply_task, spec), results)


def split_hot(routed: DataFrame, spec: EpochSpec, schema: T.StructType) -> DataFrame:
    """Dual mode (docs/hot-keys.md, "Dual mode on Spark"): the split keys' records folded into
    one partial row per key and lessee task, by the input's partitions in the same pass or by
    ``spec.lessees`` extra tasks. The null key is never split (``isin`` is null for it)."""
    if spec.lessees is None:  # each input partition folds its own: one pass, no extra stage
        return routed.mapInArrow(functools.partial(pass_and_fold, spec), schema)
    hot = F.col(KEY).isin(list(spec.split_keys))
    cold = routed.filter(~F.coalesce(hot, F.lit(False)))
    lessees = routed.filter(hot).repartition(spec.lessees)
    partials = lessees.mapInArrow(functools.partial(fold_partials, spec), schema)
    return cold.unionByName(partials)


# The tasks' functions are module-level and bound with ``functools.partial``: Spark pickles
# them by reference plus the spec, cheaper on the driver than a closure pickled by value.

def _export_task(spec: EpochSpec, senders: list[int], batches: Iterator[pa.RecordBatch]
                 ) -> Iterator[pa.RecordBatch]:
    """An export task: ships the moving bins of the senders whose indexes it is given."""
    for batch in batches:
        for i in batch.column("id").to_pylist():
            yield from export_worker(spec, senders[i])


def _apply_task(spec: EpochSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A worker's task: partition ``w`` of the shuffle is worker ``w``."""
    worker = TaskContext.get().partitionId()
    yield from apply_worker(spec, worker, _checked(batches, worker))


def _pass_on_task(spec: EpochSpec, results: Accumulator, token: str,
                  batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A worker's task in a stage that passes its outputs on (:class:`PassedOn`): yields its
    outputs, and adds all its results (outputs and reports), tagged ``token``, to ``results``
    for the driver."""
    names = [f.name for f in spec.output_schema]
    schema = result_schema(spec.output_schema, spec.grouped)
    kept: list[pa.RecordBatch] = []
    for batch in _apply_task(spec, batches):
        kept.append(batch)
        outputs = batch.filter(pc.is_null(batch.column(REPORT)))
        if outputs.num_rows:
            yield outputs.select(names)
    worker = TaskContext.get().partitionId()
    results.add([(token, worker, batch_to_ipc(pa.Table.from_batches(kept, schema=schema)))])


class _TaskResults(AccumulatorParam):
    """Tasks' results as ``(token, worker, Arrow IPC bytes)``, gathered into one list."""

    def zero(self, value: list) -> list:
        return []

    def addInPlace(self, value1: list, value2: list) -> list:
        value1.extend(value2)
        return value1


def task_results(spark: SparkSession) -> Accumulator:
    """A Spark accumulator for :class:`PassedOn` (one per pipeline, reused epoch after
    epoch: Spark keeps every accumulator it made for the session's life)."""
    return spark.sparkContext.accumulator([], _TaskResults())


class PassedOn:
    """How a stage of a chain run as one Spark job hands its results over: its workers'
    ``outputs`` (a Spark schema) are the rows of its job, which the next stage reads, and their
    whole results reach the driver in ``results``, an accumulator of :func:`task_results` (Spark
    merges a task's update once the task succeeded). A new one per run of the job: its token
    tells its tasks' results from those of an earlier run still finishing."""

    def __init__(self, results: Accumulator, outputs: T.StructType) -> None:
        self.results = results
        self.outputs = outputs
        self.token = uuid.uuid4().hex
        del results.value[:]  # what earlier runs left

    def table(self, spec: EpochSpec) -> pa.Table:
        """The stage's results as :func:`run_job` would collect them, one task per worker: a
        worker's task that Spark ran again (a lost shuffle file) replayed the same outputs, and
        its first report is kept."""
        seen: dict[int, bytes] = {}
        for token, worker, data in self.results.value:
            if token == self.token:
                seen.setdefault(worker, data)
        schema = result_schema(spec.output_schema, spec.grouped)
        batches = [b for data in seen.values() for b in ipc_to_batches(data)]
        return pa.Table.from_batches(batches, schema=schema)


def run_job(job: DataFrame, rebuild: Callable[[], DataFrame], epoch: int,
            row_bytes: int | None) -> tuple[pa.Table, int]:
    """Run an epoch's ``job`` (the first of ``epoch``'s group) without adaptive execution
    (:func:`~megaphone.spark.adaptive_off`) and, where its shuffle rows have at most
    ``row_bytes`` bytes (:func:`~megaphone.migrator.task.spec.row_bytes_bound`), without Spark's
    row-by-row check of the Arrow batches' bytes (:func:`~megaphone.spark.byte_cap_unchecked`):
    its results and how many runs it took; run again
    (``rebuild()``: a rerun is a new DataFrame, whose plan holds nothing of the failed run)
    if it failed for a :data:`RETRYABLE` reason (the epoch is idempotent: workers that
    committed replay their outputs, the others apply).
    A general update that failed on a key is raised as its :class:`UpdateError`, not as the
    Spark error that carried it (kept in its ``__context__``)."""
    attempts = 0
    while True:
        attempts += 1
        if attempts > 1:
            job = rebuild()
        try:
            spark = job.sparkSession
            with adaptive_off(spark), byte_cap_unchecked(spark, row_bytes):
                return job.toArrow(), attempts
        except Exception as exc:
            text = str(exc)
            failed = UpdateError.from_text(text)
            if failed is not None:
                raise failed from None
            if attempts >= JOB_ATTEMPTS or not retryable(text):
                raise
            log.warning("epoch %d: its job failed (%s); running it again (attempt %d)",
                        epoch, text.splitlines()[0][:200], attempts + 1)


@dataclass(frozen=True)
class EpochResults:
    """What an epoch's job brings back: its ``outputs``, every task's :class:`WorkerReport`,
    and the records the workers applied per bin (``load_bins``, ``load_counts``: bins may
    repeat, one entry per worker that had records of them)."""

    outputs: pa.Table
    reports: list[WorkerReport]
    load_bins: np.ndarray
    load_counts: np.ndarray


def split_results(table: pa.Table) -> EpochResults:
    """The epoch's outputs and reports, from the collected job results."""
    is_report = pc.is_valid(table.column(REPORT))
    rows = table.filter(is_report)
    reports = [WorkerReport.from_json(text) for text in rows.column(REPORT).to_pylist()]
    bins, counts = (pc.list_flatten(rows.column(name)).to_numpy()
                    for name in (LOAD_BINS, LOAD_COUNTS))
    outputs = table.filter(pc.invert(is_report)).drop_columns(
        [c for c in RESULT_COLUMNS if c in table.column_names])
    return EpochResults(outputs.combine_chunks(), reports, bins, counts)


def split_group_results(table: pa.Table, epochs: range) -> list[EpochResults]:
    """Each epoch's outputs and reports (:func:`split_results`), from a group job's results
    (their rows name their epoch)."""
    tags = table.column(OUT_EPOCH)
    return [split_results(table.filter(pc.equal(tags, pa.scalar(e, pa.int64()))))
            for e in epochs]


def _checked(batches: Iterator[pa.RecordBatch], worker: int) -> Iterator[pa.RecordBatch]:
    """Pass batches through, failing loudly if a row of another worker reached this partition."""
    for batch in batches:
        if batch.num_rows:
            lo, hi = pc.min_max(batch.column(WORKER)).values()
            if lo.as_py() != worker or hi.as_py() != worker:
                raise RuntimeError(
                    f"partition {worker} received rows of worker {lo}..{hi}: Spark merged "
                    "partitions; set spark.sql.adaptive.coalescePartitions.enabled=false"
                )
        yield batch


@dataclass(frozen=True)
class EpochReport:
    """One epoch's results as the driver commits them: its ``outputs``, its metrics
    ``record``, the bytes shipped per moved bin (``bytes_by_bin``, plan progress) and the
    records applied per bin (``load``, the driver's per-bin load)."""

    outputs: pa.Table
    record: EpochMetrics
    bytes_by_bin: dict[int, int]
    load: np.ndarray


def report_epochs(table: pa.Table, layout: EpochLayout, spec: EpochSpec, started: float,
                  batch_id: int | None) -> list[EpochReport]:
    """Report each epoch of the group ``spec`` (:func:`epoch_metrics`) from its job's results
    ``table``. The group's moves count at its first epoch, and its duration is shared
    evenly."""
    finished = time.time()
    labels = spec.labels
    size = max(1, len(labels))
    parts = split_group_results(table, range(layout.epoch, layout.epoch + size)) if labels \
        else [split_results(table)]
    reports = []
    for i, part in enumerate(parts):
        at = dataclasses.replace(layout, epoch=layout.epoch + i, moves=()) if i else layout
        record, bytes_by_bin = epoch_metrics(at, started, finished, part, batch_id)
        record.duration_s = (finished - started) / size
        if labels:
            record.group, record.group_size, record.label = layout.epoch, size, labels[i]
        load = np.bincount(part.load_bins, weights=part.load_counts, minlength=spec.num_bins)
        reports.append(EpochReport(part.outputs, record, bytes_by_bin, load))
    return reports


def epoch_metrics(layout: EpochLayout, started: float, finished: float,
                  results: EpochResults, batch_id: int | None
                  ) -> tuple[EpochMetrics, dict[int, int]]:
    """One epoch's metrics record from the workers' and the exporters' reports, and the bytes
    they shipped per moved bin."""
    per_worker: dict[int, WorkerMetrics] = {}
    bytes_by_bin: dict[int, int] = {}
    for report in results.reports:
        bytes_by_bin.update(report.bytes_by_bin)
        if report.worker in per_worker:
            per_worker[report.worker].merge(report.metrics)
        else:
            per_worker[report.worker] = report.metrics
    event_times = [m.max_event_time for m in per_worker.values()
                   if m.max_event_time is not None]
    record = EpochMetrics(
        epoch=layout.epoch,
        batch_id=batch_id,
        started=started,
        finished=finished,
        duration_s=finished - started,
        latency_s=finished - max(event_times) / 1e6 if event_times else None,
        routing_version=layout.version,
        workers=len(layout.live),
        bins_moved=len(layout.moves),
        bytes_moved=sum(bytes_by_bin.values()),
        per_worker=dict(sorted(per_worker.items())),
    )
    for name in ("records_in", "records_out", "null_keys", "late_records", "split_records"):
        setattr(record, name, int(record.total(name)))  # the workers' sum
    record.keys_moved = int(record.total("keys_in"))
    hot = epoch_summary(m.hot for m in per_worker.values())
    if hot is not None:
        record.hot_keys = [list(c) for c in hot.counters]
    return record, bytes_by_bin
