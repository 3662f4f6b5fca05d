"""The task side of the store service: a handle on one worker's store.

:class:`RemoteStore` is what an epoch's task uses: ``begin`` an epoch, drop, install, read,
``commit``, or ``export`` bins. It reaches the store through the connection
:mod:`megaphone.state_backends.service_client` keeps for the host's service that holds it,
started if none runs; Python workers that Spark reuses keep their connections from epoch to
epoch.

A service that dies (killed, out of memory) surfaces as :class:`StoreUnavailable`; the driver
runs the epoch's job again, which starts a new service that reopens the stores from their
write-ahead logs (an epoch a worker committed is then replayed, not applied twice).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from megaphone.paths import local_worker_path, service_dir
from megaphone.state_backends.base import DEFAULT_CHUNK_BYTES
from megaphone.state_backends.bin_files import BinFile, file_parts
from megaphone.state_backends.handoff import FileRef, LinkRef
from megaphone.state_backends.service_client import (
    StoreError,
    StoreUnavailable,
    connect,
    default_local_dir,
    forget,
    network_connect,
    network_key,
    release_stores,
    service_pid,
    service_pids,
    service_shards,
    sibling_address,
)
from megaphone.state_backends.wire import batch_to_ipc, ipc_to_batches

log = logging.getLogger("megaphone.store")


@dataclass(frozen=True)
class DurableSpec:
    """Where a worker's durable copy lives: the checkpoint location, the worker, how often
    it is snapshotted (:class:`~megaphone.state_backends.durable.DurableCopy`), and the token
    of the worker's attempt the driver's last commit took (a working copy of that epoch from
    any other attempt is restored instead of used)."""

    uri: str
    worker: int
    snapshot_every: int
    committed_token: str = ""
    #: The pipeline and its secret (hex): the task registers them with its host's service, so
    #: that the pipeline's tasks on other hosts may reach its stores there (docs/placement.md).
    pipeline_id: str = ""
    secret: str = field(default="", repr=False)


class RemoteStore:
    """A task's handle on one worker's store in the service (see :class:`WorkerStore`)."""

    def __init__(self, local_dir: str, path: str, kind: str, key_type: str,
                 num_bins: int, worker: int, durable: DurableSpec | None = None,
                 home: Sequence[Any] | None = None, sibling: int | None = None) -> None:
        """Reach the store at ``path`` of ``worker`` through the service of ``local_dir`` that
        holds that worker's stores (starting it if none runs). ``home``: the ``[host, port]``
        of the service on the worker's home, when that is another host (docs/placement.md):
        the store is reached there, over the network with the durable copy's secret
        (:attr:`remote`), or here as before if the home cannot be reached
        (:attr:`home_unreachable`). ``sibling``: ``home`` is another service of the home host,
        asked first for the address of its service number ``sibling`` (the worker's shard
        there, not reported yet)."""
        if durable is not None and durable.worker != worker:
            raise ValueError(f"the durable copy of worker {durable.worker} given for the store "
                             f"of worker {worker}")
        self.local_dir = service_dir(local_dir, worker % service_shards())
        self._path = os.path.abspath(path)
        self._durable = durable
        self._home = home
        self._sibling = sibling
        self._reached: list[Any] | None = None  # the home's service, once reached
        #: The store is its worker's home copy on another host, reached over the network.
        self.remote = False
        #: The home given could not be reached: the store is this host's copy.
        self.home_unreachable = False
        self.conn = self._connect()
        self._id: dict[str, Any] = {"kind": kind, "key_type": key_type, "num_bins": num_bins}
        if not self.remote:  # over the network the home's service derives both itself
            self._id["path"] = self._path
            if durable is not None:
                self._id["checkpoint"] = durable.uri
        if durable is not None:
            self._id.update(worker=durable.worker, snapshot_every=durable.snapshot_every,
                            committed_token=durable.committed_token)
        #: ``[host, port]`` where the service holding the store listens for the pipeline's
        #: tasks on other hosts: the home's reached over the network (:attr:`remote`), else
        #: this host's once registered (a local store with a durable copy's secret).
        self.address = self._reached if self.remote else self._register()
        self.lease: int | None = None
        #: What restoring the store from its durable copy did at :meth:`begin`, if it had to.
        self.restored: dict[str, Any] | None = None
        #: The token of the store's application of the epoch: set by :meth:`begin` when it
        #: replays one, and by :meth:`commit`.
        self.token = ""

    @property
    def path(self) -> str:
        """The store's directory (absolute) on this host."""
        return self._path

    @property
    def service_pid(self) -> int:
        """The pid of the service holding the store."""
        return self.conn.pid

    def _connect(self) -> Any:
        """The connection to the home's service (:attr:`remote`) or to this host's."""
        durable, home = self._durable, self._home
        if home is not None and durable is not None and durable.secret:
            try:
                if self._sibling is not None:
                    home = sibling_address(home, durable.pipeline_id, durable.secret,
                                           self._sibling)
                conn = network_connect(home, durable.pipeline_id, durable.secret)
            except (StoreUnavailable, StoreError) as exc:
                log.warning("worker %d's home %s:%s cannot be reached (%s); using this host's "
                            "copy", durable.worker, home[0], home[1], exc)
                self.home_unreachable = True
            else:
                self.remote, self._key = True, network_key(home, durable.pipeline_id)
                self._reached = list(home)
                return conn
        self._key = self.local_dir
        conn = connect(self.local_dir)
        assert conn is not None
        return conn

    def _register(self, conn: Any = None) -> list[Any] | None:
        """Register the pipeline's secret with the service (``conn``'s, else the store's
        unless it is :attr:`remote`), once per connection (a restarted service listens again
        only once a task registers); its listener's address."""
        durable = self._durable
        if durable is None or not durable.secret or (conn is None and self.remote):
            return None
        conn = self.conn if conn is None else conn
        known = conn.registered.get(durable.pipeline_id)
        if known is None or known[0] != durable.secret:
            reply = conn.call("register", pipeline=durable.pipeline_id,
                              secret=durable.secret, checkpoint=durable.uri)
            known = conn.registered[durable.pipeline_id] = (durable.secret, reply["address"])
        return known[1]

    def host_service(self) -> list[Any] | None:
        """``[shards, host, port]``: where this host's service for the worker's shard (one of
        ``shards``) listens for the pipeline's tasks, registered first if the store is
        :attr:`remote`; the driver keeps it so that it can home new workers on this host
        (docs/placement.md). ``None`` without a durable copy's secret, or if that service
        fails: the address is a hint, never worth failing the task."""
        address = self.address
        if self.remote:
            try:
                address = self._register(connect(self.local_dir))
            except (StoreUnavailable, StoreError):
                forget(self.local_dir)
        return None if address is None else [service_shards(), *address]

    def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        try:
            return self.conn.call(op, **self._id, **fields)
        except StoreUnavailable:
            forget(self._key)
            raise

    def begin(self, epoch: int, required: int | None = None, run: str = "",
              group_start: int | None = None, started: float = 0.0) -> tuple[bool, bytes]:
        """Start this attempt of ``epoch`` in run ``run``: ``(True, b"")`` to apply it,
        ``(False, outputs)`` if this run already applied it (a retry: re-emit the stored
        outputs; an epoch another run applied is rolled back and applied again). ``required``:
        the epoch the driver committed for this worker; a store behind it is restored from its
        durable copy first (:attr:`restored`). ``group_start``: the first epoch of the group
        ``epoch`` runs in (docs/groups.md); the driver's last commit is the epoch before it.
        ``started``: when the driver started the epoch (``time.time()``; 0 unknown), from which
        the service learns when the next is due
        (:class:`~megaphone.state_backends.ahead_writer.AheadWishes`)."""
        fields = {"epoch": epoch, "current": epoch if group_start is None else group_start,
                  "required": required, "run": run, "group_start": group_start,
                  "started": started}
        try:
            reply = self._call("begin", **fields)
        except StoreUnavailable:  # a service that died since the last epoch: nothing changed
            self.conn = self._connect()  # yet, so start or reach a new one once
            self.address = self._reached if self.remote else self._register()
            reply = self._call("begin", **fields)
        self.lease = reply["lease"]
        self.restored = reply.get("restored")
        self.token = reply.get("token", "")
        return reply["apply"], reply["outputs"]

    def drop_bins(self, bins: Sequence[int]) -> None:
        """Delete ``bins`` here."""
        if bins:
            self._call("drop", lease=self.lease, bins=list(bins))

    def install(self, chunks: Iterable[pa.RecordBatch]) -> dict[str, Any]:
        """Install exported ``(k, v)`` chunks; returns the path taken, keys, bytes, seconds."""
        try:
            return self.conn.send_stream(
                "install", ({"chunk": batch_to_ipc(c)} for c in chunks if c.num_rows),
                **self._id, lease=self.lease)
        except (StoreUnavailable, StoreError):
            forget(self._key)  # the stream was cut: the connection is out of step
            raise

    def ingest(self, files: Sequence[BinFile], part_bytes: int = DEFAULT_CHUNK_BYTES
               ) -> dict[str, Any]:
        """Install arriving bins from whole-bin files in the store's incoming transfer
        directory on this host (sent to a :attr:`remote` store's home in parts of at most
        ``part_bytes``); returns the path taken, keys, bytes, seconds."""
        if not self.remote:
            return self._call("ingest", lease=self.lease, files=[f.to_wire() for f in files])
        parts = ({"file": f.to_wire(), "offset": offset, "data": data}
                 for f in files for offset, data in file_parts(f.path, part_bytes))
        try:
            return self.conn.send_stream("ingest_parts", parts, **self._id, lease=self.lease)
        except (StoreUnavailable, StoreError):
            forget(self._key)  # the stream was cut: the connection is out of step
            raise

    def pull(self, refs: Sequence[FileRef], part_bytes: int = DEFAULT_CHUNK_BYTES
             ) -> dict[str, Any]:
        """Install arriving bins from files kept at their senders' homes: the service holding
        this store fetches them from there itself, in parts of at most ``part_bytes``
        (:mod:`~megaphone.state_backends.handoff`); returns the path taken, keys, bytes,
        seconds."""
        pipeline = self._durable.pipeline_id if self._durable is not None else ""
        return self._call("pull", lease=self.lease, pipeline=pipeline, part_bytes=part_bytes,
                          refs=[r.to_wire() for r in refs])

    def link(self, refs: Sequence[LinkRef], senders: Sequence[str]) -> dict[str, Any]:
        """Install arriving bins from files kept by sibling stores in the same state directory
        (``senders``: each ref's sender's store path): the service links and ingests them
        (:func:`~megaphone.state_backends.handoff.link_kept`); returns the path taken, keys,
        bytes, seconds."""
        return self._call("link", lease=self.lease, links=[
            {**r.to_wire(), "store": str(s)} for r, s in zip(refs, senders, strict=True)])

    def read(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Current values of ``raw_keys``."""
        if not raw_keys:
            return []
        return self._call("read", keys=list(raw_keys))["values"]

    def due_timers(self, bins: Iterable[int], upto: int) -> list[bytes]:
        """Raw timer keys of ``bins`` with time ``<= upto``, read in the service (see
        :meth:`~megaphone.state_backends.worker_store.WorkerStore.due_timers`)."""
        wanted = [int(b) for b in bins]
        if not wanted:
            return []
        return self._call("timers", bins=wanted, upto=int(upto))["keys"]

    def commit(self, epoch: int, keys: Sequence[bytes], values: Sequence[bytes | None],
               old: Sequence[bytes | None], outputs: bytes, installed: Sequence[int],
               run: str = "", group_start: int | None = None,
               ahead: Sequence[int] | None = None, ahead_min_bytes: int = 1,
               leaving: Sequence[int] = ()) -> dict[str, Any]:
        """The epoch's atomic write; returns its duration, the store's health figures, the
        bins written ahead (``ahead``) and the application's ``token`` (also in :attr:`token`).
        ``group_start``: as in :meth:`begin`. ``ahead``: the bins the worker is to send next,
        in order, which the service writes ahead while idle if they hold at least
        ``ahead_min_bytes`` (docs/transfer.md; ``None``: as before); ``leaving``: bins leaving
        at this epoch, whose files written ahead stay for receivers that pull them."""
        reply = self._call("commit", lease=self.lease, epoch=epoch, keys=list(keys),
                           values=list(values), old=list(old), outputs=outputs,
                           installed=list(installed), run=run, group_start=group_start,
                           ahead=None if ahead is None else list(ahead),
                           ahead_min_bytes=ahead_min_bytes, leaving=list(leaving))
        self.token = reply["token"]
        return reply

    def export(self, bins: Sequence[int], chunk_bytes: int, required: int | None = None,
               current: int | None = None, run: str = "", file_min_bytes: int | None = None,
               keep: bool = False, link_as: int | None = None
               ) -> Iterator[pa.RecordBatch | BinFile | FileRef | LinkRef]:
        """Stream the state of ``bins`` as ``(k, v)`` chunks, as of the driver's last commit:
        first an epoch ``current`` that another run applied is rolled back, and a store behind
        ``required`` restored from its durable copy (as at :meth:`begin`). With
        ``file_min_bytes``, a bin of at least that many bytes comes as one :class:`BinFile` on
        this host instead, where the backend can write one (the caller deletes it). With
        ``keep``, such a file stays where the store is, for the receiver's home to pull, and a
        :class:`FileRef` to it comes instead (if the service listens for other hosts). With
        ``link_as`` (the sending worker; and ``current``), it stays there for a sibling store's
        service to link, and a :class:`LinkRef` to it comes instead."""
        finished = False
        if self.remote and not keep:  # a file would be written on the home's disk, out of
            file_min_bytes = None  # this task's reach
        try:
            for frame in self.conn.receive_stream("export", **self._id, bins=list(bins),
                                                  chunk_bytes=chunk_bytes, required=required,
                                                  current=current, run=run,
                                                  file_min_bytes=file_min_bytes, keep=keep,
                                                  link=link_as is not None and
                                                  current is not None):
                if "ref" in frame:
                    yield FileRef.from_wire(frame["ref"])
                elif "kept" in frame and link_as is not None:
                    yield LinkRef(BinFile.from_wire(frame["kept"]), link_as)
                elif "file" in frame:
                    yield BinFile.from_wire(frame["file"])
                else:
                    yield from ipc_to_batches(frame["chunk"])
            finished = True
        finally:
            if not finished:  # abandoned or failed mid-stream: the connection is out of step
                forget(self._key)

    def stats(self, required: int | None = None, current: int | None = None, run: str = ""
              ) -> list[tuple[int, int, int]]:
        """``(bin, keys, bytes)`` of every non-empty bin of the store, as of the driver's last
        commit (caught up first, as for :meth:`export`)."""
        reply = self._call("stats", required=required, current=current, run=run)
        return [tuple(row) for row in reply["bins"]]

    def destroy(self) -> None:
        """Close the store and delete its directory (a worker left without bins)."""
        self._call("destroy")


def prune_copies(local_dir: str, pipeline_id: str, workers: Iterable[int]) -> list[int]:
    """Ask this host's services to delete their copies of ``pipeline_id``'s ``workers``,
    which are at home on other hosts (docs/placement.md); the workers whose copy went. Only
    copies found on this host's disk are named (a service is started for them if none runs)."""
    shards = service_shards()
    by_shard: dict[int, list[int]] = {}
    for w in workers:
        if os.path.isdir(local_worker_path(local_dir, pipeline_id, w)):
            by_shard.setdefault(w % shards, []).append(int(w))
    deleted: list[int] = []
    for shard, names in sorted(by_shard.items()):
        conn = connect(service_dir(local_dir, shard))
        assert conn is not None
        deleted += conn.call("prune", pipeline=pipeline_id, workers=names)["deleted"]
    return deleted


__all__ = ["DurableSpec", "RemoteStore", "StoreError", "StoreUnavailable", "connect",
           "default_local_dir", "forget", "prune_copies", "release_stores", "service_pid",
           "service_pids", "service_shards"]
