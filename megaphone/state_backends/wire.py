"""The store service's wire format: length-prefixed msgpack frames and Arrow IPC payloads.

Each frame is a 4-byte big-endian length and a msgpack map (never pickle). Arrow data travels
inside a frame as IPC stream bytes.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack
import pyarrow as pa

_LEN = struct.Struct(">I")


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one msgpack frame."""
    body = msgpack.packb(message, use_bin_type=True)
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_frame(sock: socket.socket) -> dict[str, Any] | None:
    """Receive one frame; ``None`` if the peer closed the connection before it."""
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    body = _recv_exact(sock, _LEN.unpack(head)[0])
    if body is None:
        raise ConnectionError("connection closed in the middle of a frame")
    return msgpack.unpackb(body, raw=False)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), 1 << 20))
        if not part:
            if buf:
                raise ConnectionError("connection closed in the middle of a frame")
            return None
        buf += part
    return bytes(buf)


def batch_to_ipc(batch: pa.RecordBatch) -> bytes:
    """One record batch as Arrow IPC stream bytes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def ipc_to_batches(data: bytes) -> list[pa.RecordBatch]:
    """The record batches of Arrow IPC stream bytes."""
    return list(pa.ipc.open_stream(pa.py_buffer(data)))
