"""Read a pipeline's whole state as a Spark DataFrame, one task per worker, read-only."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from megaphone.migrator.epoch.schemas import arrow_type
from megaphone.migrator.statedir.commit import Commit
from megaphone.migrator.statedir.directory import StateDir, StateDirLocked
from megaphone.paths import StateDirPaths, local_stores_path, local_worker_path
from megaphone.plans.planner import BinSizes
from megaphone.state_backends import DEFAULT_CHUNK_BYTES, open_backend
from megaphone.state_backends.durable import SNAPSHOT_EVERY
from megaphone.state_backends.kv_batches import kv_columns, state_rows
from megaphone.state_backends.remote import (
    DurableSpec,
    RemoteStore,
    default_local_dir,
    release_stores,
)


def _per_worker(spark: SparkSession, workers: list[int],
                read: Callable[[int], Iterator[pa.RecordBatch]], schema: Any) -> DataFrame:
    """What ``read(worker)`` yields for each of ``workers``, one task per worker."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for w in batch.column("id").to_pylist():
                yield from read(w)

    ids = spark.createDataFrame([(w,) for w in workers], "id long")
    return ids.repartition(max(1, len(workers))).mapInArrow(task, schema)


def bins_by_owner(owners: np.ndarray) -> dict[int, list[int]]:
    """The bins each worker of ``owners`` owns, by worker in increasing order."""
    return {int(w): np.flatnonzero(owners == w).tolist() for w in np.unique(owners)}


def read_state(spark: SparkSession, root: Path, backend: str, key_type: str, owners: np.ndarray,
               schema: T.StructType, decoded: bool, durable: DurableRead | None = None
               ) -> DataFrame:
    """The ``(key, state)`` of every bin at its owner in ``owners`` (one routing version).

    ``decoded``: the values are plain numbers (built-in aggregations); otherwise they are
    returned as msgpack bytes. Only the owners' bins are read, never stale copies. With a
    ``durable`` copy, each owner's state is read through its host's store service, which
    first restores a working copy that is missing or behind the committed epoch.
    """
    bins_of = bins_by_owner(owners)
    arrow_schema = pa.schema([(f.name, arrow_type(f.dataType)) for f in schema])
    paths = StateDirPaths(root)

    def read(w: int) -> Iterator[pa.RecordBatch]:
        if durable is not None:
            for chunk in durable.store(w).export(bins_of[w], DEFAULT_CHUNK_BYTES, durable.epoch,
                                                 durable.epoch + 1, durable.run):
                yield state_rows(arrow_schema, key_type, *kv_columns(chunk), decoded)
        elif paths.worker(w).exists():
            with open_backend(backend, paths.worker(w), key_type, len(owners),
                              read_only=True) as state:
                for chunk in state.export_bins(bins_of[w]):
                    yield state_rows(arrow_schema, key_type, *kv_columns(chunk), decoded)

    return _per_worker(spark, sorted(bins_of), read, schema)


@dataclass(frozen=True)
class DurableRead:
    """How a read reaches a pipeline with a checkpoint location: its store services'
    directory, the checkpoint, its snapshot interval, the committed epoch to read, the
    pipeline, the driver's run (what another run applied past the commit is rolled back),
    the tokens of the workers' attempts the commit took, and the stores' backend, key type
    and bins."""

    local_dir: str
    uri: str
    snapshot_every: int
    epoch: int
    pipeline_id: str
    run: str
    committed_tokens: dict[int, str]
    backend: str
    key_type: str
    num_bins: int

    @classmethod
    def at(cls, state: StateDir, commit: Commit, local_dir: str, run: str) -> DurableRead:
        """How run ``run`` reads ``state``'s working copies as of ``commit``."""
        fp, manifest = state.fingerprint, state.manifest
        return cls(local_dir, manifest["checkpoint"],
                   manifest.get("snapshot_every", SNAPSHOT_EVERY), commit.epoch,
                   fp.pipeline_id, run, commit.worker_tokens(),
                   manifest.get("backend", "rocksdb"), fp.key_type, fp.num_bins)

    def store(self, worker: int) -> RemoteStore:
        """Worker ``worker``'s working copy on this host, through its store service."""
        path = local_worker_path(self.local_dir, self.pipeline_id, worker)
        return RemoteStore(self.local_dir, str(path), self.backend, self.key_type, self.num_bins,
                           worker, DurableSpec(self.uri, worker, self.snapshot_every,
                                               self.committed_tokens.get(worker, "")))

    def stats(self, worker: int) -> dict[int, tuple[int, int]]:
        """``{bin: (keys, bytes)}`` of worker ``worker``'s working copy as of :attr:`epoch`."""
        stats = self.store(worker).stats(self.epoch, self.epoch + 1, self.run)
        return {b: (k, n) for b, k, n in stats}


def read_bin_stats(spark: SparkSession, durable: DurableRead, owners: np.ndarray
                   ) -> dict[int, dict[int, tuple[int, int]]]:
    """Per worker, ``{bin: (keys, bytes)}`` of the non-empty bins it owns in ``owners``, read
    from the working copies on the executors (restored first where missing or behind)."""
    owned = {w: set(bins) for w, bins in bins_by_owner(owners).items()}

    def read(w: int) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist(
            [{"worker": w, "bin": b, "keys": k, "bytes": n}
             for b, (k, n) in durable.stats(w).items() if b in owned[w]],
            schema=pa.schema([(name, pa.int64()) for name in ("worker", "bin", "keys", "bytes")]))

    out: dict[int, dict[int, tuple[int, int]]] = {}
    rows = _per_worker(spark, sorted(owned), read, "worker long, bin long, keys long, bytes long")
    for row in rows.toArrow().to_pylist():
        out.setdefault(row["worker"], {})[row["bin"]] = (row["keys"], row["bytes"])
    return out


def bin_sizes(state: StateDir, owners: np.ndarray) -> BinSizes:
    """Per-bin keys and bytes of ``state`` (:meth:`BinSizes.at` ``owners``), read read-only from
    every worker's backend, changing no file of the state directory; with a checkpoint location,
    of a stopped pipeline (:func:`durable_bin_stats`)."""
    if state.manifest.get("checkpoint") is not None:
        return BinSizes.at(durable_bin_stats(state), owners)
    return BinSizes.at(worker_bin_stats(state), owners)


def worker_bin_stats(state: StateDir) -> dict[int, dict[int, tuple[int, int]]]:
    """``{worker: {bin: (keys, bytes)}}`` of a state directory without a checkpoint location,
    read read-only from every worker's backend."""
    fp = state.fingerprint
    kind = state.manifest.get("backend", "rocksdb")
    per_worker: dict[int, dict[int, tuple[int, int]]] = {}
    for w in state.worker_ids():
        with open_backend(kind, state.paths.worker(w), fp.key_type, fp.num_bins,
                          read_only=True) as backend:
            per_worker[w] = {b: (s.keys, s.bytes) for b, s in backend.bin_stats().items()}
    return per_worker


def durable_bin_stats(state: StateDir) -> dict[int, dict[int, tuple[int, int]]]:
    """``{worker: {bin: (keys, bytes)}}`` of a stopped checkpointed pipeline as of its last
    commit, read in this process through this host's store service (a working copy missing
    or behind is restored from the durable copy first, as recovery does). The state
    directory's lock is held meanwhile (a running pipeline's is refused: read it with
    ``Pipeline.bin_sizes``), and the stores are left closed, as a stopped pipeline's."""
    commit = state.read_commit()
    if commit.epoch < 0:
        return {}  # nothing committed yet: every bin is empty
    held = state.locked
    try:
        state.lock()
    except StateDirLocked:
        raise StateDirLocked(
            f"{state.path} is open in a running pipeline and keeps its workers' state on its "
            "hosts: read its bin sizes from it (Pipeline.bin_sizes, or rescale(pipeline, ...)) "
            "or stop it first") from None
    local_dir = default_local_dir()
    read = DurableRead.at(state, commit, local_dir, uuid.uuid4().hex)
    release_local_stores(state, local_dir)  # a crashed pipeline's, if still open
    try:
        # the workers the commit knows: one that gave away its last bins has left it (its
        # durable copy is gone), and one a plan adds holds nothing until an epoch gives it bins
        return {w: read.stats(w) for w in sorted(commit.worker_tokens())}
    finally:
        release_local_stores(state, local_dir)
        if not held:
            state.unlock()


def release_local_stores(state: StateDir, local_dir: str) -> None:
    """Close ``state``'s stores in this host's store service: the working copies under the
    state directory, and with a checkpoint location this host's copies under ``local_dir``."""
    release_stores(local_dir, str(state.path))
    if state.manifest.get("checkpoint") is not None:
        release_stores(local_dir, str(local_stores_path(local_dir, state.fingerprint.pipeline_id)))
