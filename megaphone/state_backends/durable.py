"""A worker's durable copy: what it changed at each epoch, and now and then all of its state.

The working store (RocksDB) lives where the worker runs; the durable copy lives under a
*checkpoint location*, a URI on any filesystem ``pyarrow.fs`` reaches (a local path, HDFS, S3,
GCS …), and is made of LZ4-compressed Arrow IPC files, never RocksDB files:

* ``workers/wNNNNN/changelog/eEEEEEEEEEEE.arrow`` -- one per epoch the worker applied: the bins
  it dropped, then the ``(k, v)`` rows it installed and wrote (``v`` null = a delete), and the
  epoch it followed (``prev``: the worker's previous epoch, ``-1`` for an empty store);
* ``workers/wNNNNN/snapshot/eEEEEEEEEEEE.arrow`` -- every ``snapshot_every`` epochs, all of the
  worker's ``(k, v)`` rows after that epoch.

Restoring epoch ``E`` follows the ``prev`` links back from ``E``'s changelog to a snapshot or
to an empty store, then replays forward; a missing link is an error, never a silently short
state. A changelog is written before the worker's own commit, so an epoch's changes are durable
before the driver's commit point. Files of epochs that were rolled back are deleted, and a
snapshot is only pruned with what it superseded once a newer one exists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from megaphone.errors import MegaphoneError
from megaphone.paths import (
    CHANGELOG,
    SNAPSHOT,
    checkpoint_durable_file,
    checkpoint_owner_path,
    checkpoint_worker_root,
    durable_epoch_of,
)

#: Rows of changelogs and snapshots: raw key and value bytes (a null value deletes the key).
ROW_SCHEMA = pa.schema([("k", pa.binary()), ("v", pa.binary())])
#: Durable files are LZ4-compressed Arrow IPC: 1.35x smaller than plain IPC in
#: ``bench/durability.py`` (random keys, msgpack counts), and restore got 1.4x faster.
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")
#: Default number of a worker's epochs between two snapshots.
SNAPSHOT_EVERY = 50


class DurableCopyError(MegaphoneError, RuntimeError):
    """A durable copy that cannot give the requested epoch (missing or corrupt files)."""


@dataclass(frozen=True)
class Restored:
    """What a restore read: the snapshot it started from and the changelogs it replayed;
    ``since`` is the epoch of the working copy it caught up (``None``: rebuilt from empty)."""

    epoch: int
    snapshot: int | None
    changelogs: int
    rows: int
    since: int | None = None


class DurableCopy:
    """Worker ``worker``'s changelogs and snapshots under the checkpoint location ``uri``."""

    def __init__(self, uri: str, worker: int, snapshot_every: int = SNAPSHOT_EVERY) -> None:
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self.uri = uri
        self.worker = worker
        self.snapshot_every = snapshot_every
        self.fs, root = filesystem(uri)
        self.root = checkpoint_worker_root(root, worker)
        for kind in (CHANGELOG, SNAPSHOT):
            self.fs.create_dir(f"{self.root}/{kind}", recursive=True)
        self.changelogs: list[int] = []
        self.snapshots: list[int] = []
        self.refresh()

    def refresh(self) -> None:
        """List the files again (another host may have written the worker's later epochs)."""
        self.changelogs = self._list(CHANGELOG)
        self.snapshots = self._list(SNAPSHOT)

    def _list(self, kind: str) -> list[int]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{kind}",
                                                        allow_not_found=True))
        return sorted(e for info in infos if (e := durable_epoch_of(info.base_name)) is not None)

    def _path(self, kind: str, epoch: int) -> str:
        return checkpoint_durable_file(self.root, kind, epoch)

    # -- writing -----------------------------------------------------------------------------

    def record(self, epoch: int, prev: int, drops: Sequence[int],
               rows: Iterable[pa.RecordBatch], token: str = "") -> None:
        """Write epoch ``epoch``'s changelog: ``drops`` first, then ``rows`` in order;
        ``token`` names this application of the epoch (see :meth:`plan_restore`).

        Files of ``epoch`` or later (left by attempts that were rolled back, here or on another
        host) go first.
        """
        self.refresh()
        self.forget_from(epoch)
        meta = {"epoch": epoch, "prev": prev, "drops": sorted(set(drops)), "token": token}
        self._write(CHANGELOG, epoch, meta, rows)
        self.changelogs.append(epoch)

    def snapshot_due(self, epoch: int) -> bool:
        """True when ``epoch`` is ``snapshot_every`` changelogs past the last snapshot."""
        last = self.snapshots[-1] if self.snapshots else -1
        return sum(1 for e in self.changelogs if last < e <= epoch) >= self.snapshot_every

    def write_snapshot(self, epoch: int, rows: Iterable[pa.RecordBatch], token: str = ""
                       ) -> None:
        """Write all state after ``epoch`` (the application ``token``); then prune what the
        snapshot before it superseded.

        The previous snapshot and the changelogs after it stay: ``epoch`` itself is not
        committed by the driver yet, and restoring ``epoch - 1`` must remain possible.
        """
        self._write(SNAPSHOT, epoch, {"epoch": epoch, "token": token}, rows)
        self.snapshots.append(epoch)
        if len(self.snapshots) > 2:
            keep_from = self.snapshots[-2]
            for old in self.snapshots[:-2]:
                self.fs.delete_file(self._path(SNAPSHOT, old))
            for old in [e for e in self.changelogs if e <= keep_from]:
                self.fs.delete_file(self._path(CHANGELOG, old))
            self.snapshots = self.snapshots[-2:]
            self.changelogs = [e for e in self.changelogs if e > keep_from]

    def forget_from(self, epoch: int) -> None:
        """Delete changelogs and snapshots of ``epoch`` and later (a rolled-back epoch)."""
        for kind, epochs in ((CHANGELOG, self.changelogs), (SNAPSHOT, self.snapshots)):
            for e in [e for e in epochs if e >= epoch]:
                self.fs.delete_file(self._path(kind, e))
                epochs.remove(e)

    def destroy(self) -> None:
        """Delete the worker's whole durable copy (it left the pipeline without bins)."""
        self.fs.delete_dir_contents(self.root, missing_dir_ok=True)
        self.changelogs, self.snapshots = [], []

    def _write(self, kind: str, epoch: int, meta: dict, rows: Iterable[pa.RecordBatch]) -> None:
        schema = ROW_SCHEMA.with_metadata({"megaphone": json.dumps(meta)})
        path = self._path(kind, epoch)
        tmp = f"{path}.tmp"
        with self.fs.open_output_stream(tmp) as sink, \
                pa.ipc.new_file(sink, schema, options=_WRITE_OPTIONS) as writer:
            for batch in rows:
                if batch.num_rows:
                    writer.write_batch(pa.record_batch(
                        [batch.column(0).cast(pa.binary()), batch.column(1).cast(pa.binary())],
                        schema=schema))
        _sync_if_local(self.fs, tmp)
        self.fs.move(tmp, path)  # readers never see a torn file (on S3 a copy: still whole)

    # -- reading -----------------------------------------------------------------------------

    def _read(self, kind: str, epoch: int) -> tuple[dict, pa.ipc.RecordBatchFileReader]:
        path = self._path(kind, epoch)
        try:
            source = self.fs.open_input_file(path)
            reader = pa.ipc.open_file(source)
            meta = json.loads(reader.schema.metadata[b"megaphone"])
        except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError) as exc:
            raise DurableCopyError(f"{kind} of epoch {epoch} of worker {self.worker} at "
                                   f"{self.uri} is missing or corrupt: {exc}") from None
        if meta.get("epoch") != epoch or reader.schema.remove_metadata() != ROW_SCHEMA:
            raise DurableCopyError(f"{kind} at {path} does not hold epoch {epoch}'s rows")
        return meta, reader

    def plan_restore(self, epoch: int, token: str = "") -> tuple[int | None, list[int]]:
        """The snapshot (or ``None``: an empty store) and the changelogs, in order, that make
        up the worker's state after ``epoch``; a :class:`DurableCopyError` if a link is gone,
        or if ``token`` (the application of ``epoch`` the driver committed) is given and the
        copy holds another one (an attempt that lost, written after the one that won)."""
        self.refresh()
        chain: list[int] = []
        at = epoch
        while True:
            if at in self.snapshots:
                if at == epoch:
                    self._check_token(self._read(SNAPSHOT, at)[0], token)
                return at, chain[::-1]
            if at not in self.changelogs:
                raise DurableCopyError(
                    f"the durable copy of worker {self.worker} at {self.uri} has no changelog "
                    f"or snapshot of epoch {at}, needed to restore epoch {epoch}")
            meta, _ = self._read(CHANGELOG, at)
            if at == epoch:
                self._check_token(meta, token)
            chain.append(at)
            prev = int(meta["prev"])
            if prev < 0:
                return None, chain[::-1]
            if prev >= at:
                raise DurableCopyError(f"changelog of epoch {at} of worker {self.worker} "
                                       f"follows epoch {prev}: corrupt")
            at = prev

    def plan_catch_up(self, at: int, at_token: str, epoch: int, token: str
                      ) -> list[int] | None:
        """The changelogs, in order, that take a copy of epoch ``at`` (application
        ``at_token``) to epoch ``epoch`` (application ``token``); ``None`` unless the links
        from ``epoch`` lead back to ``at`` and the file of ``at`` names ``at_token`` (the copy
        is on the committed history, not an attempt that lost)."""
        self.refresh()
        chain: list[int] = []
        e = epoch
        while e > at:
            if e not in self.changelogs:
                return None
            meta, _ = self._read(CHANGELOG, e)
            if e == epoch and meta.get("token") != token:
                return None
            chain.append(e)
            e = int(meta["prev"])
        if e != at:
            return None
        kinds = [k for k, have in ((CHANGELOG, self.changelogs), (SNAPSHOT, self.snapshots))
                 if at in have]
        if not kinds or self._read(kinds[0], at)[0].get("token") != at_token:
            return None
        return chain[::-1]

    def _check_token(self, meta: dict, token: str) -> None:
        if token and meta.get("token") != token:
            raise DurableCopyError(
                f"the durable copy of worker {self.worker} at {self.uri} holds epoch "
                f"{meta['epoch']} as written by attempt {meta.get('token')!r}, not by the one the "
                f"driver committed ({token!r}): another attempt of the epoch overwrote it")

    def snapshot_rows(self, epoch: int) -> Iterator[pa.RecordBatch]:
        """The ``(k, v)`` rows of the snapshot of ``epoch``, in key order."""
        _, reader = self._read(SNAPSHOT, epoch)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)

    def changelog(self, epoch: int) -> tuple[list[int], Iterator[pa.RecordBatch]]:
        """The changelog of ``epoch``: the bins it dropped, then its rows to write in order."""
        meta, reader = self._read(CHANGELOG, epoch)
        return list(meta["drops"]), (reader.get_batch(i)
                                     for i in range(reader.num_record_batches))


def merged_rows(snapshot: Iterable[pa.RecordBatch],
                changelogs: Iterable[tuple[Sequence[int], Iterable[pa.RecordBatch]]]) -> pa.Table:
    """The state a snapshot and the changelogs after it amount to, as one key-sorted table of
    ``(k, v)`` without deletes (so an empty store can bulk-load it): a changelog's drops remove
    every earlier row of their bins, and each key keeps its last write."""
    from megaphone.state_backends.encoding import bins_of_arrow

    parts: list[pa.RecordBatch] = []
    drop_from: dict[int, int] = {}  # bin -> first row position after its last drop
    n = 0
    for batch in snapshot:
        parts.append(batch)
        n += batch.num_rows
    for drops, batches in changelogs:
        for b in drops:  # a changelog drops first, then writes its rows
            drop_from[b] = n
        for batch in batches:
            parts.append(batch)
            n += batch.num_rows
    table = pa.Table.from_batches(parts, ROW_SCHEMA).combine_chunks() if parts else \
        ROW_SCHEMA.empty_table()
    order = np.arange(table.num_rows, dtype=np.int64)
    if drop_from and table.num_rows:
        bins = bins_of_arrow(table.column("k").chunk(0))
        start = np.zeros(int(max(int(bins.max()), max(drop_from))) + 1, dtype=np.int64)
        for b, at in drop_from.items():
            start[b] = at
        keep = order >= start[bins]
        table, order = table.filter(pa.array(keep)), order[keep]
    table = table.append_column("_o", pa.array(order))
    table = table.take(pc.sort_indices(table, [("k", "ascending"), ("_o", "descending")]))
    keys = table.column("k").combine_chunks()
    first = np.ones(table.num_rows, dtype=bool)
    if table.num_rows > 1:
        first[1:] = pc.not_equal(keys.slice(1), keys.slice(0, table.num_rows - 1)).to_numpy(
            zero_copy_only=False)
    table = table.filter(pa.array(first))
    return table.filter(pc.is_valid(table.column("v"))).select(["k", "v"])


def claim_checkpoint(uri: str, pipeline_id: str) -> None:
    """Make ``uri`` the checkpoint location of pipeline ``pipeline_id``: a location that
    already belongs to another pipeline is refused (their durable copies would mix)."""
    fs, root = filesystem(uri)
    path = checkpoint_owner_path(root)
    fs.create_dir(root, recursive=True)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        check_checkpoint(uri, pipeline_id)
        return
    with fs.open_output_stream(path) as sink:
        sink.write(json.dumps({"pipeline_id": pipeline_id}).encode())


def check_checkpoint(uri: str, pipeline_id: str) -> None:
    """Raise ``ValueError`` unless ``uri`` is pipeline ``pipeline_id``'s checkpoint location
    (an executor that reaches another location, or none, must not run its tasks)."""
    fs, root = filesystem(uri)
    try:
        with fs.open_input_stream(checkpoint_owner_path(root)) as src:
            found = json.loads(src.read()).get("pipeline_id")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"checkpoint location {uri} is not readable: {exc}") from None
    if found != pipeline_id:
        raise ValueError(f"checkpoint location {uri} belongs to pipeline {found!r}, "
                         f"not {pipeline_id!r}")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem of a checkpoint URI (or local path) and the path in it."""
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, ValueError):
        import os

        return pafs.LocalFileSystem(), os.path.abspath(uri)


def _sync_if_local(fs: pafs.FileSystem, path: str) -> None:
    """fsync a file written to the local filesystem (object stores are durable on close)."""
    if isinstance(fs, pafs.LocalFileSystem):
        import os

        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
