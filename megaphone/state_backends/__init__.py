"""Keyed state backends behind one small interface (:class:`StateBackend`).

Open one with :func:`open_backend`; ``"memory"`` keeps state in dicts (optionally persisted to a
msgpack file), ``"rocksdb"`` keeps it in one RocksDB per worker directory.  Both store the same
bytes (bin-prefixed raw keys, msgpack values), so state exported from one imports into the other.
"""

from __future__ import annotations

import os

from megaphone.state_backends.base import (
    DEFAULT_CHUNK_BYTES,
    EXPORT_SCHEMA,
    BinStats,
    ImportStats,
    StateBackend,
)
from megaphone.state_backends.bin_files import TRANSFER_MODES, BinFile, check_transfer
from megaphone.state_backends.encoding import (
    META_PREFIX,
    bin_range,
    bins_range,
    decode_keys,
    encode_keys,
    meta_key,
    pack_value,
    pack_values,
    unpack_value,
    unpack_values,
)
from megaphone.state_backends.memory import MemoryBackend
from megaphone.state_backends.rocksdb import RocksDBBackend
from megaphone.state_backends.timer_keys import (
    TIMER_MARK,
    decode_timer_keys,
    encode_timer_keys,
    is_timer_key,
    timer_range,
)

BACKENDS: tuple[str, ...] = ("memory", "rocksdb")
"""Backend kinds accepted by :func:`open_backend`."""


def open_backend(
    kind: str,
    path: str | os.PathLike[str] | None,
    key_type: str,
    num_bins: int,
    read_only: bool = False,
) -> StateBackend:
    """Open (creating if needed) the ``kind`` backend at ``path`` for ``key_type``/``num_bins``.

    ``path`` may be ``None`` only for ``"memory"`` (state then lives in this process only).
    Raises ``ValueError`` for an unknown kind or a directory holding state created for another
    key_type/num_bins.
    """
    if kind == "memory":
        return MemoryBackend(key_type, num_bins, path=path, read_only=read_only)
    if kind == "rocksdb":
        if path is None:
            raise ValueError("the rocksdb backend needs a path")
        return RocksDBBackend(path, key_type, num_bins, read_only=read_only)
    raise ValueError(f"unknown state backend {kind!r}; expected one of {BACKENDS}")


def open_checkpoint(
    kind: str, path: str | os.PathLike[str], key_type: str, num_bins: int, read_only: bool = True
) -> StateBackend:
    """Open a directory written by ``StateBackend.checkpoint`` (read-only unless asked).

    Restoring a worker from a checkpoint is ``open_checkpoint(..., read_only=False)`` on a copy.
    """
    return open_backend(kind, path, key_type, num_bins, read_only=read_only)


__all__ = [
    "BACKENDS",
    "DEFAULT_CHUNK_BYTES",
    "EXPORT_SCHEMA",
    "META_PREFIX",
    "TIMER_MARK",
    "TRANSFER_MODES",
    "BinFile",
    "BinStats",
    "ImportStats",
    "MemoryBackend",
    "RocksDBBackend",
    "StateBackend",
    "bin_range",
    "bins_range",
    "check_transfer",
    "decode_keys",
    "decode_timer_keys",
    "encode_keys",
    "encode_timer_keys",
    "is_timer_key",
    "meta_key",
    "open_backend",
    "open_checkpoint",
    "pack_value",
    "pack_values",
    "timer_range",
    "unpack_value",
    "unpack_values",
]
