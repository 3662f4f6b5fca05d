"""Group sizes (docs/groups.md): a batch with an epoch column runs its epochs, in order, in
groups of consecutive epochs, one Spark job per group
(:class:`~megaphone.migrator.epoch.run.EpochRun`); the size is fixed, or follows Drizzle's rule
when it is ``"auto"`` (:class:`GroupSizes`). Also the labelled outputs of such a batch.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from megaphone.migrator.epoch.config import AUTO
from megaphone.records import EpochMetrics

#: The share of a group's time its scheduling overhead may take, in ``"auto"`` mode.
OVERHEAD_TARGET = 0.10
#: The largest group: a group's records wait in its workers' memory until their epoch.
MAX_GROUP = 64
#: The first group's size in ``"auto"`` mode when nothing was measured yet.
AUTO_START = 4


def deadline_group_size(budget_s: float, floor_s: float, work_s: float,
                        most: int = MAX_GROUP) -> int:
    """The largest group size ``G`` whose job (``floor_s`` plus ``G * work_s``) still fits in
    ``budget_s`` (a deadline policy's latency target over its margin), in ``[1, most]``: while
    a deadline plan runs, a group's first epoch waits for the whole group's job."""
    if work_s <= 0:
        return most if budget_s > floor_s else 1
    return max(1, min(most, math.floor((budget_s - floor_s) / work_s + 1e-9)))


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


class GroupSizes:
    """The size of a pipeline's next group: ``group_size`` epochs, or with ``"auto"`` Drizzle's
    rule from the last group's measured job floor and work per epoch (:meth:`measured`)."""

    def __init__(self, group_size: int | str) -> None:
        self.group_size = group_size
        #: The last group's measured job floor and work per epoch (seconds).
        self.costs: tuple[float, float] | None = None

    def next(self) -> int:
        """The next group's size: the fixed one, or Drizzle's rule from the last group's
        measured floor and work (:data:`AUTO_START` before any)."""
        if self.group_size != AUTO:
            return int(self.group_size)
        if self.costs is None:
            return AUTO_START
        return drizzle_group_size(*self.costs)

    def adaptive(self, policy: Any) -> int:
        """Epochs a group may last while ``policy``'s adaptive plan runs and it moved nothing
        at the group's first epoch: a deadline policy's latency target bounds the group's job
        (:func:`deadline_group_size`, from the last group's measured floor and work); any
        other policy decides before every epoch (1)."""
        target = getattr(policy, "target_latency_s", None)
        if target is None or self.costs is None:
            return 1
        return deadline_group_size(target / getattr(policy, "margin", 1.0), *self.costs)

    def measured(self, records: list[EpochMetrics], phases: dict[str, float], size: int
                 ) -> None:
        """Keep the job floor and work per epoch a group of ``size`` epochs measured: the work
        is the busiest worker's useful time at each epoch plus the driver's per-epoch commit,
        the floor the rest of the group's time (the sum of its ``phases``)."""
        work = sum(max((m.useful_s or 0.0 for m in r.per_worker.values()), default=0.0)
                   for r in records) + phases.get("commit", 0.0)
        total = sum(phases.values())
        self.costs = (max(0.0, total - work), work / max(size, 1))


def labelled(table: pa.Table, column: str, label: int) -> pa.Table:
    """An epoch's outputs with its ``label`` in ``column``."""
    return table.append_column(column, pa.array([label] * table.num_rows, pa.int64()))


def concat(tables: list[pa.Table], schema: T.StructType) -> pa.Table:
    """Epochs' labelled outputs as one table (an empty one of ``schema`` if none)."""
    if tables:
        return pa.concat_tables(tables).combine_chunks()
    return pa.table({f.name: [] for f in schema.fields})
