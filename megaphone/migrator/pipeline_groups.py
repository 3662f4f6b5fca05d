"""Group scheduling for a :class:`~megaphone.migrator.pipeline.Pipeline` (docs/groups.md): a
batch with an epoch column runs its epochs, in order, in groups of consecutive epochs, one
Spark job per group (:class:`~megaphone.migrator.group.GroupRun`), and the group size follows
Drizzle's rule when it is ``"auto"``.
"""

from __future__ import annotations

import math
import threading
import uuid
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from megaphone.migrator import columns as C
from megaphone.migrator.commit import Commit
from megaphone.migrator.epoch_labels import check_epoch_column, scan_labels
from megaphone.migrator.group import GroupInput, GroupRun
from megaphone.migrator.schemas import PipelineSchema

#: The group size that follows Drizzle's rule (:func:`drizzle_group_size`).
AUTO = "auto"
#: The share of a group's time its scheduling overhead may take, in ``"auto"`` mode.
OVERHEAD_TARGET = 0.10
#: The largest group: a group's records wait in its workers' memory until their epoch.
MAX_GROUP = 64
#: The first group's size in ``"auto"`` mode when nothing was measured yet.
AUTO_START = 4


def check_group_size(group_size: Any) -> int | str:
    """``group_size`` if valid: a positive ``int`` or ``"auto"``; else a ``ValueError``."""
    if group_size == AUTO:
        return AUTO
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int or 'auto', got {group_size!r}")
    return group_size


def drizzle_group_size(floor_s: float, work_s: float, target: float = OVERHEAD_TARGET,
                       most: int = MAX_GROUP) -> int:
    """Drizzle's rule: the smallest group size ``G`` whose scheduling overhead (``floor_s`` per
    job) is at most ``target`` of the group's time (``floor_s + G * work_s``), in
    ``[1, most]``."""
    if floor_s <= 0:
        return 1
    if work_s <= 0:
        return most
    return max(1, min(most, math.ceil(floor_s * (1 - target) / (target * work_s) - 1e-9)))


class PipelineGroups:
    """The groups of a pipeline: a base of :class:`~megaphone.migrator.pipeline.Pipeline`,
    which holds the attributes declared here and provides ``epoch``, ``streaming``,
    ``_epoch_host`` and ``_update_for``."""

    spark: SparkSession
    key: str
    value: str | None
    event_time: str | None
    _schema: PipelineSchema
    _lock: threading.RLock
    _commit: Commit
    _uncommitted: bool
    _run_id: str
    _group_size: int | str
    #: The last group's measured job floor and work per epoch (seconds), for ``"auto"``.
    _group_costs: tuple[float, float] | None = None

    @property
    def label(self) -> int | None:
        """The label of the last committed epoch that ran from an epoch column (``None`` if
        none did): a later batch's labels must be larger."""
        return self._commit.label

    def _run_epochs(self, batch: DataFrame, column: str, input_end: float | None, *,
                    want_frame: bool) -> tuple[pa.Table, DataFrame | None]:
        """Run every epoch of ``batch`` (one per label of its epoch ``column``, in order) in
        groups; all their outputs, each row with its label in ``column``."""
        if self.streaming:
            raise RuntimeError("the pipeline is running a stream; process() is not allowed")
        check_epoch_column(batch.schema, column, {"key": self.key, "value": self.value,
                                                  "event time": self.event_time})
        key_type, value_type = self._schema.batch_types(batch.schema)
        update = self._update_for(value_type)
        out = self._schema.outputs(key_type, update)
        if column in out.names:
            raise ValueError(f"epoch column {column!r} would clash with the outputs' column "
                             f"of that name (outputs: {out.names})")
        with self._lock:
            times = self._schema.record_columns(key_type, update).get(C.EVENT_TIME)
            found = scan_labels(batch, column, times, self._commit.label)
        tables: list[pa.Table] = []
        done = 0
        while done < len(found.labels):
            # One group at a time under the lock: a plan submitted meanwhile (migrate() from
            # another thread) starts at the next group's first epoch.
            with self._lock:
                if self._commit.label is not None and found.labels[done] <= self._commit.label:
                    raise RuntimeError(f"label {found.labels[done]} was overtaken: another "
                                       f"call committed label {self._commit.label} meanwhile")
                source = GroupInput(batch, column, found.labels[done:],
                                    found.max_event_times[done:])
                run = GroupRun(self._epoch_host(), self.epoch + 1, source,
                               self._next_group_size(), input_end)
                try:
                    outputs = run.run()
                except BaseException:
                    if self._commit.epoch < run.last:  # some of the group is not committed
                        self._uncommitted = True
                        self._run_id = uuid.uuid4().hex  # its rerun must not replay outputs
                    raise
                self._measured(run)
            for label, table in zip(source.labels, outputs, strict=False):
                tables.append(table.append_column(
                    column, pa.array([label] * table.num_rows, pa.int64())))
            done += run.size
        schema = T.StructType([*out.fields, T.StructField(column, T.LongType())])
        table = pa.concat_tables(tables).combine_chunks() if tables else \
            pa.table({f.name: [] for f in schema.fields})
        frame = None
        if want_frame:
            frame = self.spark.createDataFrame(table if table.num_rows else [], schema=schema)
        return table, frame

    def _next_group_size(self) -> int:
        """The next group's size: the fixed one, or Drizzle's rule from the last group's
        measured floor and work (:data:`AUTO_START` before any)."""
        if self._group_size != AUTO:
            return int(self._group_size)
        if self._group_costs is None:
            return AUTO_START
        return drizzle_group_size(*self._group_costs)

    def _measured(self, run: GroupRun) -> None:
        """Keep the job floor and work per epoch ``run`` measured: the work is the busiest
        worker's useful time at each epoch plus the driver's per-epoch commit, the floor the
        rest of the group's time."""
        work = sum(max((m.useful_s or 0.0 for m in r.per_worker.values()), default=0.0)
                   for r in run.records) + run.phases.get("commit", 0.0)
        total = sum(run.phases.values())
        self._group_costs = (max(0.0, total - work), work / max(run.size, 1))
