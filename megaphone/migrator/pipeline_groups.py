"""Group scheduling for a :class:`~megaphone.migrator.pipeline.Pipeline` (docs/groups.md): a
batch with an epoch column runs its epochs, in order, in groups of consecutive epochs, one
Spark job per group (:class:`~megaphone.migrator.group.GroupRun`), and the group size follows
Drizzle's rule when it is ``"auto"``.
"""

from __future__ import annotations

import functools
import math
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import types as T

from megaphone.migrator import columns as C
from megaphone.migrator.commit import Commit, stream_epochs
from megaphone.migrator.connect_stream import ServeBatch
from megaphone.migrator.epoch_labels import EpochLabels, check_epoch_column, scan_labels
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


class PipelineGroups:
    """The groups of a pipeline: a base of :class:`~megaphone.migrator.pipeline.Pipeline`,
    which holds the attributes declared here and provides ``epoch``, ``streaming``,
    ``_epoch_host``, ``_update_for``, ``state_dir``, ``_run_batch`` and ``_step_aside``."""

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
    _run_batch: ServeBatch
    _step_aside: Callable[[str | None], dict[str, Any]]
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
        schema = self._epochs_schema(batch.schema, column)
        with self._lock:
            found = scan_labels(batch, column, self._event_times(batch), self._commit.label)
        table = _concat(self._run_groups(batch, column, found, input_end), schema)
        frame = None
        if want_frame:
            frame = self.spark.createDataFrame(table if table.num_rows else [], schema=schema)
        return table, frame

    def _epochs_schema(self, schema: T.StructType, column: str) -> T.StructType:
        """The outputs' schema of a batch of ``schema`` run by its epoch ``column`` (the
        outputs' columns and the label); a ``ValueError`` or ``TypeError`` for a bad column."""
        check_epoch_column(schema, column, {"key": self.key, "value": self.value,
                                            "event time": self.event_time})
        key_type, value_type = self._schema.batch_types(schema)
        out = self._schema.outputs(key_type, self._update_for(value_type))
        if column in out.names:
            raise ValueError(f"epoch column {column!r} would clash with the outputs' column "
                             f"of that name (outputs: {out.names})")
        return T.StructType([*out.fields, T.StructField(column, T.LongType())])

    def _event_times(self, batch: DataFrame) -> Column | None:
        """The records' event time column of ``batch`` (microseconds), if the update has one."""
        key_type, value_type = self._schema.batch_types(batch.schema)
        update = self._update_for(value_type)
        return self._schema.record_columns(key_type, update).get(C.EVENT_TIME)

    def _run_groups(self, batch: DataFrame, column: str, found: EpochLabels,
                    input_end: float | None, stream: dict[str, Any] | None = None
                    ) -> list[pa.Table]:
        """Run the epochs of ``found``'s labels in groups; each epoch's outputs with its label
        in ``column``. ``stream``: the micro-batch's stream record so far (a stream's batch)."""
        tables: list[pa.Table] = []
        done = 0
        started = stream_epochs(stream or {})  # a replayed batch's epochs committed before
        keep_from = started[0] if started else self.epoch + 1
        while done < len(found.labels):
            # One group at a time under the lock: a plan submitted meanwhile (migrate() from
            # another thread) starts at the next group's first epoch.
            with self._lock:
                if self._commit.label is not None and found.labels[done] <= self._commit.label:
                    raise RuntimeError(f"label {found.labels[done]} was overtaken: another "
                                       f"call committed label {self._commit.label} meanwhile")
                if stream is not None:  # the record the batch's commits so far left
                    stream = self._commit.stream if done else stream
                source = GroupInput(batch, column, found.labels[done:],
                                    found.max_event_times[done:], stream,
                                    None if stream is None else keep_from)
                run = GroupRun(self._epoch_host(), self.epoch + 1, source,
                               self._next_group_size(), input_end, self._adaptive_group_size)
                try:
                    outputs = run.run()
                except BaseException:
                    if self._commit.epoch < run.last:  # some of the group is not committed
                        self._uncommitted = True
                        self._run_id = uuid.uuid4().hex  # its rerun must not replay outputs
                    raise
                self._measured(run)
            tables.extend(_labelled(table, column, label)
                          for label, table in zip(source.labels, outputs, strict=False))
            done += run.size
        return tables

    def _run_stream_epochs(self, batch: DataFrame, batch_id: int, location: str, column: str
                           ) -> tuple[DataFrame, int]:
        """A stream's micro-batch (``batch_id`` of the query at ``location``) as the epochs of
        its epoch ``column``'s labels, in groups: all their outputs (each row with its label)
        and the batch's last epoch. A replayed batch applies only its labels not committed yet;
        those committed are read from the kept outputs (docs/groups.md)."""
        schema = self._epochs_schema(batch.schema, column)
        with self._lock:
            stream = self._commit.stream
            last_id = stream.get("batch_id", -1) if stream.get("checkpoint") == location else -1
            again = batch_id <= last_id
            if again and (batch_id < last_id or "epochs" not in stream):
                raise RuntimeError(
                    f"micro-batch {batch_id} of the stream at {location} is replayed, but the "
                    f"pipeline committed micro-batch {last_id}"
                    + ("" if batch_id < last_id else " without epoch_column")
                    + ": its epochs' outputs cannot be told apart; restart the query as it ran")
            found = scan_labels(batch, column, self._event_times(batch),
                                None if again else self._commit.label)
            done = stream_epochs(stream) if again else []
            if done and (len(done) > len(found.labels)
                         or found.labels[len(done) - 1] != self._commit.label):
                raise RuntimeError(
                    f"micro-batch {batch_id} is replayed with other labels than it ran with "
                    f"(its {len(done)} committed epochs end at label {self._commit.label}; the "
                    f"replay holds {list(found.labels[:len(done)])[-3:]} there): the stream's "
                    "source must replay a micro-batch alike")
            tables = [_labelled(self.state_dir.read_outputs(e), column, label)
                      for e, label in zip(done, found.labels, strict=False)]
            rest = EpochLabels(found.labels[len(done):], found.max_event_times[len(done):])
            record = stream if again else {"checkpoint": location, "batch_id": batch_id}
        tables += self._run_groups(batch, column, rest, None, record)
        table = _concat(tables, schema)
        last = self.epoch if rest.labels or not done else done[-1]
        return self.spark.createDataFrame(table if table.num_rows else [], schema=schema), last

    def _batch_functions(self, schema: T.StructType, column: str | None
                         ) -> tuple[ServeBatch, Callable[[str | None], dict[str, Any]]]:
        """A stream's batch function and its Spark Connect hand-off (``_run_batch`` and
        ``_step_aside``), running each micro-batch by its epoch ``column`` if given; a bad
        ``column`` for the stream's ``schema`` is refused now, before the query starts."""
        if column is None:
            return self._run_batch, self._step_aside
        self._epochs_schema(schema, column)

        def step_aside(location: str | None) -> dict[str, Any]:
            return {**self._step_aside(location), "epoch_column": column}

        return functools.partial(self._run_stream_epochs, column=column), step_aside

    def _next_group_size(self) -> int:
        """The next group's size: the fixed one, or Drizzle's rule from the last group's
        measured floor and work (:data:`AUTO_START` before any)."""
        if self._group_size != AUTO:
            return int(self._group_size)
        if self._group_costs is None:
            return AUTO_START
        return drizzle_group_size(*self._group_costs)

    def _adaptive_group_size(self, policy: Any) -> int:
        """Epochs a group may last while ``policy``'s adaptive plan runs and it moved nothing
        at the group's first epoch: a deadline policy's latency target bounds the group's job
        (:func:`deadline_group_size`, from the last group's measured floor and work); any
        other policy decides before every epoch (1)."""
        target = getattr(policy, "target_latency_s", None)
        if target is None or self._group_costs is None:
            return 1
        return deadline_group_size(target / getattr(policy, "margin", 1.0), *self._group_costs)

    def _measured(self, run: GroupRun) -> None:
        """Keep the job floor and work per epoch ``run`` measured: the work is the busiest
        worker's useful time at each epoch plus the driver's per-epoch commit, the floor the
        rest of the group's time."""
        work = sum(max((m.useful_s or 0.0 for m in r.per_worker.values()), default=0.0)
                   for r in run.records) + run.phases.get("commit", 0.0)
        total = sum(run.phases.values())
        self._group_costs = (max(0.0, total - work), work / max(run.size, 1))


def _labelled(table: pa.Table, column: str, label: int) -> pa.Table:
    """An epoch's outputs with its ``label`` in ``column``."""
    return table.append_column(column, pa.array([label] * table.num_rows, pa.int64()))


def _concat(tables: list[pa.Table], schema: T.StructType) -> pa.Table:
    """Epochs' labelled outputs as one table (an empty one of ``schema`` if none)."""
    if tables:
        return pa.concat_tables(tables).combine_chunks()
    return pa.table({f.name: [] for f in schema.fields})
