"""The epoch driver of a pipeline (:class:`EpochDriver`): admits a batch, builds the metadata of
the epoch's tasks, runs a group of G >= 1 epochs (:class:`~megaphone.migrator.epoch.run.EpochRun`;
one epoch is a group of one), keeps the epochs' metrics and per-bin load, and sizes groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import types as T

from megaphone.migrator.epoch.config import PipelineConfig
from megaphone.migrator.epoch.groups import GroupSizes, concat, labelled
from megaphone.migrator.epoch.hot_keys import HotKeys
from megaphone.migrator.epoch.labels import EpochLabels, check_epoch_column, scan_labels
from megaphone.migrator.epoch.routing_operator import EpochLayout, epoch_spec
from megaphone.migrator.epoch.run import EpochRun, EpochSource
from megaphone.migrator.epoch.schemas import PipelineSchema, arrow_type
from megaphone.migrator.epoch.spark_job import MapSides
from megaphone.migrator.epoch.state_holder import POLICY_HISTORY, StateHolder
from megaphone.migrator.statedir.commit import Commit, StreamPosition
from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.task.columns import EVENT_TIME
from megaphone.migrator.task.spec import EpochSpec, shuffle_schema, with_labels
from megaphone.migrator.task.updates import Update
from megaphone.operators.process import watermark
from megaphone.plans.plan_queue import PlanQueue, PolicyInputs
from megaphone.records import EpochMetrics
from megaphone.snailtrail import EpochTrace
from megaphone.spark import task_slots

#: Weight of the newest epoch in the per-bin load (records per bin, exponentially smoothed).
LOAD_SMOOTHING = 0.3


@dataclass(frozen=True)
class Admission:
    """A batch admitted to an epoch: its record columns and update, and the pipeline's state
    directory, plan queue and last commit (the state directory is created on first use)."""

    columns: dict[str, Column]
    update: Update
    state: StateDir
    queue: PlanQueue
    committed: Commit


class EpochDriver:
    """Runs a pipeline's epochs on its state directory (``holder``): one at a time, in groups
    of one or more, each group one Spark job. ``schema`` is the pipeline's record and output
    types, ``config`` its configuration as given (the holder's is the one the state directory
    fixed)."""

    def __init__(self, spark: SparkSession, holder: StateHolder, schema: PipelineSchema,
                 config: PipelineConfig) -> None:
        self.spark = spark
        self.holder = holder
        self.schema = schema
        self.hot = HotKeys(schema, holder)
        self.groups = GroupSizes(config.group_size)
        self.map_sides = MapSides()  # the epoch job's map side, kept while it holds
        self.bin_load = np.zeros(config.num_bins)  # records per bin per epoch, smoothed
        self._task_slots: int | None = None

    @property
    def local_dir(self) -> str:
        """The host-local directory of the store service (and of crash points)."""
        return self.holder.local_dir

    @property
    def keep_outputs(self) -> int:
        """Committed epochs whose outputs are kept for replay."""
        return max(1, self.holder.config.keep_outputs)

    # -- a batch and its outputs ---------------------------------------------------------

    def update_for(self, value_type: T.DataType | None) -> Update:
        """The update, its value kind from ``value_type`` (a batch's) or from the manifest
        (which also keeps an operator's value type, from its first batch)."""
        state = self.holder.state
        manifest = state.manifest if state is not None else {}
        if value_type is None and manifest.get("value_type"):
            value_type = T._parse_datatype_json_string(manifest["value_type"])
        return self.schema.update(manifest.get("value_kind"), value_type)

    def admit(self, batch: DataFrame) -> Admission:
        """Check ``batch`` against the pipeline: its record columns (``key``, and ``value`` and
        ``_t`` where used) and update; creates the state dir on first use."""
        holder = self.holder
        key_type, value_type = self.schema.batch_types(batch.schema)
        update = self.update_for(value_type)
        if holder.state is None:
            if holder.key_type not in (None, key_type):
                raise TypeError(f"key column {self.schema.key!r} is {key_type}, expected "
                                f"{holder.key_type}")
            holder.create(key_type)
        elif key_type != holder.key_type:
            raise TypeError(f"key column {self.schema.key!r} holds {key_type} keys but the "
                            f"pipeline's keys are {holder.key_type}")
        state = holder.state_dir
        if value_type is not None and update.is_builtin and \
                state.manifest.get("value_kind") is None:
            state.set_manifest("value_kind", update.value_kind)  # fixed from now on
        if update.is_process and value_type is not None:
            stored = state.manifest.get("value_type")
            if stored is None:
                state.set_manifest("value_type", value_type.json())
            elif T._parse_datatype_json_string(stored) != value_type:
                theirs = T._parse_datatype_json_string(stored).simpleString()
                raise TypeError(f"value column {self.schema.value!r} is "
                                f"{value_type.simpleString()} but the pipeline's are {theirs}")
        return Admission(self.schema.record_columns(key_type, update), update, state,
                         holder.plans, holder.commit)

    def output_spark_schema(self) -> T.StructType:
        """The outputs' Spark schema (:meth:`PipelineSchema.outputs`)."""
        return self.schema.outputs(self.holder.key_type, self.update_for(None))

    def outputs_frame(self, outputs: pa.Table) -> DataFrame:
        """An epoch's outputs (collected from its job) as a DataFrame. No rows: from an empty
        list (PySpark cannot convert an empty Arrow table with timestamps inside structs)."""
        schema = self.output_spark_schema()
        return self.spark.createDataFrame(outputs if outputs.num_rows else [], schema=schema)

    def read_outputs(self, epoch: int) -> DataFrame:
        """The kept outputs of a committed ``epoch`` as a DataFrame."""
        return self.outputs_frame(self.holder.state_dir.read_outputs(epoch))

    # -- the metadata of an epoch's tasks ------------------------------------------------

    def spec(self, source: EpochSource, admitted: Admission, layout: EpochLayout,
             labels: tuple[int, ...]) -> EpochSpec:
        """The metadata every task of the group gets (built by
        :func:`~megaphone.migrator.epoch.routing_operator.epoch_spec`): for a group by labels
        its labels, its shuffle's label column and, for an event-time operator, each epoch's
        watermark (from the largest event time committed and those of the group's earlier
        epochs: exactly what one job per epoch would use)."""
        holder, update, committed = self.holder, admitted.update, admitted.committed
        config = holder.config
        assert holder.key_type is not None  # the batch was admitted
        key_arrow, value_arrow = self.schema.arrow_types(holder.key_type, update,
                                                         source.batch.schema)
        out = self.output_spark_schema()
        shuffle = shuffle_schema(key_arrow, value_arrow, config.event_time is not None)
        fields: dict[str, Any] = {}
        if update.is_process:
            owners = holder.routing.owners(layout.epoch)
            marks, high = [], committed.max_event_time
            for top in source.max_event_times[:len(labels)]:
                marks.append(watermark(high, update.fn.lateness_us))
                if top is not None and (high is None or top > high):
                    high = top
            fields = {"watermark": watermark(committed.max_event_time, update.fn.lateness_us),
                      "owned": {int(w): tuple(np.flatnonzero(owners == w).tolist())
                                for w in np.unique(owners)},
                      "watermarks": tuple(marks)}
        if source.column is not None:
            fields.update(labels=tuple(labels), shuffle_schema=with_labels(shuffle))
        return epoch_spec(
            holder.state_dir, layout, committed, holder.routing,
            update=update,
            output_schema=pa.schema([(f.name, arrow_type(f.dataType)) for f in out]),
            chunk_bytes=config.chunk_bytes,
            transfer=config.transfer,
            has_event_time=config.event_time is not None,
            shuffle_schema=fields.pop("shuffle_schema", shuffle),
            local_dir=holder.local_dir,
            run_id=holder.run_id,
            checkpoint=config.checkpoint,
            snapshot_every=config.snapshot_every,
            **fields,
            **self.hot.spec_fields(update, layout, self._task_slots or 1),
        )

    def policy_inputs(self, lag_s: float) -> PolicyInputs:
        """What adaptive plans' policies see before the next epoch (metadata only)."""
        def sizes() -> dict[int, int]:
            return dict(enumerate(self.holder.bin_sizes().bytes.tolist()))

        def load() -> dict[int, float]:
            hot = np.flatnonzero(self.bin_load)
            return dict(zip(hot.tolist(), self.bin_load[hot].tolist(), strict=True))

        if self._task_slots is None:  # asked once
            self._task_slots = task_slots(self.spark)
        metrics, traces = self.holder.metrics, self.holder.traces
        return PolicyInputs(
            history=lambda: list(metrics)[-POLICY_HISTORY:], bin_bytes=sizes,
            bin_records=load, lag_s=lag_s, parallelism=self._task_slots,
            traces=lambda: tuple(traces))

    # -- what an epoch reports -----------------------------------------------------------

    def track_load(self, bins: np.ndarray, records: np.ndarray) -> None:
        """Fold an epoch's records per bin into the smoothed per-bin load."""
        counts = np.bincount(bins, weights=records, minlength=len(self.bin_load))
        self.bin_load *= 1.0 - LOAD_SMOOTHING
        self.bin_load += LOAD_SMOOTHING * counts

    def recorded(self, record: EpochMetrics, trace: EpochTrace | None) -> None:
        """Keep an epoch's metrics record and, if it was traced, its trace (for policies)."""
        self.holder.metrics.append(record)
        if trace is not None:
            self.holder.traces.append(trace)

    # -- running epochs ------------------------------------------------------------------

    def run_one(self, batch: DataFrame, stream: StreamPosition | None,
                input_end: float | None = None, *, want_frame: bool
                ) -> tuple[pa.Table, DataFrame | None]:
        """Run ``batch`` as one epoch (a group of one): its outputs, and as a DataFrame too
        when ``want_frame`` (built before the commit point: after it, no JVM call may fail and
        leave a committed epoch the caller was told had failed). ``stream``: the micro-batch's
        stream position, for a stream's batch."""
        frames: list[DataFrame] = []

        def frame(outputs: pa.Table) -> None:
            if want_frame:
                frames.append(self.outputs_frame(outputs))

        with self.holder.lock:
            run = self._run(EpochSource(batch, stream=stream), 1, input_end, frame)
        return run.outputs[0], (frames[0] if frames else None)

    def run_labelled(self, batch: DataFrame, column: str, input_end: float | None, *,
                     want_frame: bool) -> tuple[pa.Table, DataFrame | None]:
        """Run every epoch of ``batch`` (one per label of its epoch ``column``, in order) in
        groups; all their outputs, each row with its label in ``column``."""
        schema = self.labelled_schema(batch.schema, column)
        with self.holder.lock:
            found = scan_labels(batch, column, self.event_times(batch), self.holder.commit.label)
        table = concat(self.run_groups(batch, column, found, input_end), schema)
        frame = None
        if want_frame:
            frame = self.spark.createDataFrame(table if table.num_rows else [], schema=schema)
        return table, frame

    def run_groups(self, batch: DataFrame, column: str, found: EpochLabels,
                   input_end: float | None, stream: StreamPosition | None = None
                   ) -> list[pa.Table]:
        """Run the epochs of ``found``'s labels in groups; each epoch's outputs with its label
        in ``column``. ``stream``: the micro-batch's stream position so far (a stream's batch)."""
        holder = self.holder
        tables: list[pa.Table] = []
        done = 0
        started = stream.epoch_list() if stream is not None else []
        keep_from = started[0] if started else holder.epoch + 1
        while done < len(found.labels):
            # One group at a time under the lock: a plan submitted meanwhile (migrate() from
            # another thread) starts at the next group's first epoch.
            with holder.lock:
                label = holder.commit.label
                if label is not None and found.labels[done] <= label:
                    raise RuntimeError(f"label {found.labels[done]} was overtaken: another "
                                       f"call committed label {label} meanwhile")
                if stream is not None and done:  # the position the batch's commits left
                    stream = holder.commit.stream
                source = EpochSource(batch, column, found.labels[done:],
                                     found.max_event_times[done:], stream,
                                     None if stream is None else keep_from)
                run = self._run(source, self.groups.next(), input_end)
                self.groups.measured(run.records, run.phases, run.size)
            tables.extend(labelled(table, column, label)
                          for label, table in zip(source.labels, run.outputs, strict=False))
            done += run.size
        return tables

    def _run(self, source: EpochSource, limit: int, input_end: float | None,
             before_commit: Any = None) -> EpochRun:
        """Run the next group of ``source`` (under the holder's lock); a failure before its
        last commit point leaves the holder to roll its workers back."""
        run = EpochRun(self, self.holder.epoch + 1, source, limit, input_end,
                       self.groups.adaptive)
        try:
            run.outputs = run.run(before_commit)
        except BaseException:
            self.holder.failed(run.last)
            raise
        return run

    def labelled_schema(self, schema: T.StructType, column: str) -> T.StructType:
        """The outputs' schema of a batch of ``schema`` run by its epoch ``column`` (the
        outputs' columns and the label); a ``ValueError`` or ``TypeError`` for a bad column."""
        check_epoch_column(schema, column, {"key": self.schema.key, "value": self.schema.value,
                                            "event time": self.schema.event_time})
        key_type, value_type = self.schema.batch_types(schema)
        out = self.schema.outputs(key_type, self.update_for(value_type))
        if column in out.names:
            raise ValueError(f"epoch column {column!r} would clash with the outputs' column "
                             f"of that name (outputs: {out.names})")
        return T.StructType([*out.fields, T.StructField(column, T.LongType())])

    def event_times(self, batch: DataFrame) -> Column | None:
        """The records' event time column of ``batch`` (microseconds), if the update has one."""
        key_type, value_type = self.schema.batch_types(batch.schema)
        update = self.update_for(value_type)
        return self.schema.record_columns(key_type, update).get(EVENT_TIME)
