"""The store service: a long-lived process on each host that keeps workers' stores open across
epochs (one per core: :func:`~megaphone.state_backends.service_client.service_shards`).

PySpark reuses Python worker processes but does not pin a partition to one, and a RocksDB can
be opened read-write by one process only. So each worker store of a host lives in a process
of its own kind (one per core; a worker always in the same one), started on demand by the first
task that needs it (``start_new_session``: it outlives the task), and every task of every epoch
reaches it over a Unix socket. The task keeps the computation (grouping, the update function,
outputs); the service does the storage operations: the epoch's version check, drops,
installs, reads, the commit, exports. Opening a store, flushing its memtable and compacting no
longer happen inside an epoch: the memtable lives on, and RocksDB flushes and compacts it in
its background threads (``docs/worker-store.md`` and ``bench/RESULTS.md`` have the numbers).

Lifecycle: the service closes a store when the executor JVM that last used it is gone (a killed
driver in local mode, a lost executor; a client with no JVM above it, such as a driver's own
reads or the CLI, stands for itself), when a driver asks (``release`` on opening or closing a
pipeline) or after :data:`STORE_IDLE_CLOSE_S` unused; it exits once it has no store open and no
connection for ``idle_exit_s``, or on ``shutdown``. It never leaves a lock behind: a killed
service releases its RocksDB locks with its process, and its WAL brings every synced commit
back when the next service opens the store.

Requests and replies are frames of :mod:`megaphone.state_backends.wire`. An epoch's writes carry
the *lease* its ``begin`` returned, so a zombie task of an earlier attempt cannot change a store
after a retry has begun. :mod:`megaphone.state_backends.service_identity` says where a host's
service listens and how a client recognizes it.

The process that hosts it is :mod:`megaphone.state_backends.service_process`.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from megaphone.errors import MegaphoneError
from megaphone.paths import local_worker_path, service_dir
from megaphone.state_backends import wire
from megaphone.state_backends.ahead_writer import AheadWishes, AheadWriter
from megaphone.state_backends.base import StateBackend
from megaphone.state_backends.bin_files import BinFile, FileAssembler, discard, transfer_dir
from megaphone.state_backends.durable import SNAPSHOT_EVERY, DurableCopy
from megaphone.state_backends.handoff import (
    FileRef,
    drop_kept,
    keep_file,
    link_all,
    pull_files,
    serve_file,
)
from megaphone.state_backends.host import host_id
from megaphone.state_backends.network import (
    Network,
    NetworkRefused,
    check_pipeline_id,
)
from megaphone.state_backends.rocksdb_tuning import LogTrim
from megaphone.state_backends.service_client import register_at, service_shards
from megaphone.state_backends.service_identity import code_id, process_start
from megaphone.state_backends.wire import batch_to_ipc, ipc_to_batches, recv_frame, send_frame
from megaphone.state_backends.worker_store import StoreVersionError, WorkerStore

log = logging.getLogger("megaphone.store_service")

#: A store nobody used for this long is closed (its memtable flushed) and reopened on demand.
STORE_IDLE_CLOSE_S = 600.0
#: The service exits after this long with no store open and no connection.
IDLE_EXIT_S = 30.0
#: A copy of a worker at home elsewhere is deleted once unused for this long (``prune``).
PRUNE_IDLE_S = 20.0


# -- the service --------------------------------------------------------------------------------


class LeaseLost(MegaphoneError, RuntimeError):
    """A newer attempt of the epoch has begun at this store; this attempt may not write."""


@dataclass
class _Entry:
    """One open store and who may write to it."""

    store: WorkerStore
    kind: str
    key_type: str
    num_bins: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    lease: int = 0
    last_used: float = field(default_factory=time.monotonic)
    owners: set[tuple[int, int]] = field(default_factory=set)  # (jvm pid, start time)
    log: LogTrim = field(default_factory=LogTrim)
    ahead: AheadWishes = field(default_factory=AheadWishes)  # bins to write ahead


class StoreService:
    """The stores open in this process and the operations tasks run on them."""

    def __init__(self, idle_exit_s: float = IDLE_EXIT_S, host_dir: str | None = None) -> None:
        self.idle_exit_s = idle_exit_s
        #: Registrations and the TCP listener (with ``host_dir``, the host's local directory).
        self.network = None if host_dir is None else Network(host_dir, self.serve)
        self.stores: dict[str, _Entry] = {}
        self._lock = threading.Lock()  # guards ``stores``
        self.connections = 0
        self.last_activity = time.monotonic()
        self.stopping = threading.Event()
        self.orphaned = False  # stores were closed because their executor is gone
        self.watched: set[tuple[int, int]] = set()  # executors that connected (pid, start)
        self.in_flight = 0  # requests being answered
        #: Writes the bins the stores are to send next while no epoch runs here.
        self.ahead_writer = AheadWriter(self._entries, lambda: self.in_flight, self.stopping)

    # -- stores -------------------------------------------------------------------------------

    def _entries(self) -> list[_Entry]:
        with self._lock:
            return list(self.stores.values())

    def entry(self, req: dict[str, Any], owner: tuple[int, int] | None) -> _Entry:
        """The open store ``req["path"]``, opened now if needed; settings must match."""
        path = req["path"]
        with self._lock:
            entry = self.stores.get(path)
            if entry is None:
                entry = self.stores[path] = _Entry(_open_store(req), req["kind"],
                                                   req["key_type"], req["num_bins"])
            elif (entry.kind, entry.key_type, entry.num_bins) != \
                    (req["kind"], req["key_type"], req["num_bins"]):
                raise ValueError(
                    f"store {path} is open as {entry.kind}/{entry.key_type}/{entry.num_bins} "
                    f"bins, not {req['kind']}/{req['key_type']}/{req['num_bins']}")
            if owner is not None:
                entry.owners.add(owner)
            entry.last_used = time.monotonic()
            return entry

    def close_stores(self, which, why: str) -> list[str]:
        """Close (flushing) every open store whose path satisfies ``which``; return them."""
        with self._lock:
            chosen = [(p, e) for p, e in self.stores.items() if which(p, e)]
            for path, _ in chosen:
                del self.stores[path]
        for path, entry in chosen:
            with entry.lock:
                try:
                    entry.store.close()
                except Exception as exc:  # a store whose directory is gone: nothing to keep
                    log.warning("closing %s failed: %s", path, exc)
            log.info("closed %s (%s)", path, why)
        return [p for p, _ in chosen]

    # -- requests -----------------------------------------------------------------------------

    def serve(self, sock: socket.socket,
              guard: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        """Answer one connection's requests until it closes. A network connection's requests
        pass its ``guard`` first (:func:`~megaphone.state_backends.network.network_request`):
        one it refuses is answered and the connection dropped."""
        owner: tuple[int, int] | None = None
        with self._lock:
            self.connections += 1
        try:
            while not self.stopping.is_set():
                req = recv_frame(sock)
                if req is None:
                    return
                self.last_activity = time.monotonic()
                with self._lock:
                    self.in_flight += 1
                try:
                    if guard is not None:
                        try:
                            req = guard(req)
                        except NetworkRefused as exc:
                            log.warning("refused a network request: %s", exc)
                            wire.refuse(sock, exc)
                            return
                    op = req.get("op")
                    try:
                        if op == "hello":
                            pid = req.get("watch")
                            start = process_start(pid) if pid else None
                            owner = (pid, start) if start is not None else None
                            if owner is not None:
                                self.watched.add(owner)
                            send_frame(sock, {"ok": True, "pid": os.getpid(), "code": code_id()})
                        elif op == "export":
                            self._export(sock, req, owner)
                        elif op == "install":
                            self._install(sock, req, owner)
                        elif op == "ingest_parts":
                            self._ingest_parts(sock, req, owner)
                        elif op == "fetch":
                            serve_file(sock, req)
                        else:
                            handler = getattr(self, f"op_{op}", None)
                            if handler is None:
                                raise ValueError(f"unknown store service operation {op!r}")
                            send_frame(sock, {"ok": True, **(handler(req, owner) or {})})
                    except Exception as exc:
                        log.info("%s failed: %r", op, exc)
                        send_frame(sock, {"ok": False, "error": type(exc).__name__,
                                          "message": str(exc)})
                        if op in ("export", "install", "ingest_parts", "fetch"):
                            return  # the stream's remaining frames are unread: drop the connection
                finally:
                    with self._lock:
                        self.in_flight -= 1
        except wire.FrameError as exc:  # not this protocol: say why, then drop the connection
            log.warning("dropped a connection: %s", exc)
            wire.refuse(sock, exc)
        except (ConnectionError, OSError):
            return
        finally:
            with self._lock:
                self.connections -= 1
            self.last_activity = time.monotonic()

    def _leased(self, req: dict[str, Any], owner) -> _Entry:
        entry = self.entry(req, owner)
        _check_lease(entry, req)
        return entry

    def op_begin(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Start an epoch's attempt: version check (restoring a working copy that is behind),
        a new lease, the stored outputs on replay."""
        entry = self.entry(req, owner)
        with entry.lock:
            entry.ahead.opened(req.get("started"))
            restored = self._catch_up(entry, req)
            apply = entry.store.check_can_apply(epoch := req["epoch"], req.get("group_start"))
            drop_kept(req["path"], req.get("current", epoch))  # their epochs are committed
            entry.lease += 1
            return {"lease": entry.lease, "apply": apply, "restored": restored,
                    "outputs": b"" if apply else entry.store.stored_outputs(epoch),
                    "token": "" if apply else entry.store.token_of(epoch)}

    @staticmethod
    def _catch_up(entry: _Entry, req: dict[str, Any]) -> dict[str, Any] | None:
        """Bring the store to the driver's last commit before an epoch's attempt, an export or
        a read: roll back an epoch that a run which never committed it applied (``current``:
        the epoch after the commit; ``run``: this attempt's run). With a durable copy, also:
        empty a working copy of a worker that owned no bins at the commit (``required`` is
        ``None``: whatever it holds was left on this host before its bins moved away), and
        restore one that is behind the epoch the driver committed for it (``required``) or at
        that epoch but from an attempt the driver did not commit (``committed_token``; a copy
        left on this host by a failed attempt while another host's attempt was committed).
        What the restore did, or ``None``."""
        store, current = entry.store, req.get("current")
        if current is not None and store.epoch >= current:
            back = store.can_roll_back_to(current - 1)  # (a group's epochs: docs/groups.md)
            if store.run == req.get("run") and back:
                return None  # this run applied it (or some of its group): a retry replays
            if not back:
                raise StoreVersionError(
                    f"worker state at {req['path']} is at epoch {store.epoch}, past the last "
                    f"commit ({current - 1}) without undo records back to it: another run's")
            log.info("rolling back epochs %d..%d of %s", current, store.epoch, req["path"])
            store.rollback_to(current - 1)  # applied by a run that never committed it
        if store.durable is None:
            if req.get("required") is not None and store.epoch < req["required"]:
                store.restore(req["required"])  # raises: there is nothing to restore from
            return None
        required, token = req.get("required"), req.get("committed_token") or ""
        if required is None:
            if store.epoch != -1 or next(iter(store.backend.raw_items()), None) is not None:
                _reopen_empty(entry, req)
                log.info("emptied %s: its worker owned no bins at the last commit", req["path"])
            return None
        if store.epoch > required or (store.epoch == required and (
                not token or store.token == token)):
            return None
        started = time.perf_counter()
        done = entry.store.catch_up(required, token)  # only what a copy left here lacks
        if done is None:
            _reopen_empty(entry, req)  # a stale or lost working copy: start again from empty
            done = entry.store.restore(required, token)
        log.info("restored %s to epoch %d from its durable copy (from epoch %s)", req["path"],
                 required, done.since)
        return {"epoch": done.epoch, "snapshot": done.snapshot, "changelogs": done.changelogs,
                "rows": done.rows, "since": done.since, "seconds": time.perf_counter() - started}

    def op_drop(self, req: dict[str, Any], owner) -> None:
        """Delete bins (departed ones, or a half-installed arrival of a failed attempt)."""
        entry = self._leased(req, owner)
        with entry.lock:
            entry.store.drop_bins(req["bins"])

    def _install(self, sock: socket.socket, req: dict[str, Any], owner) -> None:
        entry = self._leased(req, owner)

        def chunks() -> Iterator[pa.RecordBatch]:
            for frame in _stream(sock):
                yield from ipc_to_batches(frame["chunk"])

        with entry.lock:
            started = time.perf_counter()
            stats = entry.store.install(chunks())
            seconds = time.perf_counter() - started
        send_frame(sock, {"ok": True, "method": stats.method, "keys": stats.keys,
                          "bytes": stats.bytes, "seconds": seconds})

    def _ingest_parts(self, sock: socket.socket, req: dict[str, Any], owner) -> None:
        """Install arriving bins from whole-bin files sent in parts (a task away from the
        store's home: docs/placement.md), written into the store's incoming transfer
        directory under names the descriptors' checks keep there."""
        entry = self._leased(req, owner)
        files = FileAssembler(transfer_dir(req["path"], "in"))
        try:
            for frame in _stream(sock):
                files.add(BinFile.from_wire(frame["file"]), int(frame["offset"]), frame["data"])
            with entry.lock:
                reply = _ingest(entry, files.complete())
        finally:
            files.discard()
        send_frame(sock, {"ok": True, **reply})

    def op_pull(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Install arriving bins from files kept at their senders' homes (``refs``): fetched
        from those services over the network as the pipeline (``pipeline``, registered here),
        written into the store's incoming transfer directory and ingested at once."""
        entry = self._leased(req, owner)
        reg = None if self.network is None else self.network.registration(req.get("pipeline"))
        if reg is None:
            raise ValueError(f"pipeline {req.get('pipeline')!r:.80} is not registered here: "
                             "its secret is needed to pull bin files from other hosts")
        refs = [FileRef.from_wire(r) for r in req["refs"]]
        files = FileAssembler(transfer_dir(req["path"], "in"))
        try:
            pull_files(refs, files, reg.pipeline_id, reg.secret.hex(), int(req["part_bytes"]))
            with entry.lock:
                _check_lease(entry, req)  # again: a newer attempt may have begun while it pulled
                return _ingest(entry, files.complete())
        finally:
            files.discard()

    def op_link(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Install arriving bins from files kept by sibling stores of the same state directory
        (``links``: each a :class:`~megaphone.state_backends.handoff.LinkRef`'s map plus the
        sender's ``store`` path): linked into the store's incoming transfer directory and
        ingested at once, with no byte read or written."""
        entry = self._leased(req, owner)
        files = link_all(req["path"], req["links"])
        try:
            with entry.lock:
                _check_lease(entry, req)
                return _ingest(entry, files)
        finally:
            discard(files)  # ingested files were moved away

    def op_read(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Current values of raw keys."""
        entry = self.entry(req, owner)
        with entry.lock:
            return {"values": entry.store.read(req["keys"])}

    def op_timers(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Raw timer keys of bins due at a watermark (``bins``, ``upto``)."""
        entry = self.entry(req, owner)
        with entry.lock:
            return {"keys": entry.store.due_timers(req["bins"], req["upto"])}

    def op_commit(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """The epoch's atomic write (state, outputs, marker, undo); returns the store's health."""
        entry = self._leased(req, owner)
        with entry.lock:
            started = time.perf_counter()
            token = entry.store.commit(req["epoch"], req["keys"], req["values"], req["old"],
                                       req["outputs"], req["installed"], req.get("run", ""),
                                       req.get("group_start"))
            seconds = time.perf_counter() - started
            entry.ahead.committed(req.get("ahead"), req.get("ahead_min_bytes", 1),
                                  req.get("leaving"))
            backend, ahead, pending = entry.store.backend, [], None
            if backend.supports_bin_files:
                backend.forget_ahead(entry.ahead.kept())  # those no longer named go now
                ahead = backend.ahead_bins()
                if req.get("ahead") is not None:  # None: rows only, nothing written ahead
                    pending = backend.ahead_pending(entry.ahead.bins, entry.ahead.min_bytes)
        if entry.ahead.bins:
            self.ahead_writer.wake()
        return {"seconds": seconds, "token": token, "ahead": ahead, "ahead_pending": pending,
                **entry.store.health()}

    def _export(self, sock: socket.socket, req: dict[str, Any], owner) -> None:
        """Stream bins as ``(k, v)`` chunks; with ``file_min_bytes`` (and a backend that can),
        a bin of that many bytes as one file (its descriptor); with ``keep`` (and a listener),
        kept here for the receiver's home to pull (:mod:`.handoff`): its reference instead."""
        entry, min_bytes = self.entry(req, owner), req.get("file_min_bytes")
        current = req.get("current")
        source = self.network.address if self.network is not None and req.get("keep") and \
            isinstance(current, int) and isinstance(req.get("worker"), int) else None
        link = bool(req.get("link")) and isinstance(current, int)
        with entry.lock:
            self._catch_up(entry, req)
            if not isinstance(current, int) or entry.store.epoch < current:  # yet to run here
                entry.ahead.opened()
            backend = entry.store.backend
            if min_bytes is None or not backend.supports_bin_files:
                _send_chunks(sock, backend, req["bins"], req["chunk_bytes"])
            else:
                for b in req["bins"]:
                    made = backend.take_ahead(b)  # written ahead, and a patch of what changed
                    if not made:
                        whole = backend.write_bin_file(b, max(1, min_bytes))
                        made = [] if whole is None else [whole]
                    for f in made:
                        if source is not None:
                            kept = keep_file(f, current)
                            send_frame(sock, {"ref": FileRef(kept, req["worker"], source,
                                                             host_id(self.network.host_dir)
                                                             ).to_wire()})
                        elif link:
                            send_frame(sock, {"kept": keep_file(f, current).to_wire()})
                        else:
                            send_frame(sock, {"file": f.to_wire()})
                    if not made:
                        _send_chunks(sock, backend, [b], req["chunk_bytes"])
            entry.last_used = time.monotonic()
        send_frame(sock, {"ok": True, "end": True})

    def op_ingest(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Install arriving bins from whole-bin files the task wrote into the store's
        incoming transfer directory (no other path is accepted)."""
        entry = self._leased(req, owner)
        inbox = transfer_dir(req["path"], "in")
        files = [BinFile.from_wire(f) for f in req["files"]]
        for f in files:
            if os.path.dirname(os.path.abspath(f.path)) != inbox:
                raise ValueError(f"bin file {f.path} is not in the store's transfer directory")
        with entry.lock:
            return _ingest(entry, files)

    def op_stats(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Keys and bytes of every non-empty bin, as of the driver's last commit."""
        entry = self.entry(req, owner)
        with entry.lock:
            self._catch_up(entry, req)
            stats = entry.store.backend.bin_stats()
        return {"bins": [[int(b), int(s.keys), int(s.bytes)] for b, s in stats.items()]}

    def op_destroy(self, req: dict[str, Any], owner) -> None:
        """Close a store and delete its directory (a worker left without bins)."""
        path = req["path"]
        self.close_stores(lambda p, e: p == path, "destroyed")
        shutil.rmtree(path, ignore_errors=True)
        if req.get("checkpoint"):
            _durable(req).destroy()

    def op_release(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Close every store under a directory (a pipeline opening or closing)."""
        prefix = os.path.join(req["prefix"], "")
        return {"closed": self.close_stores(lambda p, e: p.startswith(prefix), "released")}

    def op_register(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Register a pipeline's secret (a task of it on this host asks, over the Unix socket)
        so that its tasks elsewhere may reach its stores here; the listener's address."""
        if self.network is None:
            raise ValueError("this store service was started without a host directory")
        return {"address": self.network.register(req.get("pipeline"), req.get("secret"),
                                                 req.get("checkpoint"))}

    def op_sibling(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """The address of this host's store service number ``shard`` for the pipeline
        (``pipeline``, registered here): a task away from a new worker's home asks any known
        service of the home for its worker's shard (docs/placement.md). That service is
        started if none runs, and the pipeline is registered there as a task registers it."""
        shard, shards = req.get("shard"), service_shards()
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < shards:
            raise ValueError(f"no store service {shard!r:.40} on this host: it runs {shards}, "
                             f"numbered 0 to {shards - 1}")
        network = self.network
        reg = None if network is None else network.registration(req.get("pipeline"))
        if network is None or reg is None:
            raise ValueError(f"pipeline {req.get('pipeline')!r:.80} is not registered here")
        return {"address": register_at(service_dir(network.host_dir, shard),
                                       reg.pipeline_id, reg.secret.hex(), reg.checkpoint)}

    def op_prune(self, req: dict[str, Any], owner) -> dict[str, Any]:
        """Delete this host's copies of a pipeline's ``workers`` that are at home on another
        host (a task of the pipeline hands on the driver's homes), so that the cluster keeps
        one working copy per worker. A copy used in the last :data:`PRUNE_IDLE_S` is kept: a
        task whose home could not be reached may be using it. The workers deleted."""
        if self.network is None:
            raise ValueError("this store service was started without a host directory")
        pipeline = check_pipeline_id(req.get("pipeline"))
        deleted = []
        for worker in req.get("workers", []):
            path = os.path.abspath(local_worker_path(self.network.host_dir, pipeline,
                                                     int(worker)))
            with self._lock:  # nothing opens the copy while it goes
                entry = self.stores.get(path)
                if entry is not None and (time.monotonic() - entry.last_used < PRUNE_IDLE_S
                                          or entry.lock.locked()):
                    continue
                if entry is None and not os.path.isdir(path):
                    continue
                if entry is not None:
                    del self.stores[path]
                    entry.store.close()
                shutil.rmtree(path, ignore_errors=True)
            log.info("deleted %s: its worker is at home on another host", path)
            deleted.append(int(worker))
        return {"deleted": deleted}

    def op_shutdown(self, req: dict[str, Any], owner) -> None:
        """Close every store and stop the service."""
        self.stopping.set()

    # -- housekeeping -------------------------------------------------------------------------

    def housekeeping(self) -> bool:
        """One round of the housekeeping thread (stores of dead executors, idle stores);
        False once the service should exit."""
        now = time.monotonic()
        gone = self.close_stores(
            lambda p, e: bool(e.owners) and all(process_start(pid) != start
                                                for pid, start in e.owners),
            "its executor is gone")
        # Orphaned: stores closed because their executor died, or every executor that ever
        # connected is gone (a crash while this service held no store).
        if gone or (self.watched and all(process_start(pid) != start
                                         for pid, start in self.watched)):
            self.orphaned = True
        self.close_stores(lambda p, e: now - e.last_used > STORE_IDLE_CLOSE_S, "idle")
        with self._lock:
            idle = not self.stores and self.connections == 0
            entries = list(self.stores.values())
        for entry in entries:
            if entry.lock.acquire(blocking=False):  # not in the middle of an operation
                try:
                    entry.log.trim(entry.store.backend, now, sending=bool(entry.ahead.bins))
                    entry.store.backend.warm_page_cache()  # compactions' new and old files
                except Exception as exc:  # a store closed meanwhile: nothing to flush
                    log.warning("housekeeping of %s failed: %s", entry.store.backend.path, exc)
                finally:
                    entry.lock.release()
        # Exit once idle: at once if the executors using it are gone, else after idle_exit_s.
        return not self.stopping.is_set() and \
            not (idle and (self.orphaned or now - self.last_activity > self.idle_exit_s))


def _check_lease(entry: _Entry, req: dict[str, Any]) -> None:
    """Refuse a write whose lease a newer attempt of the epoch has replaced (a zombie's)."""
    if req.get("lease") != entry.lease:
        raise LeaseLost(f"store {req['path']}: a newer attempt of the epoch has begun")


def _ingest(entry: _Entry, files: list[BinFile]) -> dict[str, Any]:
    """Ingest whole bin files into ``entry``'s store (its lock held); the reply: the path
    taken, keys, bytes and seconds."""
    started = time.perf_counter()
    stats = entry.store.ingest_files(files)
    return {"method": stats.method, "keys": stats.keys, "bytes": stats.bytes,
            "seconds": time.perf_counter() - started}


def _send_chunks(sock: socket.socket, backend: StateBackend, bins: list[int], chunk_bytes: int
                 ) -> None:
    """Stream ``bins`` of ``backend`` as frames of ``(k, v)`` chunks (Arrow IPC)."""
    for chunk in backend.export_bins(bins, chunk_bytes):
        if chunk.num_rows:
            send_frame(sock, {"chunk": batch_to_ipc(chunk)})


def _stream(sock: socket.socket) -> Iterator[dict[str, Any]]:
    """The frames of a request's stream, up to its ``end`` frame."""
    while True:
        frame = recv_frame(sock)
        if frame is None:
            raise ConnectionError("a request's stream ended without its last frame")
        if frame.get("end"):
            return
        yield frame


def _durable(req: dict[str, Any]) -> DurableCopy:
    return DurableCopy(req["checkpoint"], req["worker"], req.get("snapshot_every", SNAPSHOT_EVERY))


def _reopen_empty(entry: _Entry, req: dict[str, Any]) -> None:
    """Close the entry's store, delete its directory and open it again, empty."""
    entry.store.close()
    shutil.rmtree(req["path"], ignore_errors=True)
    entry.store = _open_store(req)


def _open_store(req: dict[str, Any]) -> WorkerStore:
    """Open the store a request names, with its durable copy when it has a checkpoint."""
    return WorkerStore.open(req["kind"], req["path"], req["key_type"], req["num_bins"],
                            durable=_durable(req) if req.get("checkpoint") else None)
