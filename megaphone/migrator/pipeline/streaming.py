"""A pipeline on Structured Streaming: each micro-batch is an epoch, run by ``foreachBatch``.

Locally the batch function runs the pipeline's epoch in this process. Over Spark Connect it runs
on the server (:mod:`megaphone.migrator.pipeline.connect`): the pipeline steps aside while the
query runs and is brought forward from its checkpoint location when the query ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from megaphone.migrator.epoch.config import PipelineConfig
from megaphone.migrator.pipeline.connect import BatchOpener, ServeBatch, ServerBatch
from megaphone.spark import is_connect

log = logging.getLogger("megaphone.pipeline")

#: ``sink(outputs, epoch)``: what a stream does with each epoch's outputs.
Sink = Callable[[DataFrame, int], None]


class Stream:
    """The streaming query of one pipeline (at most one at a time).

    ``run_batch`` runs a micro-batch as an epoch here; ``local_location`` is the query's
    default checkpoint location. Over Spark Connect, ``step_aside(location)`` releases the
    pipeline to the server and returns its configuration, ``open_on_server`` opens it there
    (running each micro-batch by ``epoch_column`` if given), and ``rejoin()`` brings it
    forward from the checkpoint when the query ends.
    """

    def __init__(self, spark: SparkSession, run_batch: ServeBatch, local_location: str,
                 step_aside: Callable[[str | None], PipelineConfig],
                 open_on_server: BatchOpener, rejoin: Callable[[], None],
                 epoch_column: str | None = None) -> None:
        self.spark = spark
        self.run_batch = run_batch
        self.local_location = local_location
        self.step_aside = step_aside
        self.open_on_server = open_on_server
        self.rejoin = rejoin
        self.epoch_column = epoch_column
        #: True while a query is running.
        self.running = False
        self._on_server = False  # the running query runs the pipeline on a Connect server
        self._query: Any = None
        self._watcher: threading.Thread | None = None

    def start(self, stream: DataFrame, sink: Sink, trigger: dict[str, Any] | None,
              checkpoint_location: str | None) -> Any:
        """Start the query (:meth:`Pipeline.start`); returns the ``StreamingQuery``."""
        if is_connect(self.spark):
            location = checkpoint_location
            config = self.step_aside(location)  # refuses a query without a location
            assert location is not None
            self._on_server = True
            on_batch: Sink = ServerBatch(config, self.epoch_column, location, sink,
                                         self.open_on_server)
        else:
            location = checkpoint_location or self.local_location

            def on_batch(batch_df: DataFrame, batch_id: int) -> None:
                outputs, epoch = self.run_batch(batch_df, batch_id, location)
                sink(outputs, epoch)

        writer = stream.writeStream.foreachBatch(on_batch).option(
            "checkpointLocation", location
        )
        if trigger:
            writer = writer.trigger(**trigger)
        self.running = True
        try:
            query = writer.start()
        except BaseException:
            self.running = False
            if self._on_server:
                self._rejoin()
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

    def _rejoin(self) -> None:
        self.rejoin()
        self._on_server = False

    def _watch(self, query: Any) -> None:
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
                self.running = False
