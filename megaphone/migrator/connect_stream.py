"""Structured Streaming over Spark Connect: the batch function opens the pipeline on the server.

Over Spark Connect, ``foreachBatch`` runs its function in a Python process on the server, away
from the client that holds the pipeline. So the function carries the pipeline's settings, not
the pipeline: at its first batch it opens the pipeline on the server from the checkpoint
location (the driver's copy, :mod:`megaphone.migrator.driver_copy`), in a state directory of
its own, and keeps it for the query's life. The client's pipeline steps aside while the query
runs, and is brought forward from the checkpoint when it stops.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame

#: Pipelines opened by batch functions in this (server-side) process, by query run.
_OPEN: dict[str, Any] = {}


@dataclass(frozen=True)
class ServerBatch:
    """The ``foreachBatch`` function of a pipeline's stream over Spark Connect: runs each
    micro-batch as an epoch of the pipeline opened on the server, then ``sink(outputs, epoch)``
    there. ``settings`` are the pipeline's keyword arguments; ``location`` is the query's
    checkpoint location (a batch id committed before is not applied again)."""

    settings: dict[str, Any]
    location: str
    sink: Callable[[DataFrame, int], None]
    run: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from megaphone.migrator.pipeline import Pipeline
        from megaphone.state_backends.remote import default_local_dir

        pipe = _OPEN.get(self.run)
        if pipe is None:  # a state directory per query run: an earlier run's may be locked
            state_dir = os.path.join(default_local_dir(), "drivers",
                                     f"{self.settings['pipeline_id']}-{self.run}")
            pipe = _OPEN[self.run] = Pipeline(batch.sparkSession, state_dir, **self.settings)
        outputs, epoch = pipe._run_batch(batch, batch_id, self.location)
        with pipe._lock:  # the epoch's metrics into the checkpoint now: the client reads them
            durable = pipe.state_dir.durable
            if durable is not None and durable.has_pending_metrics:
                pipe.state_dir.write_commit(pipe._commit)
        self.sink(outputs, epoch)
