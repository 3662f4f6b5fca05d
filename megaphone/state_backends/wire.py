"""The store service's wire format: length-prefixed msgpack frames and Arrow IPC payloads.

Each frame is a 4-byte big-endian length and a msgpack map (never pickle). Arrow data travels
inside a frame as IPC stream bytes. Frames are bounded (:data:`MAX_FRAME_BYTES`, checked on
the length before anything is read), a frame's body must arrive within
:data:`FRAME_TIMEOUT_S` of its header, and anything that is not one msgpack map is refused:
:class:`FrameError`, after which the connection cannot be trusted and is dropped.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any

import msgpack
import pyarrow as pa

from megaphone.errors import MegaphoneError

_LEN = struct.Struct(">I")
#: The largest frame sent or received (1 GiB): far above a chunk of moving state
#: (``chunk_bytes``, 4 MiB by default) or an epoch's storage calls here, far below what the
#: 4-byte length allows; a length above it is refused before its body is read.
MAX_FRAME_BYTES = 1 << 30
#: Seconds a frame's body may take to arrive once its length did (a stalled peer frees the
#: service's thread); between frames a connection may stay idle (a worker keeps its own).
FRAME_TIMEOUT_S = 120.0


class FrameError(MegaphoneError, ConnectionError):
    """A frame that is too large, cut short, stalled or not a msgpack map: the peer does not
    speak this protocol (or is broken), and the connection is dropped."""


def no_delay(sock: socket.socket) -> socket.socket:
    """Turn Nagle's algorithm off on a TCP ``sock``: a frame written right after another (a
    file's last part, then its end frame) otherwise waits for the peer's delayed ACK, about
    40 ms on Linux, per exchange (measured on loopback: 44 ms per fetch with it, 0.1 ms
    without)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one msgpack frame (a :class:`FrameError` if it exceeds :data:`MAX_FRAME_BYTES`)."""
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte "
                         "limit (lower chunk_bytes, or smaller epochs)")
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES
               ) -> dict[str, Any] | None:
    """Receive one frame; ``None`` if the peer closed the connection before it. A
    :class:`FrameError` for a frame that is larger than ``max_bytes``, cut short, stalled or
    not a map."""
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    size = _LEN.unpack(head)[0]
    if size > max_bytes:
        raise FrameError(f"a frame of {size} bytes announced, above the {max_bytes}-byte limit")
    previous = sock.gettimeout()
    sock.settimeout(FRAME_TIMEOUT_S if previous is None else min(previous, FRAME_TIMEOUT_S))
    try:
        body = _recv_exact(sock, size)
    except TimeoutError:
        raise FrameError(f"a frame's {size} bytes did not arrive within {FRAME_TIMEOUT_S:.0f} s"
                         ) from None
    finally:
        sock.settimeout(previous)
    if body is None:
        raise FrameError("connection closed in the middle of a frame")
    try:
        message = msgpack.unpackb(body, raw=False)
    except Exception as exc:  # msgpack raises several types for malformed input
        raise FrameError(f"a frame that is not msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(message, dict):
        raise FrameError(f"a frame that is not a msgpack map: {type(message).__name__}")
    return message


def refuse(sock: socket.socket, error: Exception) -> None:
    """Tell the peer why its connection is dropped, if it still listens."""
    with contextlib.suppress(OSError):
        send_frame(sock, {"ok": False, "error": type(error).__name__, "message": str(error)})


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), 1 << 20))
        if not part:
            if buf:
                raise FrameError("connection closed in the middle of a frame")
            return None
        buf += part
    return bytes(buf)


def batch_to_ipc(batch: pa.RecordBatch | pa.Table) -> bytes:
    """One record batch (or a table's batches) as Arrow IPC stream bytes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write(batch)
    return sink.getvalue().to_pybytes()


def ipc_to_batches(data: bytes) -> list[pa.RecordBatch]:
    """The record batches of Arrow IPC stream bytes."""
    return list(pa.ipc.open_stream(pa.py_buffer(data)))
