"""Structured Streaming over Spark Connect: the batch function opens the pipeline on the server.

Over Spark Connect, ``foreachBatch`` runs its function in a Python process on the server, away
from the client that holds the pipeline. So the function carries the pipeline's configuration
(:class:`~megaphone.migrator.epoch.config.PipelineConfig`), not the pipeline: at its first
batch it opens the pipeline on the server from the checkpoint location (the driver's copy,
:mod:`megaphone.migrator.statedir.driver_copy`), in a state directory of its own, and keeps
it for the query's life. The client's pipeline steps aside while the query runs, and is
brought forward from the checkpoint when it stops
(:class:`~megaphone.migrator.pipeline.stream_runner.StreamRunner`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession

from megaphone.migrator.epoch.config import PipelineConfig
from megaphone.paths import driver_state_path
from megaphone.state_backends.remote import default_local_dir

#: ``run(batch, batch_id, location) -> (outputs, epoch)``: one micro-batch run as an epoch of
#: a pipeline (the client's own, or on a Connect server the one opened there, whose metrics are
#: in the checkpoint when it returns).
ServeBatch = Callable[[DataFrame, int, str], tuple[DataFrame, int]]
#: ``open(spark, state_dir, config, epoch_column) -> serve``: opens the pipeline of ``config``
#: in ``state_dir`` on the server, to run each micro-batch by ``epoch_column`` if not ``None``.
BatchOpener = Callable[[SparkSession, str, PipelineConfig, str | None], ServeBatch]

#: Pipelines opened by batch functions in this (server-side) process, by query run.
_OPEN: dict[str, ServeBatch] = {}


@dataclass(frozen=True)
class ServerBatch:
    """The ``foreachBatch`` function of a pipeline's stream over Spark Connect: runs each
    micro-batch as an epoch of the pipeline opened on the server by ``open``, then
    ``sink(outputs, epoch)`` there. ``config`` is the pipeline's configuration, ``epoch_column``
    start()'s; ``location`` is the query's checkpoint location (a batch id committed before is
    not applied again)."""

    config: PipelineConfig
    epoch_column: str | None
    location: str
    sink: Callable[[DataFrame, int], None]
    open: BatchOpener
    run: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        serve = _OPEN.get(self.run)
        if serve is None:  # a state directory per query run: an earlier run's may be locked
            state_dir = driver_state_path(default_local_dir(), self.config.pipeline_id or "",
                                          self.run)
            serve = _OPEN[self.run] = self.open(batch.sparkSession, str(state_dir), self.config,
                                                self.epoch_column)
        outputs, epoch = serve(batch, batch_id, self.location)
        self.sink(outputs, epoch)
