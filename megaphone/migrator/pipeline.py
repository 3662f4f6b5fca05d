"""``Pipeline``: a keyed stateful operator on Spark whose state moves between workers live.

Each epoch (one micro-batch) is one Spark job. Records get their bin in the JVM
(``xxhash64``) and their worker from the routing version in force at the epoch (a constant
array folded into the plan), and are shuffled with ``repartitionById`` so partition ``w`` is
worker ``w``. Bins that move at the epoch are exported by their old owners in the same job's
map stage and shuffled along with the records; each worker installs arriving state before it
applies any record of the epoch. Outputs and metrics come back in the job's results.
The driver holds only metadata: routing, plans and metrics.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from megaphone.migrator.connect_stream import ServerBatch
from megaphone.migrator.driver_copy import DriverCopy
from megaphone.migrator.epoch import EpochRun
from megaphone.migrator.layout import EpochLayout
from megaphone.migrator.plan_queue import MigrationHandle, PlanQueue, PolicyInputs
from megaphone.migrator.planning import bin_sizes, epoch_records, sizes_from_stats
from megaphone.migrator.recovery import RecoveryReport, check_and_recover
from megaphone.migrator.spark_job import MapSide
from megaphone.migrator.state_reader import DurableRead, read_bin_stats, read_state
from megaphone.migrator.statedir import Commit, StateDir
from megaphone.migrator.updates import AGGREGATIONS, Update, UpdateFn, make_update
from megaphone.migrator.worker import (
    METRICS_COLUMN,
    EpochSpec,
    shuffle_schema,
)
from megaphone.paths import local_stores_path
from megaphone.plans.plan import MigrationPlan
from megaphone.plans.policy import MigrationPolicy
from megaphone.routing.bins import validate_num_bins
from megaphone.routing.fingerprint import Fingerprint
from megaphone.spark import is_connect, task_slots
from megaphone.state_backends import BACKENDS, DEFAULT_CHUNK_BYTES
from megaphone.state_backends.durable import SNAPSHOT_EVERY, claim_checkpoint
from megaphone.state_backends.remote import default_local_dir, release_stores

log = logging.getLogger("megaphone.pipeline")

#: Weight of the newest epoch in the per-bin load (records per bin, exponentially smoothed).
LOAD_SMOOTHING = 0.3
#: Newest epochs' metrics an adaptive plan's policy sees.
POLICY_HISTORY = 50
#: Pipelines alive in this process, by pipeline id, so ``megaphone.migrate(plan)`` finds them.
if TYPE_CHECKING:
    from megaphone.plans.planner import BinSizes

_PIPELINES: weakref.WeakValueDictionary[str, Pipeline] = weakref.WeakValueDictionary()


def running_pipeline(pipeline_id: str) -> Pipeline | None:
    """The pipeline with ``pipeline_id`` open in this process, if any."""
    return _PIPELINES.get(pipeline_id)


def _key_type_of(dtype: T.DataType, column: str) -> str:
    if isinstance(dtype, T.IntegralType):
        return "int64"
    if isinstance(dtype, T.StringType):
        return "str"
    raise TypeError(f"key column {column!r} must be an integer or string column, not {dtype}")


def _value_kind_of(dtype: T.DataType, column: str) -> str:
    if isinstance(dtype, (T.IntegralType, T.BooleanType)):
        return "int"
    if isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType)):
        return "float"
    raise TypeError(f"value column {column!r} must be numeric for a built-in aggregation, "
                    f"not {dtype}")


class Pipeline:
    """A keyed stateful operator over micro-batches whose state can migrate while it runs.

    ``update`` is ``"count"``, ``"sum"``, ``"min"``, ``"max"`` (of ``value`` per key,
    vectorized) or ``f(key, values, state) -> (new_state, outputs)`` with msgpack-serializable
    state. Each call of :meth:`process` (or each micro-batch of :meth:`start`) is one epoch; its
    outputs are, per key touched, the new aggregate (or what ``f`` emitted).

    Opening an existing ``state_dir`` resumes it: its routing, committed epoch and plans in
    flight; ``workers`` then only applies to a new directory. ``local_dir`` is the host-local
    directory of the store service that keeps the workers' stores open across epochs
    (default ``$MEGAPHONE_LOCAL_DIR`` or ``$TMPDIR/megaphone-<uid>``; docs/worker-store.md).

    >>> pipe = Pipeline(spark, "/tmp/wc", key="word", update="count")  # doctest: +SKIP
    >>> pipe.process(spark.createDataFrame([("a",), ("b",), ("a",)], "word string")).show()
    ... # doctest: +SKIP
    +----+-----+
    |word|count|
    +----+-----+
    |   a|    2|
    |   b|    1|
    +----+-----+
    """

    def __init__(
        self,
        spark: SparkSession,
        state_dir: str,
        key: str,
        value: str | None = None,
        update: str | UpdateFn = "count",
        workers: int = 2,
        num_bins: int = 4096,
        backend: str = "rocksdb",
        *,
        key_type: str | None = None,
        pipeline_id: str | None = None,
        event_time: str | None = None,
        output_type: str = "string",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        keep_outputs: int = 8,
        local_dir: str | None = None,
        checkpoint: str | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        validate_num_bins(num_bins)
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
        if isinstance(update, str) and update not in AGGREGATIONS:
            raise ValueError(f"update must be one of {AGGREGATIONS} or a callable, got {update!r}")
        if update in ("sum", "min", "max") and value is None:
            raise ValueError(f"update {update!r} needs a value column")
        if not workers >= 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if key == METRICS_COLUMN:
            raise ValueError(f"the key column may not be called {METRICS_COLUMN!r} (megaphone's "
                             "metrics column in an epoch's results)")
        self.spark = spark
        self.key = key
        self.value = value
        self.event_time = event_time
        self.chunk_bytes = chunk_bytes
        self.keep_outputs = max(1, keep_outputs)
        self.local_dir = str(Path(local_dir or default_local_dir()).absolute())
        self._update_arg = update
        self._output_type = T._parse_datatype_string(output_type)  # once: it asks the JVM
        self._output_type_arg = output_type
        self._settings = {
            "backend": backend,
            "key": key,
            "value": value,
            "update": update if isinstance(update, str) else "custom",
            "checkpoint": checkpoint,
            "snapshot_every": snapshot_every,
        }
        self._workers = workers
        self._num_bins = num_bins
        self._pipeline_id = pipeline_id
        self._key_type = key_type
        self._lock = threading.RLock()  # one epoch at a time; guards commit and routing
        self._metrics: collections.deque[dict[str, Any]] = collections.deque(maxlen=10_000)
        self._bin_load = np.zeros(num_bins)  # records per bin per epoch, smoothed
        self._task_slots: int | None = None
        # The epoch job's map side, kept while the routing version and columns hold.
        self._projection: tuple[tuple, MapSide] | None = None
        self._record_columns: tuple[tuple[str, str | None], dict[str, Column]] | None = None
        self._state: StateDir | None = None
        self._queue: PlanQueue | None = None
        self._commit = Commit()
        self._path = Path(state_dir)
        self._streaming = False
        self._on_server = False  # a stream runs this pipeline on a Spark Connect server
        self._query = None
        self._watcher: threading.Thread | None = None
        self._uncommitted = False  # an epoch failed after workers may have applied it
        # This session's run: an epoch a worker applied in another run (one that crashed or
        # failed before its commit point) is rolled back there, never replayed.
        self._run_id = uuid.uuid4().hex
        self.recovery = RecoveryReport()  # what opening the state directory discarded
        # Adaptive execution must not merge partitions: partition w is worker w.
        spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
        # With a checkpoint location the driver's copy there is the truth: a state directory
        # that is missing (a lost driver disk) or behind it is brought to it first.
        uri = (StateDir.open(self._path).manifest.get("checkpoint")
               if StateDir.exists(self._path) else None) or checkpoint
        if uri is not None:
            StateDir.restore(self._path, DriverCopy(uri), lambda m: self._check_restore(m, uri))
        if StateDir.exists(self._path):
            self._open(StateDir.open(self._path))
        elif key_type is not None:
            self._create(key_type)

    # -- state directory -----------------------------------------------------------------

    def _check_config(self, m: dict[str, Any], fp: Fingerprint, where: str) -> None:
        """Raise ``ValueError`` unless manifest ``m`` (at ``where``) is this configuration's."""
        mismatches = [
            f"{name} {mine!r} != {theirs!r}"
            for name, mine, theirs in [
                ("num_bins", self._num_bins, fp.num_bins),
                ("backend", self._settings["backend"], m.get("backend")),
                ("key", self.key, m.get("key")),
                ("value", self.value, m.get("value")),
                ("update", self._settings["update"], m.get("update")),
            ]
            if mine != theirs
        ]
        for name in ("checkpoint", "snapshot_every"):  # fixed at creation; None: as created
            theirs = m.get(name, None if name == "checkpoint" else SNAPSHOT_EVERY)
            if name == "checkpoint" and self._settings[name] not in (None, theirs):
                mismatches.append(f"checkpoint {self._settings[name]!r} != {theirs!r}")
            self._settings[name] = theirs
        if self._pipeline_id not in (None, fp.pipeline_id):
            mismatches.append(f"pipeline_id {self._pipeline_id!r} != {fp.pipeline_id!r}")
        if self._key_type not in (None, fp.key_type):
            mismatches.append(f"key_type {self._key_type!r} != {fp.key_type!r}")
        if mismatches:
            raise ValueError(
                f"{where} holds state of another pipeline configuration: " + "; ".join(mismatches)
            )

    def _check_restore(self, m: dict[str, Any], uri: str, owner: Pipeline | None = None) -> None:
        """Refuse to restore a state directory from the driver's copy at ``uri`` for another
        configuration, or for a pipeline already open in this process (but ``owner``)."""
        fp = Fingerprint.from_dict(m.get("fingerprint"))
        self._check_config(m, fp, f"checkpoint location {uri}")
        other = _PIPELINES.get(fp.pipeline_id)
        if other is not None and other is not owner:
            raise ValueError(f"pipeline {fp.pipeline_id} of checkpoint location {uri} is open "
                             f"in this process on {other._path}; close it first")

    def _open(self, state: StateDir) -> None:
        fp = state.fingerprint
        self._check_config(state.manifest, fp, str(state.path))
        state.lock()
        commit = state.read_commit()
        self._recover(state, commit)
        self._state = state
        self._key_type = fp.key_type
        self._pipeline_id = fp.pipeline_id
        self._commit = commit
        self._queue = PlanQueue(state.load_routing())
        self._queue.restore(self._commit.plans)
        self._metrics.extend(state.read_metrics(last=self._metrics.maxlen))
        self._register()

    def _create(self, key_type: str) -> None:
        fp = Fingerprint(self._pipeline_id or uuid.uuid4().hex[:16], self._num_bins, key_type)
        if self._settings["checkpoint"] is not None:
            claim_checkpoint(self._settings["checkpoint"], fp.pipeline_id)
        self._open(StateDir.create(self._path, fp, self._workers, self._settings))

    def _register(self) -> None:
        other = _PIPELINES.get(self.fingerprint.pipeline_id)
        if other is not None and other is not self:
            raise ValueError(
                f"pipeline {self.fingerprint.pipeline_id} is already open in this process "
                f"on {other._path}"
            )
        _PIPELINES[self.fingerprint.pipeline_id] = self

    @property
    def fingerprint(self) -> Fingerprint:
        """Pipeline id, bin count and key type (known once the first batch was seen)."""
        if self._state is None:
            raise RuntimeError("the pipeline has no state yet: process a batch or give key_type")
        return self._state.fingerprint

    @property
    def state_dir(self) -> StateDir:
        """The pipeline's state directory."""
        if self._state is None:
            raise RuntimeError("the pipeline has no state yet: process a batch or give key_type")
        return self._state

    @property
    def routing(self):
        """The pipeline's routing table (read it; change it only through :meth:`migrate`)."""
        assert self._queue is not None
        return self._queue.table

    @property
    def streaming(self) -> bool:
        """True while a query started by :meth:`start` is running."""
        return self._streaming

    @property
    def in_flight(self) -> list[MigrationHandle]:
        """Handles of the plans submitted and not finished yet, the active one first."""
        return self._queue.in_flight if self._queue is not None else []

    @property
    def epoch(self) -> int:
        """The last committed epoch (-1 before the first)."""
        return self._commit.epoch

    # -- public API ----------------------------------------------------------------------

    def process(self, batch: DataFrame, *, input_end: float | None = None) -> DataFrame:
        """Run one epoch over ``batch`` and return its outputs.

        ``input_end``: when the batch's input was complete (``time.time()`` seconds). With it
        the epoch's ``latency_s`` metric is its commit time minus ``input_end``, and the
        deadline policy sees how late the epoch starts (a backlog leaves less slack).
        """
        _, frame = self._run_epoch(batch, None, input_end, want_frame=True)
        assert frame is not None
        return frame

    def process_arrow(self, batch: DataFrame, *, input_end: float | None = None) -> pa.Table:
        """Like :meth:`process`, but return the outputs as a ``pyarrow.Table`` on the driver.

        The outputs reach the driver in the epoch's job results either way; this skips building
        a DataFrame from them (a round trip to the JVM, 15-50 ms an epoch on a small machine).
        Use it when the outputs are consumed in Python, as ``DataFrame.toArrow()`` would be.

        >>> pipe.process_arrow(spark.createDataFrame([("a",)], "word string")).to_pylist()
        ... # doctest: +SKIP
        [{'word': 'a', 'count': 3}]
        """
        outputs, _ = self._run_epoch(batch, None, input_end, want_frame=False)
        return outputs

    def start(
        self,
        stream: DataFrame,
        sink: Callable[[DataFrame, int], None],
        trigger: dict[str, Any] | None = None,
        checkpoint_location: str | None = None,
    ):
        """Run on Structured Streaming: each micro-batch is an epoch; ``sink(outputs, epoch)``.

        ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g.
        ``{"processingTime": "1 second"}``). Returns the ``StreamingQuery``. Restarting with the
        same checkpoint replays uncommitted batches; a batch id already committed is not
        applied again, only its stored outputs are handed to ``sink`` once more.

        Over Spark Connect, ``foreachBatch`` runs on the server: the batch function opens this
        pipeline there from its checkpoint location (``Pipeline(checkpoint=...)`` is needed, and
        ``checkpoint_location`` a path of the server's), ``sink`` runs there too, and this
        object is brought forward from the checkpoint when the query ends; meanwhile
        :meth:`process` and :meth:`migrate` are refused (submit plans before :meth:`start`).
        """
        if is_connect(self.spark):
            on_batch: Callable[[DataFrame, int], None] = self._server_batch(
                sink, checkpoint_location)
            location = checkpoint_location
        else:
            location = checkpoint_location or str(self._path / "_stream_checkpoint")

            def on_batch(batch_df: DataFrame, batch_id: int) -> None:
                outputs, epoch = self._run_batch(batch_df, batch_id, location)
                sink(outputs, epoch)

        writer = stream.writeStream.foreachBatch(on_batch).option(
            "checkpointLocation", location
        )
        if trigger:
            writer = writer.trigger(**trigger)
        self._streaming = True
        try:
            query = writer.start()
        except BaseException:
            self._streaming = False
            if self._on_server:
                self._rejoin()
            raise
        self._query = query
        self._watcher = threading.Thread(target=self._watch, args=(query,), daemon=True)
        self._watcher.start()
        return query

    def _server_batch(self, sink: Callable[[DataFrame, int], None],
                      location: str | None) -> ServerBatch:
        """Step aside for a stream over Spark Connect; the batch function that runs the
        pipeline on the server (:mod:`megaphone.migrator.connect_stream`)."""
        if self._settings["checkpoint"] is None or location is None:
            raise ValueError(
                "over Spark Connect, start() runs the pipeline on the server: it needs the "
                "pipeline's checkpoint location (Pipeline(..., checkpoint=URI)) and a "
                "checkpoint_location for the query, both reachable from the server")
        if self._state is None:
            raise RuntimeError("the pipeline has no state yet: process a batch or give key_type")
        fp = self.fingerprint
        settings = {"key": self.key, "value": self.value, "update": self._update_arg,
                    "num_bins": self._num_bins, "backend": self._settings["backend"],
                    "key_type": fp.key_type, "pipeline_id": fp.pipeline_id,
                    "event_time": self.event_time, "output_type": self._output_type_arg,
                    "chunk_bytes": self.chunk_bytes, "keep_outputs": self.keep_outputs,
                    "checkpoint": self._settings["checkpoint"],
                    "snapshot_every": self._settings["snapshot_every"]}
        with self._lock:  # the server opens the stores and writes the checkpoint from now on
            self._release_stores(self._state)
            self._state.unlock()
            self._on_server = True
        return ServerBatch(settings, location, sink)

    def _rejoin(self) -> None:
        """Bring this pipeline forward from the checkpoint after its stream ran on a Spark
        Connect server (the epochs, routing, plans and metrics the server committed)."""
        with self._lock:
            uri = self._settings["checkpoint"]
            StateDir.restore(self._path, DriverCopy(uri), lambda m: self._check_restore(m, uri,
                                                                                        self))
            self._metrics.clear()
            self._open(StateDir.open(self._path))
            self._on_server = False

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the stream started by :meth:`start` between two epochs, not in the middle of one.

        Waits up to ``timeout`` seconds for the running epoch to commit so Spark does not
        interrupt the batch function; the query's checkpoint then resumes at the next batch.
        """
        query = self._query
        if query is None:
            return
        deadline = time.time() + timeout
        while query.isActive and query.status.get("isTriggerActive") and time.time() < deadline:
            time.sleep(0.05)
        query.stop()
        self._query = None
        if self._watcher is not None:  # over Spark Connect it brings the pipeline forward
            self._watcher.join()
            self._watcher = None

    def _watch(self, query) -> None:
        try:
            query.awaitTermination()
        except Exception:  # the query's error is the user's to see; we only clear the flag
            pass
        finally:
            try:
                if self._on_server:
                    self._rejoin()
            except Exception:
                log.exception("the pipeline could not be brought forward from its checkpoint "
                              "after its stream on the Spark Connect server ended")
            finally:
                self._streaming = False

    def migrate(self, plan: MigrationPlan, policy: MigrationPolicy | None = None
                ) -> MigrationHandle:
        """Submit ``plan``; it is validated now and applied at its epochs while the pipeline runs.

        Raises ``PlanError`` (nothing changes) for an invalid or stale plan. A plan submitted
        while another is in flight is queued if it starts where the other ends. An adaptive
        plan (``strategy="deadline"``, or any plan with ``policy=``, a callable
        ``policy(view) -> moves`` of :mod:`megaphone.plans.policy`) starts its moves when its
        policy says so, asked before every epoch.
        """
        if self._queue is None:
            raise RuntimeError("the pipeline has no state yet: process a batch or give key_type")
        if self._on_server:
            raise RuntimeError("the pipeline's stream runs it on the Spark Connect server: "
                               "submit plans before start(), or stop() the stream first")
        with self._lock:  # between epochs: the plan is durable once this returns
            handle = self._queue.submit(plan, self._commit.epoch + 1, policy)
            self._commit.plans = self._queue.to_list()
            self.state_dir.write_commit(self._commit)
        return handle

    def autoscale(self, policy: Any = None, **kw: Any) -> Any:
        """Turn on DS2 autoscaling: a started controller that rescales this pipeline live.

        ``policy`` is a :class:`megaphone.migrator.autoscale.Policy`; ``kw`` go to
        :class:`~megaphone.migrator.autoscale.DS2Controller` (e.g. ``source_rate=``). Every
        policy interval it measures the workers' true rates and submits a rescale plan when
        DS2 says so; ``controller.stop()`` turns it off, ``controller.decisions`` explains it.
        """
        from megaphone.migrator.autoscale import DS2Controller

        self._autoscaler = DS2Controller(self, policy, **kw).start()
        return self._autoscaler

    def close(self) -> None:
        """Stop a running stream, release the state directory's lock and forget the pipeline."""
        if getattr(self, "_autoscaler", None) is not None:
            self._autoscaler.stop()
        self.stop()
        if self._state is not None:
            with self._lock:  # the last epoch's metrics, into the driver's durable copy
                if self._state.durable is not None and self._state.durable.has_pending_metrics:
                    self._state.write_commit(self._commit)
            self._release_stores(self._state)
            self._state.unlock()
            if _PIPELINES.get(self._state.fingerprint.pipeline_id) is self:
                del _PIPELINES[self._state.fingerprint.pipeline_id]

    def metrics(self, last: int | None = None) -> list[dict[str, Any]]:
        """Per-epoch metrics (records in/out, useful time, bins and bytes moved, per worker)."""
        items = list(self._metrics)
        return items[-last:] if last else items

    def state(self) -> DataFrame:
        """The full current state as a DataFrame ``(key, state)``, read worker by worker.

        Built-in aggregations give the aggregate; a general ``f`` gives its state as msgpack
        bytes (``megaphone.state_backends.unpack_value`` decodes them). Reflects the last
        committed epoch (a failed epoch is rolled back first); do not read it while an epoch
        is running.
        """
        self._undo_uncommitted()
        update = self._update_for(None)
        out = self._output_spark_schema()
        value = out[1].dataType if update.is_builtin else T.BinaryType()
        schema = T.StructType([out[0], T.StructField("state", value)])
        owners = self.routing.owners(max(self.epoch, 0))
        durable = None
        if self._settings["checkpoint"] is not None and self.epoch >= 0:
            durable = self._durable_read()
        return read_state(self.spark, self.state_dir.path, self._settings["backend"],
                          self._key_type, owners, schema, update.is_builtin, durable)

    # -- epochs --------------------------------------------------------------------------

    def _update_for(self, value_type: T.DataType | None) -> Update:
        """The update, its value kind from ``value_type`` (a batch's) or from the manifest."""
        kind = self._state.manifest.get("value_kind") if self._state is not None else None
        if value_type is not None and self._update_arg in ("sum", "min", "max"):
            batch_kind = _value_kind_of(value_type, self.value or "")
            if kind == "int" and batch_kind == "float":
                raise TypeError(f"value column {self.value!r} holds floats but the pipeline's "
                                "aggregates are integers")
            kind = kind or batch_kind
        return make_update(self._update_arg, kind or "int", to_arrow_type(self._output_type))

    def bin_sizes(self, owners: np.ndarray | None = None) -> BinSizes:
        """Keys and bytes of every bin at its owner under ``owners`` (default: the routing in
        force), as of the last commit. With a checkpoint location the working copies live on
        the executors, so this runs a small Spark job (one task per worker)."""
        owners = self.routing.owners() if owners is None else owners
        if self._settings["checkpoint"] is None or self.epoch < 0:
            return bin_sizes(self.state_dir, owners)
        committed = self.routing.owners(self.epoch)
        return sizes_from_stats(read_bin_stats(self.spark, self._durable_read(),
                                               self._settings["backend"], self._key_type,
                                               committed), self._num_bins)

    def _stateful_workers(self) -> list[int]:
        """Workers that may hold state: those with a directory in the state directory, or
        with a checkpoint location (working copies on the executors), every worker that ever
        owned a bin."""
        if self._settings["checkpoint"] is None:
            return self.state_dir.worker_ids()
        return self.routing.all_workers()

    def _durable_read(self) -> DurableRead:
        return DurableRead(self.local_dir, self._settings["checkpoint"],
                           self._settings["snapshot_every"], self.epoch,
                           self.fingerprint.pipeline_id, self._run_id,
                           self._commit.worker_tokens())

    def bin_load(self) -> np.ndarray:
        """Records per bin per epoch, exponentially smoothed over the epochs run in this process.
        """
        return self._bin_load.copy()

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
            history=lambda: epoch_records(self.metrics(last=POLICY_HISTORY)), bin_bytes=sizes,
            bin_records=load, lag_s=lag_s, parallelism=self._task_slots)

    def _run_batch(self, batch: DataFrame, batch_id: int, location: str) -> tuple[DataFrame, int]:
        with self._lock:
            stream = self._commit.stream
            if stream.get("checkpoint") == location and batch_id <= stream.get("batch_id", -1):
                last = stream.get("epoch", self._commit.epoch)  # offline epochs ran since
                epoch = last - (stream["batch_id"] - batch_id)
                return self._read_outputs(epoch), epoch
            _, frame = self._run_epoch(batch, {"checkpoint": location, "batch_id": batch_id},
                                       want_frame=True)
            assert frame is not None
            return frame, self._commit.epoch

    def _read_outputs(self, epoch: int) -> DataFrame:
        return self._outputs_frame(self.state_dir.read_outputs(epoch))

    def _outputs_frame(self, outputs: pa.Table) -> DataFrame:
        """An epoch's outputs (collected from its job) as a DataFrame."""
        return self.spark.createDataFrame(outputs, schema=self._output_spark_schema())

    def _output_spark_schema(self) -> T.StructType:
        update = self._update_for(None)
        key_spark = T.LongType() if self._key_type == "int64" else T.StringType()
        if update.is_builtin:
            value = T.LongType() if update.output_arrow_type() == pa.int64() else T.DoubleType()
            name = update.kind
        else:
            value = self._output_type
            name = "output"
        return T.StructType([T.StructField(self.key, key_spark), T.StructField(name, value)])

    def _prepare(self, batch: DataFrame) -> tuple[dict[str, Column], Update]:
        """Check ``batch`` against the pipeline and return its record columns (``key``, and
        ``value`` and ``_t`` where used) and the update; creates the state dir on first use."""
        schema = batch.schema
        for column in (self.key, self.value, self.event_time):
            if column is not None and column not in schema.names:
                raise ValueError(f"column {column!r} not in the batch (columns: {schema.names})")
        key_type = _key_type_of(schema[self.key].dataType, self.key)
        value_type = schema[self.value].dataType if self.value else None
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
        key_cast = "long" if key_type == "int64" else "string"
        value_cast = None
        if self.value and update.is_builtin:
            value_cast = "long" if update.value_kind == "int" else "double"
        # Built once: every Column costs the driver a dozen JVM calls, and they are reusable.
        if self._record_columns is None or self._record_columns[0] != (key_cast, value_cast):
            cols: dict[str, Column] = {"key": F.col(self.key).cast(key_cast)}
            if self.value:
                cols["value"] = F.col(self.value) if value_cast is None else \
                    F.col(self.value).cast(value_cast)
            if self.event_time:
                cols["_t"] = F.unix_micros(F.col(self.event_time).cast("timestamp"))
            self._record_columns = ((key_cast, value_cast), cols)
        return self._record_columns[1], update

    def _run_epoch(self, batch: DataFrame, stream: dict[str, Any] | None,
                   input_end: float | None = None, *, want_frame: bool
                   ) -> tuple[pa.Table, DataFrame | None]:
        """Run one epoch end to end (:class:`~megaphone.migrator.epoch.EpochRun`); its outputs,
        and as a DataFrame too when ``want_frame``."""
        if stream is None and self._streaming:
            raise RuntimeError("the pipeline is running a stream; process() is not allowed")
        with self._lock:
            run = EpochRun(self, batch, stream, input_end, want_frame=want_frame)
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

    def _recover(self, state: StateDir, commit: Commit) -> None:
        """Bring ``state`` back to ``commit`` (:func:`check_and_recover`). Its stores may still be
        open in the store service (a crashed run's, or a failed epoch's): it closes them first,
        since recovery opens them here; the next epoch's tasks open them there again."""
        self._release_stores(state)
        self.recovery = check_and_recover(state, commit)

    def _release_stores(self, state: StateDir) -> None:
        """Close ``state``'s stores in this host's store service (working copies under the
        state directory, or this host's under ``local_dir`` with a checkpoint location)."""
        release_stores(self.local_dir, str(state.path))
        if self._settings["checkpoint"] is not None:
            release_stores(self.local_dir, str(
                local_stores_path(self.local_dir, state.fingerprint.pipeline_id)))

    def _track_load(self, bins: np.ndarray, records: np.ndarray) -> None:
        counts = np.bincount(bins, weights=records, minlength=len(self._bin_load))
        self._bin_load *= 1.0 - LOAD_SMOOTHING
        self._bin_load += LOAD_SMOOTHING * counts

    def _spec(self, batch: DataFrame, update: Update, layout: EpochLayout) -> EpochSpec:
        """The metadata every task of the epoch gets."""
        key_arrow = pa.int64() if self._key_type == "int64" else pa.string()
        value_arrow = None
        if self.value:
            value_arrow = (pa.int64() if update.value_kind == "int" else pa.float64()) \
                if update.is_builtin else to_arrow_type(batch.schema[self.value].dataType)
        out = self._output_spark_schema()
        return EpochSpec(
            epoch=layout.epoch,
            state_dir=str(self.state_dir.path.absolute()),
            backend=self._settings["backend"],
            key_type=self._key_type,
            num_bins=self._num_bins,
            update=update,
            output_schema=pa.schema([(f.name, to_arrow_type(f.dataType)) for f in out]),
            chunk_bytes=self.chunk_bytes,
            incoming=layout.incoming,
            outgoing=layout.outgoing,
            drops=layout.drops,
            live=layout.live,
            has_event_time=self.event_time is not None,
            shuffle_schema=shuffle_schema(key_arrow, value_arrow, self.event_time is not None),
            local_dir=self.local_dir,
            pipeline_id=self.fingerprint.pipeline_id,
            run_id=self._run_id,
            committed_tokens=self._commit.worker_tokens(),
            checkpoint=self._settings["checkpoint"],
            snapshot_every=self._settings["snapshot_every"],
            committed_owners=frozenset(self.routing.workers(self._commit.epoch))
            if self._commit.epoch >= 0 else frozenset(),
        )


__all__ = ["Pipeline", "running_pipeline"]
