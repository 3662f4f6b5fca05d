"""The epoch side of a :class:`~megaphone.migrator.pipeline.Pipeline`: admitting a batch, the
metadata of the epoch's tasks, running the epoch (:class:`~megaphone.migrator.epoch.EpochRun`,
through the narrow :class:`~megaphone.migrator.epoch.EpochHost`) and rolling back a failed one.
"""

from __future__ import annotations

import collections
import threading
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from megaphone.migrator.commit import Commit
from megaphone.migrator.epoch import Admission, EpochHost, EpochRun
from megaphone.migrator.epoch_spec import EpochSpec, shuffle_schema
from megaphone.migrator.layout import EpochLayout, task_fields
from megaphone.migrator.pipeline_hot import HotKeys
from megaphone.migrator.plan_queue import PlanQueue, PolicyInputs
from megaphone.migrator.schemas import PipelineSchema, arrow_type
from megaphone.migrator.spark_job import MapSides
from megaphone.migrator.statedir import StateDir
from megaphone.migrator.updates import Update
from megaphone.operators.process import watermark
from megaphone.records import EpochMetrics
from megaphone.snailtrail import EpochTrace
from megaphone.spark import check_python_workers, task_slots

#: Weight of the newest epoch in the per-bin load (records per bin, exponentially smoothed).
LOAD_SMOOTHING = 0.3
#: Newest epochs' metrics (and traces) an adaptive plan's policy sees.
POLICY_HISTORY = 50


class PipelineEpochs(HotKeys):
    """The epochs of a pipeline: a base of :class:`~megaphone.migrator.pipeline.Pipeline`,
    which holds the attributes declared here and provides the rest an epoch needs (its state
    directory, routing and plans: ``state_dir``, ``fingerprint``, ``routing``, ``epoch``,
    ``streaming``, ``migrate``, ``bin_sizes``, ``_create``, ``_recover``,
    ``_stateful_workers``)."""

    spark: SparkSession
    key: str
    event_time: str | None
    chunk_bytes: int
    transfer: str
    keep_outputs: int
    local_dir: str
    _schema: PipelineSchema
    _settings: dict[str, Any]
    _num_bins: int
    _key_type: str | None
    _lock: threading.RLock
    _metrics: collections.deque[EpochMetrics]
    _traces: collections.deque[EpochTrace]
    _bin_load: np.ndarray
    _task_slots: int | None
    _map_sides: MapSides
    _state: StateDir | None
    _queue: PlanQueue | None
    _commit: Commit
    _uncommitted: bool
    _run_id: str
    _task_slots: int | None

    def _update_for(self, value_type: T.DataType | None) -> Update:
        """The update, its value kind from ``value_type`` (a batch's) or from the manifest
        (which also keeps an operator's value type, from its first batch)."""
        manifest = self._state.manifest if self._state is not None else {}
        if value_type is None and manifest.get("value_type"):
            value_type = T._parse_datatype_json_string(manifest["value_type"])
        return self._schema.update(manifest.get("value_kind"), value_type)

    def _run_batch(self, batch: DataFrame, batch_id: int, location: str) -> tuple[DataFrame, int]:
        """A stream's micro-batch as an epoch: its outputs and epoch; a batch id the stream at
        ``location`` committed before is not applied again, its stored outputs are read."""
        with self._lock:
            stream = self._commit.stream
            if stream.get("checkpoint") == location and batch_id <= stream.get("batch_id", -1):
                if "epochs" in stream:  # its outputs are several epochs', one per label
                    raise RuntimeError(f"micro-batch {batch_id} of the stream at {location} "
                                       "ran by its epoch column: restart it with the same "
                                       "start(..., epoch_column=)")
                last = stream.get("epoch", self._commit.epoch)  # offline epochs ran since
                epoch = last - (stream["batch_id"] - batch_id)
                return self._read_outputs(epoch), epoch
            _, frame = self._run_epoch(batch, {"checkpoint": location, "batch_id": batch_id},
                                       want_frame=True)
            assert frame is not None
            return frame, self._commit.epoch

    def _read_outputs(self, epoch: int) -> DataFrame:
        """The kept outputs of a committed ``epoch`` as a DataFrame."""
        return self._outputs_frame(self.state_dir.read_outputs(epoch))

    def _outputs_frame(self, outputs: pa.Table) -> DataFrame:
        """An epoch's outputs (collected from its job) as a DataFrame. No rows: from an empty
        list (PySpark cannot convert an empty Arrow table with timestamps inside structs)."""
        schema = self._output_spark_schema()
        return self.spark.createDataFrame(outputs if outputs.num_rows else [], schema=schema)

    def _output_spark_schema(self) -> T.StructType:
        """The outputs' Spark schema (:meth:`PipelineSchema.outputs`)."""
        return self._schema.outputs(self._key_type, self._update_for(None))

    def _admit(self, batch: DataFrame) -> Admission:
        """Check ``batch`` against the pipeline: its record columns (``key``, and ``value`` and
        ``_t`` where used) and update; creates the state dir on first use."""
        key_type, value_type = self._schema.batch_types(batch.schema)
        update = self._update_for(value_type)
        if self._state is None:
            if self._key_type not in (None, key_type):
                raise TypeError(f"key column {self.key!r} is {key_type}, expected {self._key_type}")
            self._create(key_type)
        elif key_type != self._key_type:
            raise TypeError(f"key column {self.key!r} holds {key_type} keys but the pipeline's "
                            f"keys are {self._key_type}")
        if value_type is not None and update.is_builtin and \
                self.state_dir.manifest.get("value_kind") is None:
            self.state_dir.set_manifest("value_kind", update.value_kind)  # fixed from now on
        if update.is_process and value_type is not None:
            stored = self.state_dir.manifest.get("value_type")
            if stored is None:
                self.state_dir.set_manifest("value_type", value_type.json())
            elif T._parse_datatype_json_string(stored) != value_type:
                theirs = T._parse_datatype_json_string(stored).simpleString()
                raise TypeError(f"value column {self._schema.value!r} is "
                                f"{value_type.simpleString()} but the pipeline's are {theirs}")
        assert self._queue is not None
        return Admission(self._schema.record_columns(key_type, update), update, self.state_dir,
                         self._queue, self._commit)

    def _policy_inputs(self, lag_s: float) -> PolicyInputs:
        """What adaptive plans' policies see before the next epoch (metadata only)."""
        def sizes() -> dict[int, int]:
            return dict(enumerate(self.bin_sizes().bytes.tolist()))

        def load() -> dict[int, float]:
            hot = np.flatnonzero(self._bin_load)
            return dict(zip(hot.tolist(), self._bin_load[hot].tolist(), strict=True))

        if self._task_slots is None:  # asked once
            self._task_slots = task_slots(self.spark)
        return PolicyInputs(
            history=lambda: list(self._metrics)[-POLICY_HISTORY:], bin_bytes=sizes,
            bin_records=load, lag_s=lag_s, parallelism=self._task_slots,
            traces=lambda: tuple(self._traces))

    def _track_load(self, bins: np.ndarray, records: np.ndarray) -> None:
        """Fold an epoch's records per bin into the smoothed per-bin load."""
        counts = np.bincount(bins, weights=records, minlength=len(self._bin_load))
        self._bin_load *= 1.0 - LOAD_SMOOTHING
        self._bin_load += LOAD_SMOOTHING * counts

    def _recorded(self, record: EpochMetrics, trace: EpochTrace | None) -> None:
        """Keep an epoch's metrics record and, if it was traced, its trace (for policies)."""
        self._metrics.append(record)
        if trace is not None:
            self._traces.append(trace)

    def trace_records(self, last: int | None = None) -> list[EpochTrace]:
        """The newest ``last`` (default: all kept, up to :data:`POLICY_HISTORY`) epochs' SnailTrail
        traces, oldest first: what DS2 and the deadline policy read their times from. The
        state directory keeps more (``megaphone explain`` reads them)."""
        items = list(self._traces)
        return items[-last:] if last else items

    def _epoch_host(self) -> EpochHost:
        """What an epoch sees of this pipeline (:class:`~megaphone.migrator.epoch.EpochHost`);
        before the first, whether the session's Python workers can run megaphone at all."""
        check_python_workers(self.spark)
        def committed(commit: Commit) -> None:
            self._commit = commit

        return EpochHost(
            spark=self.spark, local_dir=self.local_dir, keep_outputs=self.keep_outputs,
            map_sides=self._map_sides, admit=self._admit, submit=self.migrate,
            policy_inputs=self._policy_inputs, stateful_workers=self._stateful_workers,
            spec=self._spec, outputs_frame=self._outputs_frame, track_load=self._track_load,
            committed=committed, recorded=self._recorded)

    def _run_epoch(self, batch: DataFrame, stream: dict[str, Any] | None,
                   input_end: float | None = None, *, want_frame: bool
                   ) -> tuple[pa.Table, DataFrame | None]:
        """Run one epoch end to end (:class:`~megaphone.migrator.epoch.EpochRun`); its outputs,
        and as a DataFrame too when ``want_frame``."""
        if stream is None and self.streaming:
            raise RuntimeError("the pipeline is running a stream; process() is not allowed")
        with self._lock:
            run = EpochRun(self._epoch_host(), self.epoch + 1, batch, stream, input_end,
                           want_frame=want_frame)
            try:
                outputs = run.run()
                return outputs, run.frame
            except BaseException:
                if self._commit.epoch < run.epoch:  # failed before its commit point
                    self._uncommitted = True
                    self._run_id = uuid.uuid4().hex  # its rerun must not replay its outputs
                raise

    def _undo_uncommitted(self) -> None:
        """Roll back what a failed epoch left past the last commit (workers that applied it),
        as reopening would, so the state read reflects the commit. The routing in force stays:
        the next epoch runs the failed one again, routed alike."""
        with self._lock:
            if not self._uncommitted:
                return
            self._recover(self.state_dir, self._commit)
            self.routing.save(self.state_dir.routing_path)  # recovery truncated it to the commit
            self._uncommitted = False

    def _spec(self, batch: DataFrame, update: Update, layout: EpochLayout) -> EpochSpec:
        """The metadata every task of the epoch gets."""
        assert self._key_type is not None  # the batch was admitted
        key_arrow, value_arrow = self._schema.arrow_types(self._key_type, update, batch.schema)
        out = self._output_spark_schema()
        timers: dict[str, Any] = {}
        if update.is_process:
            owners = self.routing.owners(layout.epoch)
            timers = {"watermark": watermark(self._commit.max_event_time, update.fn.lateness_us),
                      "owned": {int(w): tuple(np.flatnonzero(owners == w).tolist())
                                for w in np.unique(owners)}}
        return EpochSpec(
            **task_fields(layout, self._commit, self.routing),
            state_dir=str(self.state_dir.path.absolute()),
            backend=self._settings["backend"],
            key_type=self._key_type,
            num_bins=self._num_bins,
            update=update,
            output_schema=pa.schema([(f.name, arrow_type(f.dataType)) for f in out]),
            chunk_bytes=self.chunk_bytes,
            transfer=self.transfer,
            has_event_time=self.event_time is not None,
            shuffle_schema=shuffle_schema(key_arrow, value_arrow, self.event_time is not None),
            local_dir=self.local_dir,
            pipeline_id=self.fingerprint.pipeline_id,
            run_id=self._run_id,
            checkpoint=self._settings["checkpoint"],
            snapshot_every=self._settings["snapshot_every"],
            **timers,
            **self._hot_fields(update, layout, self._task_slots or 1),
        )
