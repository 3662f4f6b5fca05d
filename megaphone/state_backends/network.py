"""The store service's network side: a TCP listener that lets a pipeline's tasks on other hosts
reach the stores this host keeps at home for it (docs/placement.md, direction 1a).

Nothing reaches a store over the network without the pipeline's secret. A task of the pipeline
on this host registers it over the service's Unix socket (:meth:`Network.register`; only
processes of the service's user can reach that socket), and the service keeps it host-locally
(mode 0600), so a restarted service still knows it. The service listens on TCP only once a
pipeline registered. A network connection is then, in order:

1. challenged: the service sends a random nonce; the client answers, within
   :data:`AUTH_TIMEOUT_S` and in a frame of at most :data:`AUTH_FRAME_BYTES`, with the
   pipeline's id and ``HMAC-SHA256(secret, nonce || pipeline id)`` (:func:`auth_mac`). The
   secret never crosses the network. A wrong MAC, a pipeline never registered here, a late or
   oversized frame: refused (:class:`NetworkRefused`), the connection dropped, no store touched;
2. bound to that pipeline: a request names a ``worker``, never a path nor another pipeline.
   The service derives the store's path from its own local directory and the bound pipeline,
   and takes the checkpoint location from the registration (:func:`network_request`). Only
   :data:`NETWORK_OPS` are served; ``release``, ``destroy``, ``shutdown`` and ``ingest``
   (which names files on this disk; a bin file comes over the network in parts,
   ``ingest_parts``) stay on the Unix socket. ``fetch`` serves only a file the bound
   pipeline's worker keeps for a pull, and ``pull`` makes this service fetch files from
   another as the bound pipeline (:mod:`~megaphone.state_backends.handoff`). ``sibling``
   names no worker but a ``shard``: the address of this host's service of that number,
   started and registered for the bound pipeline if need be, so that a task needs one known
   service of a host to reach them all.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from megaphone.errors import MegaphoneError
from megaphone.paths import local_worker_path, registration_path
from megaphone.state_backends import wire

log = logging.getLogger("megaphone.store_service")

#: The largest frame a connection may send before it is authenticated.
AUTH_FRAME_BYTES = 4096
#: Seconds a new connection has to authenticate.
AUTH_TIMEOUT_S = 10.0
#: Bytes of a pipeline's secret.
SECRET_BYTES = 32
#: The operations a network connection may run (on its pipeline's stores only).
NETWORK_OPS = frozenset({"begin", "read", "timers", "drop", "install", "ingest_parts",
                         "commit", "export", "stats", "pull", "fetch", "sibling"})
#: The network operations that concern this host's services, not one worker's store.
HOST_OPS = frozenset({"sibling"})
#: Request fields a network client may not set: they name paths on this host, or what the
#: registration fixes.
_FORBIDDEN = ("path", "prefix", "files", "checkpoint")


class NetworkRefused(MegaphoneError, PermissionError):
    """A network connection or request the service refuses: not authenticated as a registered
    pipeline, or asking for what a network client may not."""


def auth_mac(secret: bytes, nonce: bytes, pipeline_id: str) -> bytes:
    """The answer to a service's challenge ``nonce`` for ``pipeline_id``."""
    return hmac.new(secret, nonce + pipeline_id.encode(), hashlib.sha256).digest()


def new_secret() -> str:
    """A new pipeline secret, as hex text."""
    return secrets.token_hex(SECRET_BYTES)


@dataclass(frozen=True)
class Registration:
    """A pipeline registered at this host: its id, secret and checkpoint location."""

    pipeline_id: str
    secret: bytes = field(repr=False)
    checkpoint: str


def check_pipeline_id(pipeline_id: Any) -> str:
    """``pipeline_id`` if it can name a folder of this host's directory, else a
    ``ValueError``: what a request may name a pipeline by."""
    if not isinstance(pipeline_id, str) or not pipeline_id or os.sep in pipeline_id or \
            pipeline_id in (".", ".."):
        raise ValueError(f"a pipeline id that cannot name a folder: {pipeline_id!r:.80}")
    return pipeline_id


def check_registration(pipeline_id: Any, secret: Any, checkpoint: Any) -> Registration:
    """The registration of these fields, or a ``ValueError``: an id that can name a folder,
    a secret of :data:`SECRET_BYTES` bytes in hex, a checkpoint location."""
    check_pipeline_id(pipeline_id)
    try:
        raw = bytes.fromhex(secret) if isinstance(secret, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != SECRET_BYTES:
        raise ValueError(f"a pipeline secret is {SECRET_BYTES} bytes in hex")
    if not isinstance(checkpoint, str) or not checkpoint:
        raise ValueError("a registration names the pipeline's checkpoint location")
    return Registration(pipeline_id, raw, checkpoint)


class Network:
    """The registrations of one host (its local directory ``host_dir``) and the TCP listener
    of one service on it, started at the first registration (``serve(sock, guard)`` answers an
    authenticated connection's requests, each passed through ``guard`` first)."""

    def __init__(self, host_dir: str, serve: Callable[[socket.socket, Callable], None],
                 bind: str | None = None) -> None:
        self.host_dir = host_dir
        self._serve = serve
        self._bind = bind
        self._known: dict[str, Registration] = {}
        self._lock = threading.Lock()
        self._server: socketserver.ThreadingTCPServer | None = None

    def register(self, pipeline_id: Any, secret: Any, checkpoint: Any) -> list[Any]:
        """Keep a pipeline's registration (replacing an older one: the same user asks) and
        listen if not yet; the ``[host, port]`` this service listens on."""
        reg = check_registration(pipeline_id, secret, checkpoint)
        path = registration_path(self.host_dir, reg.pipeline_id)
        with self._lock:
            if self._known.get(reg.pipeline_id) != reg:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as fh:
                    json.dump({"pipeline_id": reg.pipeline_id, "secret": reg.secret.hex(),
                               "checkpoint": reg.checkpoint}, fh)
                os.replace(tmp, path)
                self._known[reg.pipeline_id] = reg
            if self._server is None:
                self._server = self._listen()
            host, port = self._server.server_address[:2]
        return [host, port]

    def registration(self, pipeline_id: str) -> Registration | None:
        """The registration of ``pipeline_id`` here (read from this host's disk after a
        restart), ``None`` if it never registered."""
        with self._lock:
            known = self._known.get(pipeline_id)
        if known is not None:
            return known
        try:
            path = registration_path(self.host_dir, check_pipeline_id(pipeline_id))
            data = json.loads(path.read_text())
            reg = check_registration(data["pipeline_id"], data["secret"], data["checkpoint"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return reg if reg.pipeline_id == pipeline_id else None

    @property
    def address(self) -> list[Any] | None:
        """``[host, port]`` of the listener, ``None`` before the first registration."""
        server = self._server
        return None if server is None else list(server.server_address[:2])

    def _listen(self) -> socketserver.ThreadingTCPServer:
        network = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                network.handle(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 64

        server = Server((self._bind or bind_address(), 0), Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                         daemon=True).start()
        log.info("store service %d listening on %s:%d", os.getpid(), *server.server_address[:2])
        return server

    def handle(self, sock: socket.socket) -> None:
        """One network connection: authenticate it, then serve its requests."""
        try:
            reg = self.authenticate(wire.no_delay(sock))
        except (NetworkRefused, wire.FrameError) as exc:
            log.warning("refused a network connection: %s", exc)
            wire.refuse(sock, exc)
            return
        except OSError:
            return
        self._serve(sock, lambda req: network_request(req, reg, self.host_dir))

    def authenticate(self, sock: socket.socket) -> Registration:
        """Challenge a new connection; its pipeline's registration once it answered right."""
        nonce = secrets.token_bytes(32)
        sock.settimeout(AUTH_TIMEOUT_S)
        wire.send_frame(sock, {"ok": True, "nonce": nonce})
        try:
            answer = wire.recv_frame(sock, AUTH_FRAME_BYTES)
        except TimeoutError:
            raise NetworkRefused(f"no answer to the challenge within {AUTH_TIMEOUT_S:.0f} s"
                                 ) from None
        if answer is None or answer.get("op") != "auth":
            raise NetworkRefused("a network connection must authenticate first")
        pipeline_id, mac = answer.get("pipeline"), answer.get("mac")
        reg = self.registration(pipeline_id) if isinstance(pipeline_id, str) else None
        expected = auth_mac(reg.secret, nonce, reg.pipeline_id) if reg is not None else b""
        if reg is None or not isinstance(mac, bytes) or not hmac.compare_digest(mac, expected):
            raise NetworkRefused("authentication failed (a pipeline not registered on this "
                                 "host, or a wrong secret)")
        sock.settimeout(None)
        wire.send_frame(sock, {"ok": True, "pid": os.getpid()})
        return reg

    def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def network_request(req: dict[str, Any], reg: Registration, host_dir: str) -> dict[str, Any]:
    """``req`` from a connection authenticated as ``reg``'s pipeline, as the service runs it:
    an allowed operation on one of that pipeline's workers, whose store path and checkpoint
    location the service sets itself, or on this host's services for that pipeline
    (:data:`HOST_OPS`). A :class:`NetworkRefused` for anything else."""
    op = req.get("op")
    if op not in NETWORK_OPS:
        raise NetworkRefused(f"operation {op!r:.40} is not served over the network")
    named = [name for name in _FORBIDDEN if name in req]
    if named:
        raise NetworkRefused(f"a network request may not name {', '.join(named)}")
    if req.get("pipeline", reg.pipeline_id) != reg.pipeline_id:
        raise NetworkRefused("a network request may name only the pipeline it authenticated as")
    if op in HOST_OPS:
        return {**req, "pipeline": reg.pipeline_id}
    worker = req.get("worker")
    if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
        raise NetworkRefused(f"a network request names a worker (an int >= 0), not {worker!r:.40}")
    path = os.path.abspath(local_worker_path(host_dir, reg.pipeline_id, worker))
    return {**req, "path": path, "checkpoint": reg.checkpoint, "pipeline": reg.pipeline_id}


def bind_address() -> str:
    """The address a service listens on: ``$MEGAPHONE_SERVICE_HOST``, else Spark's
    ``$SPARK_LOCAL_IP``, else this host's name's address."""
    chosen = os.environ.get("MEGAPHONE_SERVICE_HOST") or os.environ.get("SPARK_LOCAL_IP")
    if chosen:
        return chosen
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


__all__ = ["AUTH_FRAME_BYTES", "AUTH_TIMEOUT_S", "HOST_OPS", "NETWORK_OPS", "Network",
           "NetworkRefused", "Registration", "auth_mac", "bind_address", "check_pipeline_id",
           "check_registration", "network_request", "new_secret"]
