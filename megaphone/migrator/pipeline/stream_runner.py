"""A pipeline's stream runner (:class:`StreamRunner`): its Structured Streaming query, each
micro-batch run as an epoch (or as the epochs of its epoch column) with the replay of a batch
committed before, and over Spark Connect the hand-off of the pipeline to the server and back.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from megaphone.migrator.epoch.config import PipelineConfig
from megaphone.migrator.epoch.driver import EpochDriver
from megaphone.migrator.epoch.groups import concat, labelled
from megaphone.migrator.epoch.labels import EpochLabels, scan_labels
from megaphone.migrator.epoch.state_holder import StateHolder
from megaphone.migrator.pipeline.connect import BatchOpener, ServeBatch
from megaphone.migrator.pipeline.streaming import Sink, Stream
from megaphone.migrator.statedir.commit import StreamPosition


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
        self.stream: Stream | None = None  # the query started by start()
        #: A stream runs this pipeline on a Spark Connect server.
        self.on_server = False

    @property
    def running(self) -> bool:
        """True while a query started by :meth:`start` is running."""
        return self.stream is not None and self.stream.running

    def start(self, stream: DataFrame, sink: Sink, trigger: dict[str, Any] | None,
              checkpoint_location: str | None, epoch_column: str | None) -> Any:
        """Start the query (:meth:`Pipeline.start`); a bad ``epoch_column`` for the stream's
        schema is refused now, before the query starts."""
        if epoch_column is None:
            run_batch: ServeBatch = self.run_batch
        else:
            self.driver.labelled_schema(stream.schema, epoch_column)
            run_batch = functools.partial(self.run_stream_epochs, column=epoch_column)
        self.stream = Stream(self.spark, run_batch, self.local_location, self.step_aside,
                             self.open_on_server, self.rejoin, epoch_column)
        return self.stream.start(stream, sink, trigger, checkpoint_location)

    def stop(self, timeout: float) -> None:
        """Stop the query between two epochs (:meth:`Pipeline.stop`)."""
        if self.stream is not None:
            self.stream.stop(timeout)
            self.stream = None

    def run_batch(self, batch: DataFrame, batch_id: int, location: str
                  ) -> tuple[DataFrame, int]:
        """A stream's micro-batch as an epoch: its outputs and epoch; a batch id the stream at
        ``location`` committed before is not applied again, its stored outputs are read."""
        holder = self.holder
        with holder.lock:
            stream = holder.commit.stream
            if batch_id <= stream.ran(location):
                if stream.epochs is not None:  # its outputs are several epochs', by label
                    raise RuntimeError(f"micro-batch {batch_id} of the stream at {location} "
                                       "ran by its epoch column: restart it with the same "
                                       "start(..., epoch_column=)")
                last = holder.epoch if stream.epoch is None else stream.epoch  # offline ran
                epoch = last - (stream.ran(location) - batch_id)
                return self.driver.read_outputs(epoch), epoch
            _, frame = self.driver.run_one(batch, StreamPosition(location, batch_id),
                                           want_frame=True)
            assert frame is not None
            return frame, holder.epoch

    def run_stream_epochs(self, batch: DataFrame, batch_id: int, location: str, column: str
                          ) -> tuple[DataFrame, int]:
        """A stream's micro-batch (``batch_id`` of the query at ``location``) as the epochs of
        its epoch ``column``'s labels, in groups: all their outputs (each row with its label)
        and the batch's last epoch. A replayed batch applies only its labels not committed yet;
        those committed are read from the kept outputs (docs/groups.md)."""
        holder, driver = self.holder, self.driver
        schema = driver.labelled_schema(batch.schema, column)
        with holder.lock:
            stream = holder.commit.stream
            last_id = stream.ran(location)
            again = batch_id <= last_id
            if again and (batch_id < last_id or stream.epochs is None):
                raise RuntimeError(
                    f"micro-batch {batch_id} of the stream at {location} is replayed, but the "
                    f"pipeline committed micro-batch {last_id}"
                    + ("" if batch_id < last_id else " without epoch_column")
                    + ": its epochs' outputs cannot be told apart; restart the query as it ran")
            label = holder.commit.label
            found = scan_labels(batch, column, driver.event_times(batch),
                                None if again else label)
            done = stream.epoch_list() if again else []
            if done and (len(done) > len(found.labels) or found.labels[len(done) - 1] != label):
                raise RuntimeError(
                    f"micro-batch {batch_id} is replayed with other labels than it ran with "
                    f"(its {len(done)} committed epochs end at label {label}; the "
                    f"replay holds {list(found.labels[:len(done)])[-3:]} there): the stream's "
                    "source must replay a micro-batch alike")
            tables = [labelled(holder.state_dir.read_outputs(e), column, label)
                      for e, label in zip(done, found.labels, strict=False)]
            rest = EpochLabels(found.labels[len(done):], found.max_event_times[len(done):])
            position = stream if again else StreamPosition(location, batch_id)
        tables += driver.run_groups(batch, column, rest, None, position)
        table = concat(tables, schema)
        last = holder.epoch if rest.labels or not done else done[-1]
        return self._frame(table, schema), last

    def _frame(self, table: Any, schema: T.StructType) -> DataFrame:
        return self.spark.createDataFrame(table if table.num_rows else [], schema=schema)

    # -- Spark Connect -------------------------------------------------------------------

    def step_aside(self, location: str | None) -> PipelineConfig:
        """Step aside for a stream over Spark Connect; the configuration the batch function
        opens the pipeline with on the server (:mod:`megaphone.migrator.pipeline.connect`):
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

    def serve_batch(self, batch: DataFrame, batch_id: int, location: str,
                    epoch_column: str | None = None) -> tuple[DataFrame, int]:
        """A stream's micro-batch on the Spark Connect server (as the epochs of its
        ``epoch_column``'s labels if given); its metrics go into the checkpoint now, since the
        client reads them there."""
        if epoch_column is not None:
            outputs, epoch = self.run_stream_epochs(batch, batch_id, location, epoch_column)
        else:
            outputs, epoch = self.run_batch(batch, batch_id, location)
        self.holder.flush_metrics()
        return outputs, epoch

    def rejoin(self) -> None:
        """Bring the pipeline forward from the checkpoint after its stream ran on the server."""
        self.holder.rejoin()
        self.on_server = False
