"""The epoch driver of a pipeline (:class:`EpochDriver`; docs/architecture.md, "A Pipeline and
its collaborators").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from functools import cached_property

import numpy as np
import pyarrow as pa
from pyspark.accumulators import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from megaphone.migrator.epoch.config import PipelineConfig
from megaphone.migrator.epoch.groups import GroupSizes, concat, labelled
from megaphone.migrator.epoch.hot_keys import HotKeys
from megaphone.migrator.epoch.labels import check_epoch_column, scan_labels
from megaphone.migrator.epoch.run import EpochRun, EpochSource
from megaphone.migrator.epoch.schemas import PipelineSchema
from megaphone.migrator.epoch.spark_job import MapSides
from megaphone.migrator.epoch.state_holder import StateHolder
from megaphone.migrator.statedir.commit import StreamPosition
from megaphone.migrator.task.columns import EVENT_TIME
from megaphone.migrator.task.updates import Update
from megaphone.spark import empty_frame, local_slots

log = logging.getLogger("megaphone.driver")


class EpochDriver:
    """Runs a pipeline's epochs on its state directory (``holder``): one at a time, in groups
    of one or more, each group one Spark job. ``schema`` is the pipeline's record and output
    types, ``config`` its configuration as given (the holder's is the one the state directory
    fixed). What an epoch run reads of it are attributes: the run does the work."""

    def __init__(self, spark: SparkSession, holder: StateHolder, schema: PipelineSchema,
                 config: PipelineConfig) -> None:
        self.spark = spark
        self.holder = holder
        self.schema = schema
        self.hot = HotKeys(schema, holder)
        self.groups = GroupSizes(config.group_size)
        self.map_sides = MapSides()  # the epoch job's map side, kept while it holds
        self.bin_load = np.zeros(config.num_bins)  # records per bin per epoch, smoothed
        #: Spark's task slots, asked once (the hot-key and adaptive policies' parallelism).
        self.task_slots: int | None = None
        #: Where a chain's stage run as one job hands its results over (made at first use).
        self.task_results: Accumulator | None = None
        #: The chain's combine of this stage's outputs (:class:`~megaphone.Chain`), if any.
        self.combine_outputs: Callable[[pa.Table], pa.Table] | None = None
        #: The last epoch this driver committed and the watermark it ran with (an event-time
        #: operator's, not in a group): whether the next one can fire a timer.
        self.last_watermark: tuple[int, int | None] | None = None
        self.slots_per_host = config.slots_per_host
        self._slots_unknown_said = False
        self._empty_frames: dict[str, DataFrame] = {}  # by the schema's JSON

    @cached_property
    def local_slots(self) -> int | None:
        """The task slots of a local master, asked once (:func:`~megaphone.spark.local_slots`)."""
        return local_slots(self.spark)

    def host_slots(self, hosts: Sequence[str]) -> dict[str, int]:
        """How many worker tasks each of ``hosts`` runs at once, as the commit record keeps it: the
        pipeline's ``slots_per_host``, else a local master's slots for its one host, else unknown
        (empty, logged once). Why a cluster's slots are not derived: docs/placement.md, "DS2 and
        the deadline policy see hosts"."""
        if self.slots_per_host is not None:
            return {h: self.slots_per_host for h in hosts}
        if len(hosts) == 1 and self.local_slots is not None:
            return {hosts[0]: self.local_slots}
        if hosts and not self._slots_unknown_said:
            self._slots_unknown_said = True
            log.info("task slots per host unknown for %d host(s): set slots_per_host to let "
                     "homes, DS2 and the deadline policy count them", len(hosts))
        return {}

    # -- outputs -------------------------------------------------------------------------

    def update_for(self, value_type: T.DataType | None) -> Update:
        """The update, its value kind from ``value_type`` (a batch's) or the manifest's."""
        return self.schema.update(self.holder.manifest, value_type)

    def frame(self, table: pa.Table, schema: T.StructType) -> DataFrame:
        """Outputs collected on the driver as a DataFrame of ``schema``. An empty one is made
        once per schema (:func:`~megaphone.spark.empty_frame`: PySpark cannot convert an empty
        Arrow table with timestamps inside structs) and handed out again: PySpark builds it
        through its row path, about 85 ms of the driver each time (bench/chain_epoch.py), and a
        chain's later stages are empty in most epochs."""
        if table.num_rows:
            return self.spark.createDataFrame(table, schema=schema)
        key = schema.json()
        if key not in self._empty_frames:
            self._empty_frames[key] = empty_frame(self.spark, schema)
        return self._empty_frames[key]

    def outputs_schema(self) -> T.StructType:
        """The Spark schema of the pipeline's outputs, as its key type and manifest fix it (a
        ``TypeError`` or ``ValueError`` while they do not, before the first epoch)."""
        return self.schema.outputs(self.holder.key_type, self.update_for(None))

    def outputs_frame(self, outputs: pa.Table) -> DataFrame:
        """An epoch's outputs (collected from its job) as a DataFrame (:meth:`frame`)."""
        return self.frame(outputs, self.outputs_schema())

    def read_outputs(self, epoch: int) -> DataFrame:
        """The kept outputs of a committed ``epoch`` as a DataFrame."""
        return self.outputs_frame(self.holder.state_dir.read_outputs(epoch))

    # -- running epochs ------------------------------------------------------------------

    def run(self, batch: DataFrame, column: str | None, input_end: float | None = None, *,
            want_frame: bool, stream: StreamPosition | None = None
            ) -> tuple[pa.Table, DataFrame | None]:
        """Run ``batch`` as one epoch or, with an epoch ``column``, one epoch per label in groups:
        the outputs (by labels, each row with its label), and as a DataFrame too when
        ``want_frame`` (one epoch's before its commit point: a JVM call failing after it would
        report a committed epoch as failed). ``stream``: a stream's micro-batch position; by
        labels, a replayed batch applies only its labels not committed yet and reads the
        others' kept outputs (docs/groups.md)."""
        if column is None:
            frames: list[DataFrame] = []
            keep = (lambda out: frames.append(self.outputs_frame(out))) if want_frame else None
            outputs = self.run_groups(EpochSource(batch, stream=stream), input_end, keep)
            return outputs[0], (frames[0] if frames else None)
        schema = self.labelled_schema(batch.schema, column)
        key_type, value_type = self.schema.batch_types(batch.schema)
        times = self.schema.record_columns(key_type, self.update_for(value_type)).get(EVENT_TIME)
        holder = self.holder
        with holder.lock:
            done = stream.epoch_list() if stream is not None else []
            label = holder.commit.label
            labels, highs = scan_labels(batch, column, times, None if done else label)
            if done and (len(done) > len(labels) or labels[len(done) - 1] != label):
                raise RuntimeError(
                    f"micro-batch {stream.batch_id} is replayed with other labels than it ran "
                    f"with (its {len(done)} committed epochs end at label {label}; the replay "
                    f"holds {list(labels[:len(done)])[-3:]} there): the stream's source "
                    "must replay a micro-batch alike")
            tables = [labelled(holder.state_dir.read_outputs(e), column, label)
                      for e, label in zip(done, labels, strict=False)]
        rest = EpochSource(batch, column, labels[len(done):], highs[len(done):], stream)
        table = concat(tables + self.run_groups(rest, input_end), schema)
        return table, self.frame(table, schema) if want_frame else None

    def run_groups(self, source: EpochSource, input_end: float | None,
                   before_commit: Callable[[pa.Table], None] | None = None) -> list[pa.Table]:
        """Run the epochs of ``source`` in groups, each epoch's outputs (by labels, with its
        label in the epoch column); ``before_commit``: as :meth:`EpochRun.run`'s."""
        holder, column, stream = self.holder, source.column, source.stream
        tables: list[pa.Table] = []
        done = 0
        while done < source.count:
            # One group at a time under the lock: a plan submitted meanwhile (migrate() from
            # another thread) starts at the next group's first epoch.
            with holder.lock:
                label = holder.commit.label
                if column is not None and label is not None and source.labels[done] <= label:
                    raise RuntimeError(f"label {source.labels[done]} was overtaken: another "
                                       f"call committed label {label} meanwhile")
                if stream is not None and done:  # the position the batch's commits left
                    stream = holder.commit.stream
                part = dataclasses.replace(source, labels=source.labels[done:],
                                           max_event_times=source.max_event_times[done:],
                                           stream=stream)
                run = EpochRun(self, part, self.groups.next(), input_end)
                outputs = run.run(before_commit)
                if column is not None:  # group sizes are measured on groups by labels only
                    self.groups.measured(run.records, run.phases, run.size)
            tables.extend(outputs if column is None else
                          (labelled(table, column, label)
                           for label, table in zip(part.labels, outputs, strict=False)))
            done += run.size
        return tables

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
