"""``Pipeline``: a keyed stateful operator on Spark whose state moves between workers live.

Each epoch (one micro-batch) is one Spark job. Records get their bin in the JVM
(``xxhash64``) and their worker from the routing version in force at the epoch (a constant
array folded into the plan), and are shuffled with ``repartitionById`` so partition ``w`` is
worker ``w``. Bins that move at the epoch are exported by their old owners in the same job's
map stage and shuffled along with the records; each worker installs arriving state before it
applies any record of the epoch. Outputs and metrics come back in the job's results. The
driver holds only metadata: routing, plans and metrics.

``Pipeline`` is the facade users see; its parts live beside it: its state directory
(:mod:`~megaphone.migrator.pipeline_state_dir`), its epochs
(:mod:`~megaphone.migrator.pipeline_epochs`, which run :mod:`~megaphone.migrator.epoch`
through a narrow interface), its streaming query (:mod:`~megaphone.migrator.streaming`,
:mod:`~megaphone.migrator.connect_stream`), its configuration checks and types
(:mod:`~megaphone.migrator.config`, :mod:`~megaphone.migrator.schemas`) and the process
registry (:mod:`~megaphone.migrator.registry`).
"""

from __future__ import annotations

import collections
import functools
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from megaphone.migrator.autoscale import DS2Controller
from megaphone.migrator.commit import Commit
from megaphone.migrator.config import check_arguments, update_setting
from megaphone.migrator.connect_stream import ServeBatch, ServerHandoff
from megaphone.migrator.driver_copy import DriverCopy
from megaphone.migrator.pipeline_epochs import POLICY_HISTORY, PipelineEpochs
from megaphone.migrator.pipeline_groups import AUTO, PipelineGroups, check_group_size
from megaphone.migrator.pipeline_state_dir import StateDirOwner
from megaphone.migrator.plan_queue import MigrationHandle, PlanQueue
from megaphone.migrator.planning import bin_sizes, sizes_from_stats
from megaphone.migrator.recovery import RecoveryReport
from megaphone.migrator.registry import unregister
from megaphone.migrator.schemas import PipelineSchema
from megaphone.migrator.spark_job import MapSides
from megaphone.migrator.state_reader import DurableRead, read_bin_stats, read_state
from megaphone.migrator.statedir import StateDir
from megaphone.migrator.streaming import Sink, Stream
from megaphone.migrator.updates import UpdateArg
from megaphone.paths import StateDirPaths
from megaphone.plans.plan import MigrationPlan
from megaphone.plans.policy import MigrationPolicy
from megaphone.records import EpochMetrics
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import RoutingTable
from megaphone.spark import apply_pipeline_settings
from megaphone.state_backends import DEFAULT_CHUNK_BYTES, check_transfer
from megaphone.state_backends.durable import SNAPSHOT_EVERY
from megaphone.state_backends.remote import default_local_dir

if TYPE_CHECKING:
    from megaphone.plans.planner import BinSizes
    from megaphone.snailtrail import EpochTrace


class Pipeline(StateDirOwner, PipelineEpochs, ServerHandoff, PipelineGroups):
    """A keyed stateful operator over micro-batches whose state can migrate while it runs.

    ``update`` is ``"count"`` (records), ``"sum"``, ``"min"``, ``"max"`` (of ``value``, nulls
    skipped) or ``f(key, values, state) -> (new_state, outputs)`` with msgpack-serializable
    state. Each call of :meth:`process` (or each micro-batch of :meth:`start`) is one epoch; its
    outputs are, per key touched, the aggregate (null if all null so far) or what ``f`` emitted.

    Opening an existing ``state_dir`` resumes it: its routing, committed epoch and plans in
    flight; ``workers`` then only applies to a new directory. ``local_dir`` is the host-local
    directory of the store service that keeps the workers' stores open across epochs
    (default ``$MEGAPHONE_LOCAL_DIR`` or ``$TMPDIR/megaphone-<uid>``; docs/worker-store.md).
    ``transfer``: how moving bins travel, ``"auto"`` (RocksDB bins from 64 KiB as SST files,
    the rest as rows), ``"files"`` or ``"rows"``, in shuffle rows of up to ``chunk_bytes``.
    ``group_size``: epochs per Spark job when a batch holds several (``process(batch,
    epoch_column=...)``): a fixed int, or ``"auto"``, Drizzle's rule (docs/groups.md).

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
        update: UpdateArg = "count",
        workers: int = 2,
        num_bins: int = 4096,
        backend: str = "rocksdb",
        *,
        key_type: str | None = None,
        pipeline_id: str | None = None,
        event_time: str | None = None,
        output_type: str = "string",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        transfer: str = "auto",
        keep_outputs: int = 8,
        local_dir: str | None = None,
        checkpoint: str | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
        group_size: int | str = AUTO,
    ) -> None:
        check_arguments(key=key, value=value, update=update, workers=workers,
                        num_bins=num_bins, backend=backend, snapshot_every=snapshot_every)
        self._group_size = check_group_size(group_size)
        self.spark = spark
        self.key = key
        self.value = value
        self.event_time = event_time
        self.chunk_bytes = chunk_bytes
        self.transfer = check_transfer(transfer)
        self.keep_outputs = max(1, keep_outputs)
        self.local_dir = str(Path(local_dir or default_local_dir()).absolute())
        self._update_arg = update
        self._output_type_arg = output_type
        # The output type parsed once: it asks the JVM.
        self._schema = PipelineSchema(key, value, event_time, update,
                                      T._parse_datatype_string(output_type))
        self._settings = {
            "backend": backend,
            "key": key,
            "value": value,
            "update": update_setting(update, event_time),
            "checkpoint": checkpoint,
            "snapshot_every": snapshot_every,
        }
        self._workers = workers
        self._num_bins = num_bins
        self._pipeline_id = pipeline_id
        self._key_type = key_type
        self._lock = threading.RLock()  # one epoch at a time; guards commit and routing
        self._metrics: collections.deque[EpochMetrics] = collections.deque(maxlen=10_000)
        self._traces: collections.deque[EpochTrace] = collections.deque(maxlen=POLICY_HISTORY)
        self._bin_load = np.zeros(num_bins)  # records per bin per epoch, smoothed
        self._task_slots: int | None = None
        self._map_sides = MapSides()  # the epoch job's map side, kept while it holds
        self._state: StateDir | None = None
        self._queue: PlanQueue | None = None
        self._commit = Commit()
        self._path = Path(state_dir)
        self._stream: Stream | None = None  # the query started by start()
        self._on_server = False  # a stream runs this pipeline on a Spark Connect server
        self._uncommitted = False  # an epoch failed after workers may have applied it
        # This session's run: an epoch a worker applied in another run (one that crashed or
        # failed before its commit point) is rolled back there, never replayed.
        self._run_id = uuid.uuid4().hex
        self.recovery = RecoveryReport()  # what opening the state directory discarded
        apply_pipeline_settings(spark)  # partition w is worker w; no row-by-row routing
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
    def routing(self) -> RoutingTable:
        """The pipeline's routing table (read it; change it only through :meth:`migrate`)."""
        assert self._queue is not None
        return self._queue.table

    @property
    def streaming(self) -> bool:
        """True while a query started by :meth:`start` is running."""
        return self._stream is not None and self._stream.running

    @property
    def in_flight(self) -> list[MigrationHandle]:
        """Handles of the plans submitted and not finished yet, the active one first."""
        return self._queue.in_flight if self._queue is not None else []

    @property
    def epoch(self) -> int:
        """The last committed epoch (-1 before the first)."""
        return self._commit.epoch

    # -- public API ----------------------------------------------------------------------

    def process(self, batch: DataFrame, *, input_end: float | None = None,
                epoch_column: str | None = None) -> DataFrame:
        """Run one epoch over ``batch`` and return its outputs.

        ``input_end``: when the batch's input was complete (``time.time()`` seconds). With it
        the epoch's ``latency_s`` metric is its commit time minus ``input_end``, and the
        deadline policy sees how late the epoch starts (a backlog leaves less slack).
        ``epoch_column``: a backlog of epochs, one per distinct integer label of this column
        (labels increase from call to call), run in order in groups of epochs per Spark job
        (``group_size``; docs/groups.md); the outputs carry their label in that column.
        """
        if epoch_column is not None:
            return self._run_epochs(batch, epoch_column, input_end, want_frame=True)[1]
        _, frame = self._run_epoch(batch, None, input_end, want_frame=True)
        assert frame is not None
        return frame

    def process_arrow(self, batch: DataFrame, *, input_end: float | None = None,
                      epoch_column: str | None = None) -> pa.Table:
        """Like :meth:`process`, but return the outputs as a ``pyarrow.Table`` on the driver.

        The outputs reach the driver in the epoch's job results either way; this skips building
        a DataFrame from them (a round trip to the JVM, 15-50 ms an epoch on a small machine).
        Use it when the outputs are consumed in Python, as ``DataFrame.toArrow()`` would be.

        >>> pipe.process_arrow(spark.createDataFrame([("a",)], "word string")).to_pylist()
        ... # doctest: +SKIP
        [{'word': 'a', 'count': 3}]
        """
        if epoch_column is not None:
            return self._run_epochs(batch, epoch_column, input_end, want_frame=False)[0]
        outputs, _ = self._run_epoch(batch, None, input_end, want_frame=False)
        return outputs

    def start(
        self,
        stream: DataFrame,
        sink: Sink,
        trigger: dict[str, Any] | None = None,
        checkpoint_location: str | None = None,
        *,
        epoch_column: str | None = None,
    ):
        """Run on Structured Streaming: each micro-batch is an epoch; ``sink(outputs, epoch)``.

        ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g. ``{"processingTime": "1
        second"}``). Returns the ``StreamingQuery``. Restarting with the same checkpoint replays
        uncommitted batches; a batch id committed is not applied again, its stored outputs are
        handed to ``sink`` once more. ``epoch_column``: each micro-batch runs as the epochs of
        this integer column's labels (increasing from batch to batch) in groups, one Spark job
        per group, as ``process(..., epoch_column=)``; ``sink`` gets all the batch's outputs
        (each row with its label) and its last epoch. A replayed batch applies only its labels
        not committed yet; the others' outputs come from the kept outputs (docs/groups.md).

        Over Spark Connect, ``foreachBatch`` runs on the server: the batch function opens this
        pipeline there from its checkpoint location (``Pipeline(checkpoint=...)`` is needed, and
        ``checkpoint_location`` a path of the server's), ``sink`` runs there too, and this
        object is brought forward from the checkpoint when the query ends; meanwhile
        :meth:`process` and :meth:`migrate` are refused (submit plans before :meth:`start`).
        """
        run_batch, step_aside = self._batch_functions(stream.schema, epoch_column)
        self._stream = Stream(self.spark, run_batch,
                              str(StateDirPaths(self._path).stream_checkpoint),
                              step_aside, _open_on_server, self._rejoin)
        return self._stream.start(stream, sink, trigger, checkpoint_location)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the stream started by :meth:`start` between two epochs, not in the middle of one.

        Waits up to ``timeout`` seconds for the running epoch to commit so Spark does not
        interrupt the batch function; the query's checkpoint then resumes at the next batch."""
        if self._stream is not None:
            self._stream.stop(timeout)
            self._stream = None

    def migrate(self, plan: MigrationPlan, policy: MigrationPolicy | None = None
                ) -> MigrationHandle:
        """Submit ``plan``; it is validated now and applied at its epochs while the pipeline runs.

        Raises ``PlanError`` (nothing changes) for an invalid or stale plan. A plan submitted
        while another is in flight is queued if it starts where the other ends. An empty plan
        (nothing to move) is done at once, never queued. An adaptive plan (``strategy=
        "deadline"``, or any plan with ``policy=``, a callable ``policy(view) -> moves`` of
        :mod:`megaphone.plans.policy`) starts its moves when its policy says so, every epoch.
        """
        if self._queue is None:
            raise RuntimeError("the pipeline has no state yet: process a batch or give key_type")
        if self._on_server:
            raise RuntimeError("the pipeline's stream runs it on the Spark Connect server: "
                               "submit plans before start(), or stop() the stream first")
        with self._lock:  # between epochs: the plan is durable once this returns
            handle = self._queue.submit(plan, self._commit.epoch + 1, policy)
            if not handle.done:  # an empty plan is done already: nothing to make durable
                self._commit.plans = self._queue.to_list()
                self.state_dir.write_commit(self._commit)
        return handle

    def autoscale(self, policy: Any = None, **kw: Any) -> Any:
        """Turn on DS2 autoscaling: a started controller that rescales this pipeline live.

        ``policy`` is a :class:`megaphone.plans.autoscale.Policy`; ``kw`` go to
        :class:`~megaphone.migrator.autoscale.DS2Controller` (e.g. ``source_rate=``). Every
        policy interval it measures the workers' true rates and submits a rescale plan when
        DS2 says so; ``controller.stop()`` turns it off, ``controller.decisions`` explains it.
        """
        self._autoscaler = DS2Controller(self, policy, **kw).start()
        return self._autoscaler

    def close(self) -> None:
        """Stop a running stream, release the state directory's lock and forget the pipeline."""
        if getattr(self, "_autoscaler", None) is not None:
            self._autoscaler.stop()
        self.stop()
        if self._state is not None:
            self._flush_metrics()  # the last epoch's metrics, into the driver's durable copy
            self._release_stores(self._state)
            self._state.unlock()
            unregister(self._state.fingerprint.pipeline_id, self)

    def metrics(self, last: int | None = None) -> list[dict[str, Any]]:
        """Per-epoch metrics (records in/out, useful time, bins and bytes moved, per worker), as
        plain dicts: the records :meth:`metric_records` returns, as ``metrics.jsonl`` holds them."""
        return [m.to_dict() for m in self.metric_records(last)]

    def metric_records(self, last: int | None = None) -> list[EpochMetrics]:
        """The newest ``last`` (default: all kept) epochs' metrics as typed records, oldest
        first: what planning and policies read."""
        items = list(self._metrics)
        return items[-last:] if last else items

    def state(self) -> DataFrame:
        """The full current state as a DataFrame ``(key, state)``, read worker by worker.

        Built-in aggregations give the aggregate; a general ``f`` gives its state as msgpack
        bytes (``megaphone.state_backends.unpack_value`` decodes them). Reflects the last
        committed epoch (a failed epoch is rolled back first); read it between epochs."""
        self._undo_uncommitted()
        update = self._update_for(None)
        schema = self._schema.state(self._key_type, update)
        owners = self.routing.owners(max(self.epoch, 0))
        durable = None
        if self._settings["checkpoint"] is not None and self.epoch >= 0:
            durable = self._durable_read()
        return read_state(self.spark, self.state_dir.path, self._settings["backend"],
                          self._key_type, owners, schema, update.is_builtin, durable)

    def bin_sizes(self, owners: np.ndarray | None = None) -> BinSizes:
        """Keys and bytes of every bin at its owner under ``owners`` (default: the routing in
        force), as of the last commit. With a checkpoint location the working copies live on
        the executors: a small Spark job (one task per worker) reads them between two epochs
        (a stream's next epoch waits for it; the stores must not move past the commit read)."""
        owners = self.routing.owners() if owners is None else owners
        if self._settings["checkpoint"] is None:
            return bin_sizes(self.state_dir, owners)
        with self._lock:  # nothing committed yet: every bin is empty
            stats = () if self.epoch < 0 else read_bin_stats(
                self.spark, self._durable_read(), self._settings["backend"], self._key_type,
                self.routing.owners(self.epoch))
        return sizes_from_stats(stats, self._num_bins)

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
        """Records per bin per epoch, exponentially smoothed over this process's epochs."""
        return self._bin_load.copy()


def _open_on_server(spark: SparkSession, state_dir: str, settings: dict[str, Any]) -> ServeBatch:
    """Open a pipeline on a Spark Connect server for a stream's batch function
    (:class:`~megaphone.migrator.connect_stream.ServerBatch`)."""
    column = settings.get("epoch_column")  # start()'s, not the pipeline's
    pipe = Pipeline(spark, state_dir, **{k: v for k, v in settings.items() if k != "epoch_column"})
    return functools.partial(pipe._serve_batch, epoch_column=column)


__all__ = ["Pipeline"]
