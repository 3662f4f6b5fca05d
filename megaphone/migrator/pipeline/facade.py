"""``Pipeline``: a keyed stateful operator on Spark whose state moves between workers live.

Each epoch (one micro-batch) is one Spark job that shuffles the records to their workers
together with the state of the bins moving at the epoch. ``Pipeline`` is a facade over its
state holder, epoch driver and stream runner (docs/architecture.md, "A Pipeline and its
collaborators"); its arguments are one frozen
:class:`~megaphone.migrator.epoch.config.PipelineConfig`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from megaphone.migrator.control.ds2_controller import DS2Controller
from megaphone.migrator.epoch.config import AUTO, PipelineConfig
from megaphone.migrator.epoch.driver import EpochDriver
from megaphone.migrator.epoch.schemas import PipelineSchema
from megaphone.migrator.epoch.state_holder import StateHolder
from megaphone.migrator.epoch.state_reader import read_state
from megaphone.migrator.pipeline.stream_runner import Sink, StreamRunner
from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.statedir.recovery import RecoveryReport
from megaphone.migrator.task.updates import UpdateArg
from megaphone.operators.stateful_processor import transform_with_state
from megaphone.paths import StateDirPaths
from megaphone.plans.handle import MigrationHandle
from megaphone.plans.hot_keys import DEFAULT_CAPACITY, HeavyHitters, SplitPolicy
from megaphone.plans.plan import MigrationPlan
from megaphone.plans.planner import BinSizes
from megaphone.plans.policy import MigrationPolicy
from megaphone.records import EpochMetrics
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import RoutingTable
from megaphone.snailtrail import EpochTrace
from megaphone.spark import apply_pipeline_settings
from megaphone.state_backends import DEFAULT_CHUNK_BYTES, check_transfer
from megaphone.state_backends.durable import SNAPSHOT_EVERY
from megaphone.state_backends.remote import default_local_dir


class Pipeline:
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
    ``slots_per_host``: worker tasks one host runs at once (its executors' cores), which homes,
    DS2 and the deadline policy read; needed with a cluster master, where it is not derived
    (``None``: known only for a local master; docs/placement.md).
    ``update`` may also be a Spark ``StatefulProcessor`` (as given to ``transformWithState``),
    with ``output_type`` its output schema (a StructType or DDL), ``time_mode`` ``"None"`` or
    ``"EventTime"`` and, for event time, ``event_time`` and ``watermark_delay`` (Spark's
    ``withWatermark``); ``processor_api="transformWithStateInPandas"`` for one written for
    pandas frames (default ``"transformWithState"``, Rows); docs/operators.md.

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
        output_type: str | T.StructType = "string",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        transfer: str = "auto",
        keep_outputs: int = 8,
        local_dir: str | None = None,
        checkpoint: str | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
        group_size: int | str = AUTO,
        slots_per_host: int | None = None,
        time_mode: str | None = None,
        watermark_delay: int | float | str | None = None,
        processor_api: str | None = None,
    ) -> None:
        if isinstance(update, StatefulProcessor):  # Spark's transformWithState processor
            out = output_type if isinstance(output_type, T.StructType) else \
                T._parse_datatype_string(output_type)
            zone = spark.conf.get("spark.sql.session.timeZone") or "UTC"
            update = transform_with_state(update, out, time_mode, event_time, watermark_delay,
                                          processor_api, zone)
            output_type = out.simpleString()
        elif time_mode is not None or watermark_delay is not None or processor_api is not None:
            raise ValueError("time_mode, watermark_delay and processor_api are for a Spark "
                             "StatefulProcessor update")
        config = PipelineConfig(
            key=key, value=value, update=update, workers=workers, num_bins=num_bins,
            backend=backend, key_type=key_type, pipeline_id=pipeline_id, event_time=event_time,
            output_type=output_type, chunk_bytes=chunk_bytes, transfer=transfer,
            keep_outputs=keep_outputs, local_dir=local_dir, checkpoint=checkpoint,
            snapshot_every=snapshot_every, group_size=group_size, slots_per_host=slots_per_host)
        self._setup(spark, state_dir, config)

    @classmethod
    def from_config(cls, spark: SparkSession, state_dir: str, config: PipelineConfig
                    ) -> Pipeline:
        """Open the pipeline of ``config`` in ``state_dir``: what a Spark Connect server does
        with the configuration a client's stream hands it."""
        pipe = cls.__new__(cls)
        pipe._setup(spark, state_dir, config)
        return pipe

    def _setup(self, spark: SparkSession, state_dir: str, config: PipelineConfig) -> None:
        """Check ``config``, build the collaborators and open (or restore) the state dir."""
        config.check()
        config = dataclasses.replace(
            config, keep_outputs=max(1, config.keep_outputs),
            transfer=check_transfer(config.transfer),
            local_dir=str(Path(config.local_dir or default_local_dir()).absolute()))
        self.spark = spark
        #: The pipeline's arguments, as given (:attr:`config`: as the state directory fixes them).
        self.key, self.value, self.event_time = config.key, config.value, config.event_time
        self.chunk_bytes, self.transfer = config.chunk_bytes, config.transfer
        self.keep_outputs, self.local_dir = config.keep_outputs, config.local_dir
        # The output type parsed once: it asks the JVM.
        schema = PipelineSchema(config.key, config.value, config.event_time, config.update,
                                T._parse_datatype_string(config.output_type))
        path = Path(state_dir)
        self._holder: StateHolder = StateHolder(spark, path, config, self)
        self._driver: EpochDriver = EpochDriver(spark, self._holder, schema, config)
        self._runner: StreamRunner = StreamRunner(spark, self._holder, self._driver,
                                    str(StateDirPaths(path).stream_checkpoint), _open_on_server)
        self._autoscaler: DS2Controller | None = None
        self._lock = self._holder.lock  # one epoch at a time; the DS2 controller plans under it
        apply_pipeline_settings(spark)  # partition w is worker w; no row-by-row routing
        self._holder.start()  # restored first from the checkpoint location's driver copy

    # -- what it is ----------------------------------------------------------------------

    @property
    def config(self) -> PipelineConfig:
        """The pipeline's configuration, as its state directory fixes it once open."""
        return self._holder.config

    @property
    def recovery(self) -> RecoveryReport:
        """What opening the state directory discarded (a crashed epoch's leftovers)."""
        return self._holder.recovery

    @property
    def fingerprint(self) -> Fingerprint:
        """Pipeline id, bin count and key type (known once the first batch was seen)."""
        return self._holder.state_dir.fingerprint

    @property
    def state_dir(self) -> StateDir:
        """The pipeline's state directory."""
        return self._holder.state_dir

    @property
    def routing(self) -> RoutingTable:
        """The pipeline's routing table (read it; change it only through :meth:`migrate`);
        while a stream runs the pipeline on a Spark Connect server, as its last commit has it."""
        if self._runner.on_server:
            return self._runner.committed_routing()
        return self._holder.routing

    def host_slots(self) -> dict[str, int | None]:
        """The hosts the last commit knows and each one's task slots (``None`` where unknown:
        ``slots_per_host`` tells them; docs/placement.md), which DS2 sets its target
        against."""
        commit = self.state_dir.read_commit() if self._runner.on_server else \
            self._holder.commit
        return commit.host_slots()

    @property
    def streaming(self) -> bool:
        """True while a query started by :meth:`start` is running."""
        return self._runner.running

    @property
    def in_flight(self) -> list[MigrationHandle]:
        """Handles of the plans submitted and not finished yet, the active one first."""
        queue = self._holder.queue
        return queue.in_flight if queue is not None else []

    @property
    def epoch(self) -> int:
        """The last committed epoch (-1 before the first)."""
        return self._holder.epoch

    @property
    def label(self) -> int | None:
        """The label of the last committed epoch that ran from an epoch column (``None`` if
        none did): a later batch's labels must be larger."""
        return self._holder.commit.label

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
        frame = self._process(batch, input_end, epoch_column, want_frame=True)[1]
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
        return self._process(batch, input_end, epoch_column, want_frame=False)[0]

    def _process(self, batch: DataFrame, input_end: float | None, epoch_column: str | None,
                 *, want_frame: bool) -> tuple[pa.Table, DataFrame | None]:
        if self.streaming:
            raise RuntimeError("the pipeline is running a stream; process() is not allowed")
        return self._driver.run(batch, epoch_column, input_end, want_frame=want_frame)

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
        Over Spark Connect the pipeline runs on the server, opened from its checkpoint
        location (``Pipeline(checkpoint=...)`` is needed; README, "What it does").
        """
        return self._runner.start(stream, sink, trigger, checkpoint_location, epoch_column)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the stream started by :meth:`start` between two epochs, not in the middle of one.

        Waits up to ``timeout`` seconds for the running epoch to commit so Spark does not
        interrupt the batch function; the query's checkpoint then resumes at the next batch."""
        self._runner.stop(timeout)

    def migrate(self, plan: MigrationPlan, policy: MigrationPolicy | None = None
                ) -> MigrationHandle:
        """Submit ``plan``; it is validated now and applied at its epochs while the pipeline runs.

        Raises ``PlanError`` (nothing changes) for an invalid or stale plan. A plan submitted
        while another is in flight is queued if it starts where the other ends. An empty plan
        (nothing to move) is done at once, never queued. An adaptive plan (``strategy=
        "deadline"``, or any plan with ``policy=``, a callable ``policy(view) -> moves`` of
        :mod:`megaphone.plans.policy`) starts its moves when its policy says so, every epoch.
        While a stream runs the pipeline on a Spark Connect server, a fixed plan without
        ``policy`` is posted to it through the checkpoint
        (:mod:`megaphone.migrator.statedir.inbox`).
        """
        posted = self._runner.post_plan(plan, policy)
        if posted is not None:  # the stream runs this pipeline on a Spark Connect server
            return posted
        return self._holder.submit_plan(plan, policy)  # durable once this returns

    def autoscale(self, policy: Any = None, **kw: Any) -> Any:
        """Turn on DS2 autoscaling: a started controller that rescales this pipeline live.

        ``policy`` is a :class:`megaphone.plans.autoscale.Policy`; ``kw`` go to
        :class:`~megaphone.migrator.control.ds2_controller.DS2Controller` (e.g.
        ``source_rate=``). Every policy interval it measures the workers' true rates and
        submits a rescale plan when DS2 says so; ``controller.stop()`` turns it off,
        ``controller.decisions`` explains it.
        """
        self._autoscaler = DS2Controller(self, policy, **kw).start()
        return self._autoscaler

    def close(self) -> None:
        """Stop a running stream, release the state directory's lock and forget the pipeline."""
        if self._autoscaler is not None:
            self._autoscaler.stop()
        self.stop()
        self._holder.close()

    def metrics(self, last: int | None = None) -> list[dict[str, Any]]:
        """Per-epoch metrics (records in/out, useful time, bins and bytes moved, per worker), as
        plain dicts: the records :meth:`metric_records` returns, as ``metrics.jsonl`` holds them."""
        return [m.to_dict() for m in self.metric_records(last)]

    def metric_records(self, last: int | None = None) -> list[EpochMetrics]:
        """The newest ``last`` (default: all kept) epochs' metrics as typed records, oldest
        first: what planning and policies read."""
        items = list(self._holder.metrics)
        return items[-last:] if last else items

    def trace_records(self, last: int | None = None) -> list[EpochTrace]:
        """The newest ``last`` (default: all kept, up to
        :data:`~megaphone.migrator.epoch.state_holder.POLICY_HISTORY`) epochs' SnailTrail
        traces, oldest first: what DS2 and the deadline policy read their times from. The
        state directory keeps more (``megaphone explain`` reads them)."""
        items = list(self._holder.traces)
        return items[-last:] if last else items

    def state(self) -> DataFrame:
        """The full current state as a DataFrame ``(key, state)``, read worker by worker.

        Built-in aggregations give the aggregate; a general ``f`` gives its state as msgpack
        bytes (``megaphone.state_backends.unpack_value`` decodes them). Reflects the last
        committed epoch (a failed epoch is rolled back first); read it between epochs."""
        holder = self._holder
        holder.undo_uncommitted()
        update = self._driver.update_for(None)
        schema = self._driver.schema.state(holder.key_type, update)
        owners = self.routing.owners(max(self.epoch, 0))
        durable = None
        if self.config.checkpoint is not None and self.epoch >= 0:
            durable = holder.durable_read()
        return read_state(self.spark, self.state_dir.path, self.config.backend,
                          holder.key_type, owners, schema, update.is_builtin, durable)

    def bin_sizes(self, owners: np.ndarray | None = None) -> BinSizes:
        """Keys and bytes of every bin at its owner under ``owners`` (default: the routing in
        force), as of the last commit. With a checkpoint location the working copies live on
        the executors: a small Spark job (one task per worker) reads them between two epochs
        (a stream's next epoch waits for it; the stores must not move past the commit read)."""
        return self._holder.bin_sizes(owners)

    def bin_load(self) -> np.ndarray:
        """Records per bin per epoch, exponentially smoothed over this process's epochs."""
        return self._driver.bin_load.copy()

    # -- hot keys (docs/hot-keys.md) -----------------------------------------------------

    def watch_hot_keys(self, capacity: int = DEFAULT_CAPACITY) -> None:
        """Detect hot keys: each worker reports its ``capacity`` heaviest keys per epoch
        (metrics ``hot_keys``, ``megaphone inspect``, :meth:`hot_keys`); no key is split."""
        self._driver.hot.watch_hot_keys(capacity)

    def split_hot_keys(self, policy: SplitPolicy | None = None,
                       capacity: int = DEFAULT_CAPACITY) -> None:
        """Detect hot keys and split them (dual mode) as ``policy`` says before every epoch
        (default :class:`~megaphone.plans.hot_keys.ShareThreshold`: keys with >= 20% of the
        records). Only updates that are commutative and associative can be split: the
        built-in aggregations and :class:`~megaphone.operators.combiner.Combiner` updates;
        any other raises ``ValueError`` (its keys stay at their owner: use
        :meth:`watch_hot_keys`)."""
        self._driver.hot.split_hot_keys(policy, capacity)

    def hot_keys(self) -> HeavyHitters:
        """The heaviest keys of the committed epochs (smoothed, per epoch), as committed."""
        return self._driver.hot.hot_keys()


def _open_on_server(spark: SparkSession, state_dir: str, config: PipelineConfig
                    ) -> StreamRunner:
    """Open a pipeline on a Spark Connect server for a stream's batch function
    (:class:`~megaphone.migrator.pipeline.stream_runner.ServerBatch`); its runner serves the
    micro-batches."""
    return Pipeline.from_config(spark, state_dir, config)._runner


__all__ = ["Pipeline"]
