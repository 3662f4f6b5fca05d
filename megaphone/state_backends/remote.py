"""The task side of the store service: find or start it, and a handle on one worker's store.

:func:`connect` returns this host's service connection for a local directory, starting the
service (:mod:`megaphone.state_backends.service_process`) if none runs; Python workers that
Spark reuses keep their connection from epoch to epoch. :class:`RemoteStore` is what an epoch's
task uses: ``begin`` an epoch, drop, install, read, ``commit``, or ``export`` bins.

A service that dies (killed, out of memory) surfaces as :class:`StoreUnavailable`; the driver
runs the epoch's job again, which starts a new service that reopens the stores from their
write-ahead logs (an epoch a worker committed is then replayed, not applied twice).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from megaphone.errors import MegaphoneError
from megaphone.paths import store_lock_path, store_log_path, store_pid_path, store_socket_path
from megaphone.state_backends.bin_files import BinFile
from megaphone.state_backends.service_identity import code_id
from megaphone.state_backends.wire import batch_to_ipc, ipc_to_batches, recv_frame, send_frame

log = logging.getLogger("megaphone.store")

#: How long a task waits for a service it started to listen.
START_TIMEOUT_S = 60.0
_CONNECTIONS: dict[str, _Connection] = {}


class StoreUnavailable(MegaphoneError, RuntimeError):
    """The store service could not be reached or died during a request (the epoch is retried)."""


class StoreError(MegaphoneError, RuntimeError):
    """The store service refused or failed an operation; the message names the cause."""


def default_local_dir() -> str:
    """Host-local directory for the store service: ``$MEGAPHONE_LOCAL_DIR`` or a temp dir."""
    return os.environ.get("MEGAPHONE_LOCAL_DIR") or \
        os.path.join(tempfile.gettempdir(), f"megaphone-{os.getuid()}")


def executor_pid() -> int | None:
    """The JVM this process descends from (the Spark executor; the driver in local mode)."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/comm") as fh:
                if fh.read().strip() == "java":
                    return pid
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
            pid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError):
            return None
    return None


class _Connection:
    """One socket to the service, used by one task at a time."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid  # the service's

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request, one answer."""
        try:
            send_frame(self.sock, {"op": op, **fields})
            reply = recv_frame(self.sock)
        except OSError as exc:
            raise StoreUnavailable(f"StoreUnavailable: the store service died: {exc}") from exc
        return _checked(reply)

    def send_stream(self, op: str, frames: Iterable[dict[str, Any]], **fields: Any
                    ) -> dict[str, Any]:
        """A request followed by a stream of frames, then one answer."""
        try:
            send_frame(self.sock, {"op": op, **fields})
            for frame in frames:
                send_frame(self.sock, frame)
            send_frame(self.sock, {"end": True})
            reply = recv_frame(self.sock)
        except OSError as exc:
            with contextlib.suppress(OSError):  # the service may have said why it stopped
                self.sock.settimeout(0.5)
                reply = recv_frame(self.sock)
                if reply is not None and not reply.get("ok"):
                    _checked(reply)
            raise StoreUnavailable(f"StoreUnavailable: the store service died: {exc}") from exc
        return _checked(reply)

    def receive_stream(self, op: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """A request answered by a stream of frames (until one with ``end``)."""
        try:
            send_frame(self.sock, {"op": op, **fields})
            while True:
                frame = _checked(recv_frame(self.sock))
                if frame.get("end"):
                    return
                yield frame
        except OSError as exc:
            raise StoreUnavailable(f"StoreUnavailable: the store service died: {exc}") from exc

    def alive(self) -> bool:
        """False if the service closed this connection (it stopped or died) while it was idle."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True  # nothing to read: open and idle, as it should be
        except OSError:
            return False

    def close(self) -> None:
        """Close the socket."""
        with contextlib.suppress(OSError):
            self.sock.close()


def _checked(reply: dict[str, Any] | None) -> dict[str, Any]:
    if reply is None:
        raise StoreUnavailable("StoreUnavailable: the store service closed the connection")
    if reply.get("ok") is False:
        raise StoreError(f"{reply.get('error')}: {reply.get('message')}")
    return reply


def _dial(local_dir: str) -> _Connection | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(store_socket_path(local_dir))
    except OSError:
        sock.close()
        return None
    conn = _Connection(sock, 0)
    try:
        hello = conn.call("hello", watch=executor_pid())
    except (StoreUnavailable, StoreError):
        conn.close()
        return None
    conn.pid = hello["pid"]
    if hello.get("code") != code_id():  # started by other code (before an upgrade): replace it
        log.warning("the store service %d in %s runs other code; stopping it", conn.pid,
                    local_dir)
        with contextlib.suppress(StoreUnavailable, StoreError):
            conn.call("shutdown")
        conn.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while _running(hello["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    return conn


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def connect(local_dir: str, start: bool = True) -> _Connection | None:
    """This process's connection to the service of ``local_dir``; starts one if none runs
    (unless ``start`` is False, then ``None``)."""
    conn = _CONNECTIONS.get(local_dir)
    if conn is not None and conn.alive():
        return conn
    forget(local_dir)  # the service it reached has gone since (killed, or idle and exited)
    conn = _dial(local_dir)
    if conn is None and start:
        conn = _start(local_dir)
    if conn is not None:
        _CONNECTIONS[local_dir] = conn
    return conn


def forget(local_dir: str) -> None:
    """Drop this process's connection (after an error left it in an unknown state)."""
    conn = _CONNECTIONS.pop(local_dir, None)
    if conn is not None:
        conn.close()


def _start(local_dir: str) -> _Connection:
    os.makedirs(local_dir, mode=0o700, exist_ok=True)
    with open(store_lock_path(local_dir), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per host; the others then connect
        conn = _dial(local_dir)
        if conn is not None:
            return conn
        log_path = store_log_path(local_dir)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c",
                 "from megaphone.state_backends.service_process import main; main()", local_dir],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                close_fds=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = _dial(local_dir)
            if conn is not None:
                return conn
            if proc.poll() is not None:
                break
            time.sleep(0.01)
        with open(log_path, "rb") as fh:
            tail = fh.read()[-2000:].decode(errors="replace")
        raise StoreUnavailable(f"StoreUnavailable: the store service in {local_dir} did not "
                               f"start (exit {proc.poll()}); its log ends with:\n{tail}")


def service_pid(local_dir: str) -> int | None:
    """The pid of the service of ``local_dir`` if one runs."""
    try:
        with open(store_pid_path(local_dir)) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return pid if os.path.exists(f"/proc/{pid}") else None


def release_stores(local_dir: str, prefix: str) -> list[str]:
    """Ask this host's service (if one runs) to close every store under ``prefix``.

    A pipeline does this when it opens a state directory (before recovery opens the stores
    itself) and when it closes; it returns the stores that were open.
    """
    conn = _dial(local_dir)
    if conn is None:
        return []
    try:
        return conn.call("release", prefix=os.path.abspath(prefix))["closed"]
    finally:
        conn.close()


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


class RemoteStore:
    """A task's handle on one worker's store in the service (see :class:`WorkerStore`)."""

    def __init__(self, local_dir: str, path: str, kind: str, key_type: str,
                 num_bins: int, durable: DurableSpec | None = None) -> None:
        self.local_dir = local_dir
        self.conn = connect(local_dir)
        assert self.conn is not None
        self._id: dict[str, Any] = {"path": os.path.abspath(path), "kind": kind,
                                    "key_type": key_type, "num_bins": num_bins}
        if durable is not None:
            self._id.update(checkpoint=durable.uri, worker=durable.worker,
                            snapshot_every=durable.snapshot_every,
                            committed_token=durable.committed_token)
        self.lease: int | None = None
        #: What restoring the store from its durable copy did at :meth:`begin`, if it had to.
        self.restored: dict[str, Any] | None = None
        #: The token of the store's application of the epoch: set by :meth:`begin` when it
        #: replays one, and by :meth:`commit`.
        self.token = ""

    @property
    def path(self) -> str:
        """The store's directory (absolute), as the service knows it."""
        return self._id["path"]

    @property
    def service_pid(self) -> int:
        """The pid of the service holding the store."""
        return self.conn.pid

    def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        try:
            return self.conn.call(op, **self._id, **fields)
        except StoreUnavailable:
            forget(self.local_dir)
            raise

    def begin(self, epoch: int, required: int | None = None, run: str = ""
              ) -> tuple[bool, bytes]:
        """Start this attempt of ``epoch`` in run ``run``: ``(True, b"")`` to apply it,
        ``(False, outputs)`` if this run already applied it (a retry: re-emit the stored
        outputs; an epoch another run applied is rolled back and applied again). ``required``:
        the epoch the driver committed for this worker; a store behind it is restored from its
        durable copy first (:attr:`restored`)."""
        fields = {"epoch": epoch, "current": epoch, "required": required, "run": run}
        try:
            reply = self._call("begin", **fields)
        except StoreUnavailable:  # a service that died since the last epoch: nothing changed
            self.conn = connect(self.local_dir)  # yet, so start or reach a new one once
            assert self.conn is not None
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
            forget(self.local_dir)  # the stream was cut: the connection is out of step
            raise

    def ingest(self, files: Sequence[BinFile]) -> dict[str, Any]:
        """Install arriving bins from whole-bin files in the store's incoming transfer
        directory; returns the path taken, keys, bytes, seconds."""
        return self._call("ingest", lease=self.lease, files=[f.to_wire() for f in files])

    def read(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Current values of ``raw_keys``."""
        if not raw_keys:
            return []
        return self._call("read", keys=list(raw_keys))["values"]

    def commit(self, epoch: int, keys: Sequence[bytes], values: Sequence[bytes | None],
               old: Sequence[bytes | None], outputs: bytes, installed: Sequence[int],
               run: str = "") -> dict[str, Any]:
        """The epoch's atomic write; returns its duration, the store's health figures and the
        application's ``token`` (also in :attr:`token`)."""
        reply = self._call("commit", lease=self.lease, epoch=epoch, keys=list(keys),
                           values=list(values), old=list(old), outputs=outputs,
                           installed=list(installed), run=run)
        self.token = reply["token"]
        return reply

    def export(self, bins: Sequence[int], chunk_bytes: int, required: int | None = None,
               current: int | None = None, run: str = "", file_min_bytes: int | None = None
               ) -> Iterator[pa.RecordBatch | BinFile]:
        """Stream the state of ``bins`` as ``(k, v)`` chunks, as of the driver's last commit:
        first an epoch ``current`` that another run applied is rolled back, and a store behind
        ``required`` restored from its durable copy (as at :meth:`begin`). With
        ``file_min_bytes``, a bin of at least that many bytes comes as one :class:`BinFile` on
        this host instead, where the backend can write one (the caller deletes it)."""
        finished = False
        try:
            for frame in self.conn.receive_stream("export", **self._id, bins=list(bins),
                                                  chunk_bytes=chunk_bytes, required=required,
                                                  current=current, run=run,
                                                  file_min_bytes=file_min_bytes):
                if "file" in frame:
                    yield BinFile.from_wire(frame["file"])
                else:
                    yield from ipc_to_batches(frame["chunk"])
            finished = True
        finally:
            if not finished:  # abandoned or failed mid-stream: the connection is out of step
                forget(self.local_dir)

    def stats(self, required: int | None = None, current: int | None = None, run: str = ""
              ) -> list[tuple[int, int, int]]:
        """``(bin, keys, bytes)`` of every non-empty bin of the store, as of the driver's last
        commit (caught up first, as for :meth:`export`)."""
        reply = self._call("stats", required=required, current=current, run=run)
        return [tuple(row) for row in reply["bins"]]

    def destroy(self) -> None:
        """Close the store and delete its directory (a worker left without bins)."""
        self._call("destroy")
