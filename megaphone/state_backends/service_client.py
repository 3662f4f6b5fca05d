"""Finding a host's store services: connect to one (starting it if none runs), their pids,
and asking them to release stores. :mod:`megaphone.state_backends.remote` builds the task's
handle on one store on top of it.

A host runs :func:`service_shards` services (one per core), so the stores' Python work runs in
parallel; each keeps its socket, pid file, starters' lock and log in its own directory
(:func:`megaphone.paths.service_dir`).
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
from collections.abc import Iterable, Iterator
from typing import Any

from megaphone.errors import MegaphoneError
from megaphone.paths import (
    service_dirs,
    store_lock_path,
    store_log_path,
    store_pid_path,
    store_socket_path,
)
from megaphone.state_backends.network import AUTH_FRAME_BYTES, auth_mac
from megaphone.state_backends.service_identity import code_id, process_start
from megaphone.state_backends.wire import no_delay, recv_frame, send_frame

log = logging.getLogger("megaphone.store")

#: How long a task waits for a service it started to listen.
START_TIMEOUT_S = 60.0
#: How long a task waits to reach another host's service.
CONNECT_TIMEOUT_S = 2.0
_CONNECTIONS: dict[str, _Connection] = {}


class StoreUnavailable(MegaphoneError, RuntimeError):
    """The store service could not be reached or died during a request (the epoch is retried)."""


class StoreError(MegaphoneError, RuntimeError):
    """The store service refused or failed an operation; the message names the cause."""


def service_shards() -> int:
    """How many store services this host runs: one per core (``$MEGAPHONE_STORE_SERVICES``
    overrides), so the stores' Python work (exports above all) runs in parallel; a worker's
    store always lives in service ``worker % service_shards()``."""
    wanted = os.environ.get("MEGAPHONE_STORE_SERVICES")
    return max(1, int(wanted) if wanted else min(os.cpu_count() or 1, 8))


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
        #: Pipelines registered through this connection: id -> (secret, listener address).
        self.registered: dict[str, tuple[str, list[Any]]] = {}

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
        # watched: the executor, or this process when no JVM is its ancestor (a driver, the
        # CLI), so that a service only such a process used ends as soon as it is gone
        hello = conn.call("hello", watch=executor_pid() or os.getpid())
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


def dial_network(address: tuple[str, int] | list, pipeline_id: str, secret: str,
                 timeout: float = CONNECT_TIMEOUT_S) -> _Connection:
    """An authenticated connection to the service listening at ``address`` (another host's),
    bound to ``pipeline_id`` (:mod:`megaphone.state_backends.network`): the challenge is
    answered with the pipeline's ``secret`` (hex), which never crosses the network. A
    :class:`StoreUnavailable` if the service cannot be reached, a :class:`StoreError` if it
    refuses."""
    host, port = address
    try:
        sock = no_delay(socket.create_connection((host, int(port)), timeout=timeout))
    except OSError as exc:
        raise StoreUnavailable(f"StoreUnavailable: no store service at {host}:{port}: {exc}"
                               ) from exc
    conn = _Connection(sock, 0)
    try:
        challenge = _checked(recv_frame(sock, AUTH_FRAME_BYTES))
        nonce = challenge.get("nonce")
        if not isinstance(nonce, bytes):
            raise StoreError(f"the service at {host}:{port} sent no challenge")
        send_frame(sock, {"op": "auth", "pipeline": pipeline_id,
                          "mac": auth_mac(bytes.fromhex(secret), nonce, pipeline_id)})
        conn.pid = _checked(recv_frame(sock))["pid"]
    except OSError as exc:
        conn.close()
        raise StoreUnavailable(f"StoreUnavailable: the store service at {host}:{port}: {exc}"
                               ) from exc
    except BaseException:
        conn.close()
        raise
    sock.settimeout(None)
    return conn


def sibling_address(address: tuple[str, int] | list, pipeline_id: str, secret: str,
                    shard: int) -> list[Any]:
    """The ``[host, port]`` of store service number ``shard`` of the host whose service listens
    at ``address``, asked of that service as ``pipeline_id`` (``sibling``: it starts that
    service if none runs and registers the pipeline there, docs/placement.md). A
    :class:`StoreUnavailable` if the service cannot be reached, a :class:`StoreError` if it
    refuses (a shard out of its host's range)."""
    conn = dial_network(address, pipeline_id, secret)
    try:
        found = conn.call("sibling", shard=shard).get("address")
    finally:
        conn.close()
    if not (isinstance(found, list) and len(found) == 2 and isinstance(found[0], str)
            and isinstance(found[1], int) and not isinstance(found[1], bool)):
        raise StoreError(f"the service at {address[0]}:{address[1]} answered no address for "
                         f"its service {shard}")
    return found


def register_at(local_dir: str, pipeline_id: str, secret: str, checkpoint: str) -> list[Any]:
    """Register a pipeline with the service of ``local_dir`` (started if none runs), over a
    connection of its own that is closed after; the ``[host, port]`` it listens on."""
    conn = _dial(local_dir) or _start(local_dir)
    try:
        return conn.call("register", pipeline=pipeline_id, secret=secret,
                         checkpoint=checkpoint)["address"]
    finally:
        conn.close()


def network_connect(address: tuple[str, int] | list, pipeline_id: str, secret: str
                    ) -> _Connection:
    """This process's authenticated connection to the service at ``address`` for
    ``pipeline_id`` (:func:`dial_network`), kept for the next task like a local one."""
    key = network_key(address, pipeline_id)
    conn = _CONNECTIONS.get(key)
    if conn is not None and conn.alive():
        return conn
    forget(key)
    conn = _CONNECTIONS[key] = dial_network(address, pipeline_id, secret)
    return conn


def network_key(address: tuple[str, int] | list, pipeline_id: str) -> str:
    """The key :func:`forget` drops a :func:`network_connect` connection by."""
    return f"tcp://{address[0]}:{address[1]}/{pipeline_id}"


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
        # the starter is watched from the service's first moment: if it dies before its hello
        # (a crash while the service starts), the service exits at once, not after idling
        starter = executor_pid() or os.getpid()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c",
                 "from megaphone.state_backends.service_process import main; main()", local_dir,
                 "--watch", f"{starter}:{process_start(starter)}"],
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


def service_pids(local_dir: str) -> list[int]:
    """The pids of every store service of ``local_dir`` that runs (:func:`service_shards`)."""
    return [pid for d in service_dirs(local_dir) if (pid := service_pid(d)) is not None]


def service_pid(local_dir: str) -> int | None:
    """The pid of the service of ``local_dir`` if one runs."""
    try:
        with open(store_pid_path(local_dir)) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return pid if os.path.exists(f"/proc/{pid}") else None


def release_stores(local_dir: str, prefix: str) -> list[str]:
    """Ask this host's services (those that run) to close every store under ``prefix``.

    A pipeline does this when it opens a state directory (before recovery opens the stores
    itself) and when it closes; it returns the stores that were open.
    """
    closed: list[str] = []
    for directory in service_dirs(local_dir):
        conn = _dial(directory)
        if conn is None:
            continue
        try:
            closed += conn.call("release", prefix=os.path.abspath(prefix))["closed"]
        finally:
            conn.close()
    return closed
