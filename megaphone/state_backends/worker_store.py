"""One worker's keyed state with a versioned lifecycle: the epoch it is at, and how it moves on.

A :class:`WorkerStore` wraps a :class:`~megaphone.state_backends.base.StateBackend` and is the
only code that knows the three metadata entries an epoch leaves in it:

* the **epoch marker** (the last epoch the worker applied, ``-1`` before the first);
* the **stored outputs** of that epoch (Arrow IPC bytes), re-emitted when the epoch runs again
  (a Spark task retry, a re-executed micro-batch);
* the **undo record** of that epoch (the old values of the keys it wrote and the bins it
  installed), so an epoch applied but never committed by the driver can be rolled back;
* inside a **group** of epochs run by one task (docs/groups.md), the undo records and outputs
  of the group's earlier epochs too (``group``), so a crash after the driver committed only
  some of the group's epochs rolls the rest back one by one, and a retried group task replays
  the epochs it committed already.

The lifecycle is ``open`` → per epoch ``check_can_apply`` / ``drop_bins`` / ``install`` /
``read`` → ``commit`` (state, outputs, marker and undo record in one atomic, synced write) →
… → ``close``; ``rollback`` undoes the last epoch. Nothing here flushes or compacts: a
long-lived store (the store service) keeps its memtable across epochs and RocksDB's background
threads flush and compact it, outside every epoch's commit.
"""

from __future__ import annotations

import itertools
import os
import re
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgpack
import pyarrow as pa

from megaphone.errors import MegaphoneError
from megaphone.state_backends.base import ImportStats, StateBackend
from megaphone.state_backends.bin_files import BinFile
from megaphone.state_backends.durable import DurableCopy, Restored, merged_rows
from megaphone.state_backends.group_slots import GROUP_META, GroupIndex, outputs_slot, undo_slot

EPOCH_META = "epoch"
OUTPUTS_META = "outputs"
UNDO_META = "undo"
RUN_META = "run"
TOKEN_META = "token"

_STALL = re.compile(r"Cumulative stall: (\d+):(\d+):([\d.]+) H:M:S")


def pack_epoch(epoch: int) -> bytes:
    """The epoch marker's bytes (8-byte big-endian signed)."""
    return struct.pack(">q", epoch)


def unpack_epoch(raw: bytes | None) -> int:
    """The epoch a marker holds; ``-1`` for no marker."""
    return struct.unpack(">q", raw)[0] if raw else -1


class StoreVersionError(MegaphoneError, RuntimeError):
    """A worker's state is at an epoch that the requested step cannot follow from."""


class WorkerStore:
    """A worker's state backend plus its epoch marker, stored outputs and undo record.

    Used by one thread at a time. Context-managed: ``with WorkerStore.open(...) as s:``.
    """

    def __init__(self, backend: StateBackend, durable: DurableCopy | None = None) -> None:
        self.backend = backend
        #: The worker's durable copy (changelogs, snapshots), when the pipeline has one.
        self.durable = durable
        self._stall_at_begin = 0.0
        self._dropped: set[int] = set()
        self._installed: list[pa.RecordBatch] = []
        self._ingested: set[int] = set()

    @classmethod
    def open(cls, kind: str, path: str | os.PathLike[str], key_type: str, num_bins: int,
             read_only: bool = False, durable: DurableCopy | None = None) -> WorkerStore:
        """Open (creating if needed, unless ``read_only``) the ``kind`` store at ``path``."""
        from megaphone.state_backends import open_backend

        return cls(open_backend(kind, path, key_type, num_bins, read_only=read_only), durable)

    # -- version ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The last epoch this worker applied (-1 if none)."""
        return unpack_epoch(self.backend.get_meta(EPOCH_META))

    @property
    def run(self) -> str:
        """The run (a driver's session of the pipeline) that applied :attr:`epoch`."""
        return (self.backend.get_meta(RUN_META) or b"").decode()

    @property
    def token(self) -> str:
        """Names this application of :attr:`epoch` (new at every commit; the driver records
        the token of the attempt it committed, so a copy of the epoch made by any other
        attempt, on any host, is told apart)."""
        return (self.backend.get_meta(TOKEN_META) or b"").decode()

    def stored_outputs(self, epoch: int | None = None) -> bytes:
        """The outputs (Arrow IPC stream) of epoch :attr:`epoch` (or of ``epoch``, an earlier
        epoch of the group the store is in), empty bytes if none."""
        if epoch is None or epoch == self.epoch:
            return self.backend.get_meta(OUTPUTS_META) or b""
        return self.backend.get_meta(outputs_slot(self._group().epochs.index(epoch))) or b""

    def token_of(self, epoch: int) -> str:
        """The token of this store's application of ``epoch``: :attr:`token`, or for an earlier
        epoch of its group the token the next epoch's undo record saved."""
        chain = self._undo_chain()
        for undo in chain:
            if undo["epoch"] == epoch + 1:
                return undo.get("token", "")
        return self.token

    def _group(self) -> GroupIndex:
        """The group the store is in (an empty index when the last commit was not in one)."""
        index = GroupIndex.unpack(self.backend.get_meta(GROUP_META))
        if index is None:
            raise StoreVersionError(
                f"worker state at {self.backend.path} keeps its group's epochs in an older "
                "format: roll it back or finish the group with the version that wrote it")
        return index

    def _undo_chain(self) -> list[dict[str, Any]]:
        """Undo records this store can still apply, oldest first: its group's, then the last
        epoch's."""
        raws = [self.backend.get_meta(undo_slot(i)) for i in range(len(self._group().epochs))]
        raws.append(self.backend.get_meta(UNDO_META))
        return [u for u in (msgpack.unpackb(raw) if raw else None for raw in raws)
                if u is not None]

    def can_roll_back_to(self, epoch: int) -> bool:
        """True if every epoch after ``epoch`` up to :attr:`epoch` has its undo record here."""
        have = {u["epoch"] for u in self._undo_chain()}
        return all(e in have for e in range(epoch + 1, self.epoch + 1))

    def rollback_to(self, epoch: int) -> None:
        """Undo the epochs after ``epoch``, newest first (:meth:`rollback`)."""
        if not self.can_roll_back_to(epoch):
            raise StoreVersionError(
                f"worker state at {self.backend.path} is at epoch {self.epoch} and cannot be "
                f"rolled back to epoch {epoch}: undo records are missing")
        while self.epoch > epoch:
            self.rollback(self.epoch)

    def check_can_apply(self, epoch: int, group_start: int | None = None) -> bool:
        """True if ``epoch`` is new here, False if it was applied already (a replay): at the
        store's epoch, or (``group_start`` given) an earlier epoch of the group it is in.

        Raises :class:`StoreVersionError` if the state is past ``epoch`` otherwise.
        """
        at = self.epoch
        if at > epoch and not (group_start is not None and epoch >= group_start
                               and self._group().start == group_start
                               and epoch in self._group().epochs):
            raise StoreVersionError(
                f"worker state at {self.backend.path} is at epoch {at}, ahead of epoch {epoch}")
        self._stall_at_begin = self.stall_seconds()
        self._dropped, self._installed, self._ingested = set(), [], set()
        return at < epoch

    def restore(self, epoch: int, token: str = "") -> Restored:
        """Rebuild this store, which must be empty, as it was after ``epoch`` from the durable
        copy (a working copy lost with its executor, or left behind on another host); ``token``
        names the application of ``epoch`` the driver committed (checked when given)."""
        durable = self._durable_for(epoch)
        if self.epoch != -1 or next(iter(self.backend.raw_items()), None) is not None:
            raise StoreVersionError(f"restore needs an empty store; {self.backend.path} "
                                    f"holds state at epoch {self.epoch}")
        snapshot, chain = durable.plan_restore(epoch, token)
        # The snapshot and changelogs merged into one key-sorted run: an empty store bulk-loads
        # it (SST ingestion) instead of writing changelog rows one batch at a time.
        state = merged_rows(durable.snapshot_rows(snapshot) if snapshot is not None else (),
                            (durable.changelog(e) for e in chain))
        rows = self.backend.import_bins(state.to_batches(max_chunksize=1 << 16),
                                        method="auto").keys if state.num_rows else 0
        self._replay((), epoch, token)
        return Restored(epoch=epoch, snapshot=snapshot, changelogs=len(chain), rows=rows)

    def catch_up(self, epoch: int, token: str) -> Restored | None:
        """Bring a copy that holds an earlier epoch of the committed history (its token is the
        one the durable copy recorded for it: the worker ran here before, then elsewhere) to
        ``epoch`` by replaying only the changelogs it lacks; ``None``, changing nothing, when
        that cannot be shown (then :meth:`restore` from empty)."""
        durable = self._durable_for(epoch)
        at, mine = self.epoch, self.token
        if at < 0 or not mine or not token:
            return None
        chain = durable.plan_catch_up(at, mine, epoch, token)
        if chain is None:
            return None
        rows = self._replay(chain, epoch, token)
        return Restored(epoch=epoch, snapshot=None, changelogs=len(chain), rows=rows, since=at)

    def _durable_for(self, epoch: int) -> DurableCopy:
        if self.durable is None:
            raise StoreVersionError(f"worker state at {self.backend.path} is behind epoch "
                                    f"{epoch} and the pipeline has no checkpoint location")
        return self.durable

    def _replay(self, chain: Sequence[int], epoch: int, token: str) -> int:
        """Apply the changelogs ``chain`` in order, then mark the store as the committed
        ``epoch`` (no outputs to replay, nothing to undo); the rows written."""
        assert self.durable is not None
        rows = 0
        for e in chain:
            drops, batches = self.durable.changelog(e)
            if drops:
                self.backend.drop_bins(drops)
            for batch in batches:
                rows += batch.num_rows
                self.backend.write_raw(batch.column(0).to_pylist(), batch.column(1).to_pylist())
        # The marker's write is synced, and with it every write before it.
        self.backend.write_raw([], [], [], meta={
            EPOCH_META: pack_epoch(epoch), OUTPUTS_META: b"", UNDO_META: msgpack.packb(None),
            RUN_META: b"", TOKEN_META: token.encode(), GROUP_META: b""})
        self.backend.flush_if_volatile()
        return rows

    # -- one epoch's changes ---------------------------------------------------------------

    def drop_bins(self, bins: Iterable[int]) -> None:
        """Delete every key of ``bins`` (bins that left, or a half-installed arrival)."""
        bins = sorted(set(bins))
        if bins:
            self.backend.drop_bins(bins)
            self._dropped.update(bins)

    def install(self, chunks: Iterable[pa.RecordBatch]) -> ImportStats:
        """Install arriving bins' exported ``(k, v)`` chunks (chunk puts or SST ingestion)."""
        if self.durable is not None:  # kept for the epoch's changelog
            chunks = _kept(chunks, self._installed)
        return self.backend.import_bins(chunks, method="auto")

    def ingest_files(self, files: Sequence[BinFile]) -> ImportStats:
        """Install arriving bins shipped as whole-bin files (ingested, no per-key work)."""
        stats = self.backend.ingest_bin_files(files)
        self._ingested.update(f.bin for f in files)
        return stats

    def read(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Current values of ``raw_keys`` (``None`` where absent)."""
        return self.backend.get_raw(raw_keys)

    def due_timers(self, bins: Iterable[int], upto: int) -> list[bytes]:
        """Raw timer keys of ``bins`` due at watermark ``upto`` (time ``<= upto``), bins in the
        given order, each bin's in (time, key) order; an epoch deletes those it fires in its
        :meth:`commit` (value ``None``), atomically with the state they changed."""
        return self.backend.due_timers(bins, upto)

    def commit(self, epoch: int, keys: Sequence[bytes], values: Sequence[bytes | None],
               old: Sequence[bytes | None], outputs: bytes, installed: Sequence[int],
               run: str = "", group_start: int | None = None) -> str:
        """Write epoch ``epoch``'s state, outputs, marker and undo record in one atomic write;
        returns the new :attr:`token` of this application of the epoch.

        ``old`` are the values ``keys`` had before the epoch (``None`` = absent); ``installed``
        the bins the epoch installed; ``run`` the driver's run that applied it (a later run
        rolls the epoch back instead of replaying its outputs); ``group_start``: the first
        epoch of the group ``epoch`` belongs to, whose earlier epochs' undo records and
        outputs are kept along. The write is synced: once this returns the epoch is durable at
        this worker even if the machine loses power.
        """
        at = self.epoch
        if at >= epoch:
            raise StoreVersionError(
                f"worker state at {self.backend.path} is at epoch {at}; cannot commit {epoch}")
        token = uuid.uuid4().hex
        if self.durable is not None:  # durable before the worker's commit, so before the driver's
            writes = pa.RecordBatch.from_arrays(
                [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], names=["k", "v"])
            # Bins that arrived as files enter the changelog as rows, read back before the
            # epoch's writes (which come after them in the log, as in the store).
            ingested = self.backend.export_bins(sorted(self._ingested))
            self.durable.record(epoch, at, sorted(self._dropped),
                                itertools.chain(ingested, self._installed, [writes]), token)
        undo = msgpack.packb({"epoch": epoch, "bins": list(installed), "keys": list(keys),
                              "old": list(old), "run": self.run, "token": self.token})
        meta = {EPOCH_META: pack_epoch(epoch), OUTPUTS_META: outputs, UNDO_META: undo,
                RUN_META: run.encode(), TOKEN_META: token.encode(), GROUP_META: b""}
        if group_start is not None and group_start <= at:  # a later epoch of a group
            group = self._group()
            if group.start != group_start:
                group = GroupIndex(group_start, [])
            slot = len(group.epochs)  # the previous epoch's undo record and outputs move there
            meta[undo_slot(slot)] = self.backend.get_meta(UNDO_META) or b""
            meta[outputs_slot(slot)] = self.stored_outputs()
            meta[GROUP_META] = GroupIndex(group_start, [*group.epochs, at]).packed()
        self.backend.write_raw(keys, values, old, meta=meta)
        self.backend.flush_if_volatile()
        self._installed, self._ingested = [], set()
        if self.durable is not None and self.durable.snapshot_due(epoch):
            self.durable.write_snapshot(
                epoch, self.backend.export_bins(range(self.backend.num_bins)), token)
        return token

    def join(self, epoch: int) -> None:
        """Mark a worker that receives its first bins offline as being at ``epoch``."""
        if self.epoch < epoch:
            self.backend.write_raw([], [], [], meta={EPOCH_META: pack_epoch(epoch)})
            self.backend.flush_if_volatile()

    def rollback(self, epoch: int) -> None:
        """Undo epoch ``epoch`` (applied here but never committed by the driver).

        Restores the old values of the keys it wrote (deleting keys it created), deletes the
        bins it installed, and sets the marker back to ``epoch - 1``; inside a group, the
        previous epoch's undo record and outputs become the last ones again. Each write is
        idempotent and the marker moves last, so a crash in here rolls back again.
        """
        raw = self.backend.get_meta(UNDO_META)
        undo = msgpack.unpackb(raw) if raw else None
        if undo is None or undo["epoch"] != epoch:
            raise StoreVersionError(
                f"worker state at {self.backend.path} has no undo record for epoch {epoch}; "
                "it cannot be rolled back to the last committed epoch")
        self.backend.write_raw(undo["keys"], undo["old"])
        if undo["bins"]:
            self.backend.drop_bins(undo["bins"])
        group, outputs, before = self._group(), b"", msgpack.packb(None)
        if group.epochs and group.epochs[-1] == epoch - 1:  # the group's previous epoch
            slot = len(group.epochs) - 1
            before = self.backend.get_meta(undo_slot(slot)) or before
            outputs = self.backend.get_meta(outputs_slot(slot)) or b""
            group = GroupIndex(group.start, group.epochs[:-1])
        self.backend.write_raw([], [], [], meta={
            EPOCH_META: pack_epoch(epoch - 1), OUTPUTS_META: outputs, UNDO_META: before,
            GROUP_META: group.packed(),
            RUN_META: undo.get("run", "").encode(), TOKEN_META: undo.get("token", "").encode()})
        self.backend.flush_if_volatile()
        if self.durable is not None:
            self.durable.forget_from(epoch)

    # -- health --------------------------------------------------------------------------

    def stall_seconds(self) -> float:
        """Total time writes to this store have been stalled by flushes and compactions."""
        text = self.backend.property("rocksdb.stats")
        match = _STALL.search(text) if text else None
        if not match:
            return 0.0
        h, m, s = match.groups()
        return int(h) * 3600 + int(m) * 60 + float(s)

    def health(self) -> dict[str, Any]:
        """Maintenance figures for an epoch's metrics: write stalls since :meth:`check_can_apply`
        (``stall_s``, time flushes and compactions held this epoch's writes up) and the
        compaction work RocksDB still owes (``pending_compaction_bytes``), its level-0 files,
        and whether it is compacting (``compacting``: a compaction running or due; ``None``
        for a store without compactions), which slows every epoch on the host while it runs
        (docs/transfer.md, "The senders' compaction")."""
        running = self.backend.property("rocksdb.num-running-compactions")
        due = self.backend.property("rocksdb.compaction-pending")
        return {
            "stall_s": max(0.0, self.stall_seconds() - self._stall_at_begin),
            "pending_compaction_bytes": int(
                self.backend.property("rocksdb.estimate-pending-compaction-bytes") or 0),
            "l0_files": int(self.backend.property("rocksdb.num-files-at-level0") or 0),
            "compacting": None if running is None else bool(int(running) or int(due or 0)),
        }

    def close(self) -> None:
        """Flush and release the store."""
        self.backend.close()

    def __enter__(self) -> WorkerStore:
        """Context-manager entry: the store itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Context-manager exit: :meth:`close`."""
        self.close()


def _kept(chunks: Iterable[pa.RecordBatch], into: list[pa.RecordBatch]
          ) -> Iterator[pa.RecordBatch]:
    """``chunks``, each also appended to ``into``."""
    for chunk in chunks:
        into.append(chunk)
        yield chunk
