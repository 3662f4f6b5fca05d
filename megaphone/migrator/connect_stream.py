"""Structured Streaming over Spark Connect: the batch function opens the pipeline on the server.

Over Spark Connect, ``foreachBatch`` runs its function in a Python process on the server, away
from the client that holds the pipeline. So the function carries the pipeline's settings, not
the pipeline: at its first batch it opens the pipeline on the server from the checkpoint
location (the driver's copy, :mod:`megaphone.migrator.driver_copy`), in a state directory of
its own, and keeps it for the query's life. The client's pipeline steps aside while the query
runs, and is brought forward from the checkpoint when it stops (:class:`ServerHandoff`).
"""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from megaphone.migrator.driver_copy import DriverCopy
from megaphone.migrator.statedir import StateDir
from megaphone.paths import driver_state_path
from megaphone.state_backends.remote import default_local_dir

#: ``run(batch, batch_id, location) -> (outputs, epoch)``: one micro-batch run as an epoch of
#: a pipeline (the client's own, or on a Connect server the one opened there, whose metrics are
#: in the checkpoint when it returns).
ServeBatch = Callable[[DataFrame, int, str], tuple[DataFrame, int]]
#: ``open(spark, state_dir, settings) -> serve``: opens the pipeline (``settings`` are its
#: keyword arguments) in ``state_dir`` on the server.
BatchOpener = Callable[[SparkSession, str, dict[str, Any]], ServeBatch]

#: Pipelines opened by batch functions in this (server-side) process, by query run.
_OPEN: dict[str, ServeBatch] = {}


@dataclass(frozen=True)
class ServerBatch:
    """The ``foreachBatch`` function of a pipeline's stream over Spark Connect: runs each
    micro-batch as an epoch of the pipeline opened on the server by ``open``, then
    ``sink(outputs, epoch)`` there. ``settings`` are the pipeline's keyword arguments;
    ``location`` is the query's checkpoint location (a batch id committed before is not
    applied again)."""

    settings: dict[str, Any]
    location: str
    sink: Callable[[DataFrame, int], None]
    open: BatchOpener
    run: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        serve = _OPEN.get(self.run)
        if serve is None:  # a state directory per query run: an earlier run's may be locked
            state_dir = driver_state_path(default_local_dir(), self.settings["pipeline_id"],
                                          self.run)
            serve = _OPEN[self.run] = self.open(batch.sparkSession, str(state_dir), self.settings)
        outputs, epoch = serve(batch, batch_id, self.location)
        self.sink(outputs, epoch)


class ServerHandoff:
    """How a pipeline hands itself to a Spark Connect server for a stream and takes itself back:
    a base of :class:`~megaphone.migrator.pipeline.Pipeline`, which holds the attributes
    declared here and opens, checks and runs the pipeline (``fingerprint``, ``_open``,
    ``_check_restore``, ``_release_stores``, ``_flush_metrics``, ``_run_batch``,
    ``_run_stream_epochs``)."""

    key: str
    value: str | None
    event_time: str | None
    chunk_bytes: int
    transfer: str
    keep_outputs: int
    _update_arg: Any
    _output_type_arg: str
    _num_bins: int
    _settings: dict[str, Any]
    _state: StateDir | None
    _path: Path
    _lock: threading.RLock
    _metrics: collections.deque[dict[str, Any]]
    _on_server: bool
    _group_size: int | str

    def _step_aside(self, location: str | None) -> dict[str, Any]:
        """Step aside for a stream over Spark Connect; the settings the batch function opens
        the pipeline with on the server (:mod:`megaphone.migrator.connect_stream`)."""
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
                    "chunk_bytes": self.chunk_bytes, "transfer": self.transfer,
                    "keep_outputs": self.keep_outputs,
                    "checkpoint": self._settings["checkpoint"],
                    "snapshot_every": self._settings["snapshot_every"],
                    "group_size": self._group_size}
        with self._lock:  # the server opens the stores and writes the checkpoint from now on
            self._release_stores(self._state)
            self._state.unlock()
            self._on_server = True
        return settings

    def _serve_batch(self, batch: DataFrame, batch_id: int, location: str,
                     epoch_column: str | None = None) -> tuple[DataFrame, int]:
        """A stream's micro-batch on the Spark Connect server (as the epochs of its
        ``epoch_column``'s labels if given); its metrics go into the checkpoint now, since the
        client reads them there."""
        if epoch_column is not None:
            outputs, epoch = self._run_stream_epochs(batch, batch_id, location, epoch_column)
        else:
            outputs, epoch = self._run_batch(batch, batch_id, location)
        self._flush_metrics()
        return outputs, epoch

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
