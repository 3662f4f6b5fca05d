"""A pipeline's stream runner (:class:`StreamRunner`; docs/architecture.md, "A Pipeline and its
collaborators"), and over Spark Connect the batch function that runs it on the server
(:class:`ServerBatch`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from megaphone.migrator.epoch.config import PipelineConfig
from megaphone.migrator.epoch.driver import EpochDriver
from megaphone.migrator.epoch.state_holder import StateHolder
from megaphone.migrator.statedir.commit import StreamPosition
from megaphone.migrator.statedir.driver_copy import DriverCopy
from megaphone.migrator.statedir.inbox import PlanInbox, copy_committed
from megaphone.paths import driver_state_path
from megaphone.plans.handle import MigrationHandle
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.policy import MigrationPolicy
from megaphone.routing.table import RoutingTable
from megaphone.spark import is_connect
from megaphone.state_backends.remote import default_local_dir

log = logging.getLogger("megaphone.pipeline")

#: ``sink(outputs, epoch)``: what a stream does with each epoch's outputs.
Sink = Callable[[DataFrame, int], None]
#: ``open(spark, state_dir, config) -> runner``: opens the pipeline of ``config`` in
#: ``state_dir`` on the server; its stream runner serves the micro-batches.
BatchOpener = Callable[[SparkSession, str, PipelineConfig], "StreamRunner"]

#: The runners of pipelines opened by batch functions in this (server-side) process, by run.
_OPEN: dict[str, StreamRunner] = {}


@dataclass(frozen=True)
class ServerBatch:
    """The ``foreachBatch`` function of a pipeline's stream over Spark Connect: runs each
    micro-batch as an epoch of the pipeline opened on the server by ``open``, then
    ``sink(outputs, epoch)`` there. ``config`` is the pipeline's configuration, ``epoch_column``
    start()'s; ``location`` is the query's checkpoint location (a batch id committed before is
    not applied again). Plans the client posted to the checkpoint are taken before each batch,
    and its metrics go into the checkpoint after it, since the client reads them there."""

    config: PipelineConfig
    epoch_column: str | None
    location: str
    sink: Sink
    open: BatchOpener
    run: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        runner = _OPEN.get(self.run)
        if runner is None:  # a state directory per query run: an earlier run's may be locked
            state_dir = driver_state_path(default_local_dir(), self.config.pipeline_id or "",
                                          self.run)
            runner = _OPEN[self.run] = self.open(batch.sparkSession, str(state_dir), self.config)
        runner.take_posted()
        outputs, epoch = runner.run_batch(batch, batch_id, self.location, self.epoch_column)
        runner.holder.flush_metrics()
        self.sink(outputs, epoch)


class StreamRunner:
    """Runs a pipeline (its state ``holder`` and epoch ``driver``) on Structured Streaming: one
    query at a time, started by :meth:`start`. Over Spark Connect the query's batch function
    opens the pipeline on the server with ``open_on_server``; meanwhile this side refuses to
    run epochs (:attr:`on_server`)."""

    def __init__(self, spark: SparkSession, holder: StateHolder, driver: EpochDriver,
                 local_location: str, open_on_server: BatchOpener) -> None:
        self.spark = spark
        self.holder = holder
        self.driver = driver
        self.local_location = local_location
        self.open_on_server = open_on_server
        #: True while a query started by :meth:`start` is running.
        self.running = False
        #: The running query runs this pipeline on a Spark Connect server.
        self.on_server = False
        self._query: Any = None
        self._watcher: threading.Thread | None = None
        self._along: list[StreamRunner] = []  # the other stages of a chain's query

    def start(self, stream: DataFrame, sink: Sink, trigger: dict[str, Any] | None,
              checkpoint_location: str | None, epoch_column: str | None, *,
              run: Callable[[DataFrame, int, str], tuple[DataFrame, int]] | None = None,
              along: Sequence[StreamRunner] = ()) -> Any:
        """Start the query (:meth:`Pipeline.start`); returns the ``StreamingQuery``. A bad
        ``epoch_column`` for the stream's schema is refused now, before the query starts.
        ``run(batch, batch_id, location) -> (outputs, epoch)`` does each micro-batch's work
        instead of this pipeline's epoch (:meth:`run_batch`), and the runners
        ``along`` count as running while the query does: a chain's stream, run by its first
        stage's runner (:meth:`~megaphone.Chain.start`; not over Spark Connect)."""
        if epoch_column is not None:
            self.driver.labelled_schema(stream.schema, epoch_column)
        run_batch = run or functools.partial(self.run_batch, column=epoch_column)
        if is_connect(self.spark):
            location = checkpoint_location
            config = self.step_aside(location)  # refuses a query without a location
            assert location is not None
            on_batch: Sink = ServerBatch(config, epoch_column, location, sink,
                                         self.open_on_server)
        else:
            location = checkpoint_location or self.local_location

            def on_batch(batch_df: DataFrame, batch_id: int) -> None:
                outputs, epoch = run_batch(batch_df, batch_id, location)
                sink(outputs, epoch)

        writer = stream.writeStream.foreachBatch(on_batch).option(
            "checkpointLocation", location
        )
        if trigger:
            writer = writer.trigger(**trigger)
        self._along = list(along)
        self._mark(True)
        try:
            query = writer.start()
        except BaseException:
            self._mark(False)
            if self.on_server:
                self.rejoin()
            raise
        self._query = query
        self._watcher = threading.Thread(target=self._watch, args=(query,), daemon=True)
        self._watcher.start()
        return query

    def stop(self, timeout: float) -> None:
        """Stop the query between two epochs (:meth:`Pipeline.stop`)."""
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

    def _watch(self, query: Any) -> None:
        with contextlib.suppress(Exception):  # the query's error is the user's to see
            query.awaitTermination()
        try:
            if self.on_server:
                self.rejoin()
        except Exception:
            log.exception("the pipeline could not be brought forward from its checkpoint "
                          "after its stream on the Spark Connect server ended")
        finally:
            self._mark(False)

    def _mark(self, running: bool) -> None:
        """Set :attr:`running` of this runner and of those running along with its query."""
        for runner in (self, *self._along):
            runner.running = running

    def run_batch(self, batch: DataFrame, batch_id: int, location: str,
                  column: str | None = None) -> tuple[DataFrame, int]:
        """A stream's micro-batch (``batch_id`` of the query at ``location``) as an epoch, or
        as the epochs of its epoch ``column``'s labels in groups: its outputs (by labels, each
        row with its label) and its last epoch. A batch id the stream committed before is not
        applied again, its kept outputs are read; by labels, a replayed batch applies only its
        labels not committed yet (:meth:`EpochDriver.run
        <megaphone.migrator.epoch.driver.EpochDriver.run>`; docs/groups.md)."""
        holder = self.holder
        with holder.lock:
            stream = holder.commit.stream
            last_id = stream.ran(location)
            again = batch_id <= last_id
            if column is None and again:
                if stream.epochs is not None:  # its outputs are several epochs', by label
                    raise RuntimeError(f"micro-batch {batch_id} of the stream at {location} "
                                       "ran by its epoch column: restart it with the same "
                                       "start(..., epoch_column=)")
                last = holder.epoch if stream.epoch is None else stream.epoch  # offline ran
                epoch = last - (last_id - batch_id)
                return self.driver.read_outputs(epoch), epoch
            if again and (batch_id < last_id or stream.epochs is None):
                raise RuntimeError(
                    f"micro-batch {batch_id} of the stream at {location} is replayed, but the "
                    f"pipeline committed micro-batch {last_id}"
                    + ("" if batch_id < last_id else " without epoch_column")
                    + ": its epochs' outputs cannot be told apart; restart the query as it ran")
        position = stream if again else StreamPosition(location, batch_id)
        _, outputs = self.driver.run(batch, column, want_frame=True, stream=position)
        assert outputs is not None
        # A replay whose labels were all committed before ends at its last committed epoch.
        done = holder.commit.stream.epoch_list() if again else []
        return outputs, done[-1] if done else holder.epoch

    # -- Spark Connect -------------------------------------------------------------------

    def step_aside(self, location: str | None) -> PipelineConfig:
        """Step aside for a stream over Spark Connect; the configuration the batch function
        opens the pipeline with on the server (:class:`ServerBatch`):
        the state directory's, with the server's own ``local_dir``."""
        config = self.holder.config
        if config.checkpoint is None or location is None:
            raise ValueError(
                "over Spark Connect, start() runs the pipeline on the server: it needs the "
                "pipeline's checkpoint location (Pipeline(..., checkpoint=URI)) and a "
                "checkpoint_location for the query, both reachable from the server")
        self.holder.step_aside()  # the server opens the stores and writes the checkpoint
        self.on_server = True
        return dataclasses.replace(config, local_dir=None)

    def rejoin(self) -> None:
        """Bring the pipeline forward from the checkpoint after its stream ran on the server,
        and take the plans posted there that the server did not."""
        with self.holder.lock:  # a plan is posted under it (:meth:`post_plan`)
            self.holder.rejoin()
            self.take_posted()
            self.on_server = False

    def post_plan(self, plan: MigrationPlan, policy: MigrationPolicy | None
                  ) -> MigrationHandle | None:
        """While the stream runs this pipeline on the server, post ``plan`` to it through the
        checkpoint (:mod:`~megaphone.migrator.statedir.inbox`) and return its handle;
        ``None`` when this side runs the pipeline (submit it here)."""
        with self.holder.lock:
            if not self.on_server:
                return None
            if policy is not None or plan.adaptive:
                raise PlanError("an adaptive plan cannot be posted to a pipeline running on a "
                                "Spark Connect server: submit it before start(), or stop() the "
                                "stream first")
            assert self.holder.config.checkpoint is not None
            copy = DriverCopy(self.holder.config.checkpoint)
            return PlanInbox(copy).post(plan, lambda: copy_committed(copy))

    def committed_routing(self) -> RoutingTable:
        """The routing table as of the last commit in the checkpoint (the server's, while the
        stream runs this pipeline there)."""
        assert self.holder.config.checkpoint is not None
        return copy_committed(DriverCopy(self.holder.config.checkpoint))[1]

    def take_posted(self) -> None:
        """Submit the plans posted to the checkpoint's inbox, between two epochs."""
        holder = self.holder
        with holder.lock:
            state = holder.state
            if state is not None and state.durable is not None and holder.queue is not None:
                PlanInbox(state.durable).take(holder.queue.to_list(), holder.submit_plan)
