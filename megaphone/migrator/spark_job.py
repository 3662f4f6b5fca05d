"""The Spark side of an epoch: one job that routes records, ships moving state and applies.

Map stage: records get their bin in the JVM (``xxhash64``) and their worker from the routing
version in force (:func:`owner_column`); the old owners of moving bins export them
(:func:`~megaphone.migrator.worker.export_worker`). One shuffle (``repartitionById``) brings
both to partition ``w`` = worker ``w``, where :func:`~megaphone.migrator.worker.apply_worker`
installs the state and then applies the records. Each worker returns its outputs and rows of
metrics (:func:`~megaphone.migrator.worker.result_schema`): results travel in the job, not
through a shared filesystem.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from megaphone.migrator.layout import EpochLayout
from megaphone.migrator.worker import (
    METRICS_COLUMN,
    EpochSpec,
    apply_worker,
    export_worker,
    result_schema,
    unpack_bin_counts,
)
from megaphone.routing.bins import bin_column


def owner_column(owners: np.ndarray, bin_: Column) -> Column:
    """The worker of bin ``bin_`` under one routing version, as a Spark expression.

    The owners are one string literal split into an ``array<int>``, which Spark's optimizer
    folds into a constant: a lookup per record, with no broadcast join (and no extra job) per
    epoch, and one expression however many bins there are.
    """
    text = ",".join(str(int(w)) for w in owners)
    table = F.split(F.lit(text), ",").cast("array<int>")
    return F.element_at(table, bin_ + 1)


@dataclass(frozen=True)
class MapSide:
    """The map side of an epoch's job under one routing version: the records' shuffle columns
    (``select``) and the worker column to partition them by (``worker``)."""

    select: list[Column]
    worker: Column


def map_projection(columns: dict[str, Column], owners: np.ndarray, spec: EpochSpec) -> MapSide:
    """The map side of an epoch (:class:`MapSide`).

    ``columns`` are the batch's record columns by name (``key`` and, where used, ``value``,
    ``_t``); ``owners`` the routing version's worker of every bin. Every call costs the driver
    a few hundred JVM calls, so the pipeline keeps the result for as long as the routing
    version holds. Records without a key are routed like any (``xxhash64`` of null is its
    seed); their worker counts and skips them (``null_keys``), which costs no filter here.
    """
    shuffle = spec.shuffle_schema
    assert shuffle is not None
    key = columns["key"]
    bin_ = bin_column(key, spec.num_bins, spec.key_type)
    exprs = []
    for f in shuffle:
        if f.name == "_bin":
            exprs.append(bin_.alias("_bin"))
        elif f.name == "_w":
            exprs.append(owner_column(owners, bin_).alias("_w"))
        elif f.name in columns:
            exprs.append(columns[f.name].alias(f.name))
        else:
            exprs.append(F.lit(None).cast(from_arrow_type(f.type)).alias(f.name))
    return MapSide(select=exprs, worker=F.col("_w"))


class MapSides:
    """The map side of the last epoch's job, kept while its routing version, shuffle schema and
    record columns hold: building one costs the driver a few hundred JVM calls."""

    def __init__(self) -> None:
        self._last: tuple[tuple, MapSide] | None = None

    def get(self, version: int, columns: dict[str, Column], spec: EpochSpec,
            owners: Callable[[], np.ndarray]) -> MapSide:
        """The map side for routing ``version`` (whose ``owners()`` are asked on a miss)."""
        shape = (version, spec.shuffle_schema, tuple(columns))
        if self._last is None or self._last[0] != shape:
            self._last = (shape, map_projection(columns, owners(), spec))
        return self._last[1]


def epoch_job(spark: SparkSession, batch: DataFrame, map_side: MapSide, spec: EpochSpec,
              partitions: int) -> DataFrame:
    """The epoch's job; collecting it runs the epoch and yields its outputs and metrics rows
    (:func:`split_results`).

    The map side is one projection (:func:`map_projection`), since each DataFrame operation
    costs the driver an analysis.
    """
    shuffle = spec.shuffle_schema
    assert shuffle is not None
    routed = batch.select(*map_side.select)
    senders = sorted(spec.outgoing)
    if senders:
        spark_shuffle = T.StructType([T.StructField(f.name, from_arrow_type(f.type))
                                      for f in shuffle])
        exports = spark.range(0, len(senders), 1, len(senders)).mapInArrow(
            functools.partial(_export_task, spec, senders), spark_shuffle)
        routed = routed.unionByName(exports)
    results = from_arrow_schema(result_schema(spec.output_schema))
    return routed.repartitionById(partitions, map_side.worker).mapInArrow(
        functools.partial(_apply_task, spec), results)


# The tasks' functions are module-level and bound with ``functools.partial``: Spark pickles
# them by reference plus the spec, cheaper on the driver than a closure pickled by value.

def _export_task(spec: EpochSpec, senders: list[int], batches: Iterator[pa.RecordBatch]
                 ) -> Iterator[pa.RecordBatch]:
    """An export task: ships the moving bins of the senders whose indexes it is given."""
    for batch in batches:
        for i in batch.column("id").to_pylist():
            yield from export_worker(spec, senders[i], spec.shuffle_schema)


def _apply_task(spec: EpochSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A worker's task: partition ``w`` of the shuffle is worker ``w``."""
    worker = TaskContext.get().partitionId()
    yield from apply_worker(spec, worker, _checked(batches, worker))


def split_results(table: pa.Table) -> tuple[pa.Table, list[str]]:
    """The epoch's outputs and its JSON metrics rows, from the collected job results."""
    is_metrics = pc.is_valid(table.column(METRICS_COLUMN))
    metrics = table.filter(is_metrics).column(METRICS_COLUMN).to_pylist()
    outputs = table.filter(pc.invert(is_metrics)).drop_columns([METRICS_COLUMN])
    return outputs.combine_chunks(), metrics


def _checked(batches: Iterator[pa.RecordBatch], worker: int) -> Iterator[pa.RecordBatch]:
    """Pass batches through, failing loudly if a row of another worker reached this partition."""
    for batch in batches:
        if batch.num_rows:
            lo, hi = pc.min_max(batch.column("_w")).values()
            if lo.as_py() != worker or hi.as_py() != worker:
                raise RuntimeError(
                    f"partition {worker} received rows of worker {lo}..{hi}: Spark merged "
                    "partitions; set spark.sql.adaptive.coalescePartitions.enabled=false"
                )
        yield batch


def epoch_metrics(layout: EpochLayout, started: float, finished: float,
                  rows: list[str], batch_id: int | None) -> dict[str, Any]:
    """One epoch's metrics record from the workers' and the exporters' JSON metrics rows.

    Its ``bytes_by_bin`` entry (bytes shipped per moved bin, for plan progress) and
    ``records_by_bin`` entry (``(bins, counts)`` arrays: records applied per bin) are for
    the driver; the caller removes them before the record is stored.
    """
    per_worker: dict[int, dict[str, Any]] = {}
    bytes_by_bin: dict[int, int] = {}
    load_bins, load_counts = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]
    for data in map(json.loads, rows):
        for b, n in data.pop("bytes_by_bin", {}).items():
            bytes_by_bin[int(b)] = n
        if data.get("records_by_bin"):
            bins, counts = unpack_bin_counts(data.pop("records_by_bin"))
            load_bins.append(bins)
            load_counts.append(counts)
        per_worker.setdefault(int(data.pop("worker")), {}).update(data)
    event_times = [m["max_event_time"] for m in per_worker.values()
                   if m.get("max_event_time") is not None]

    def total(name: str) -> int:
        return sum(m.get(name, 0) for m in per_worker.values())

    return {
        "epoch": layout.epoch,
        "batch_id": batch_id,
        "started": started,
        "finished": finished,
        "duration_s": finished - started,
        "latency_s": finished - max(event_times) / 1e6 if event_times else None,
        "records_in": total("records_in"),
        "records_out": total("records_out"),
        "null_keys": total("null_keys"),
        "routing_version": layout.version,
        "workers": len(layout.live),
        "bins_moved": len(layout.moves),
        "keys_moved": total("keys_in"),
        "bytes_moved": sum(bytes_by_bin.values()),
        "per_worker": {str(w): m for w, m in sorted(per_worker.items())},
        "bytes_by_bin": bytes_by_bin,
        "records_by_bin": (np.concatenate(load_bins), np.concatenate(load_counts)),
    }
