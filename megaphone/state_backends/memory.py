"""In-memory state backend: one dict per bin, optionally persisted to one msgpack file.

It holds exactly the bytes RocksDB would (raw keys with bin prefix, msgpack values), so the two
backends are interchangeable and export/import between them is byte-identical.  With a ``path``
the state survives across processes, which lets the Spark operator use it from separate Python
worker processes for small runs; every flush rewrites the whole file, so keep it small.

File layout of ``<path>/state.msgpack`` (msgpack, ``use_bin_type=True``; never pickle)::

    {"format": "megaphone.memory",
     "version": 1,
     "meta": {name (str): value (bin)},          # includes megaphone.backend, megaphone.bin_stats
     "bins": {bin id (int): {raw key (bin): raw value (bin)}}}

Timer keys (:mod:`megaphone.state_backends.timer_keys`) are also kept in a sorted list per bin
(rebuilt on load, not stored), so the due ones are found by bisection, not by a scan of the bin.

Writes go to a temporary file in the same directory, are fsynced and then ``os.replace``-d over
the old file, so a crash leaves either the old or the new state.  One writer per directory.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgpack
import numpy as np

from megaphone.state_backends.backend_base import BackendBase
from megaphone.state_backends.descriptor import INFO_META, check_info, info_bytes
from megaphone.state_backends.encoding import bins_of_raw
from megaphone.state_backends.stats import STATS_META, BinCounters
from megaphone.state_backends.timer_keys import TimerIndex, collect_due

STATE_FILE = "state.msgpack"
"""Name of the state file inside a memory backend directory."""

FILE_FORMAT = "megaphone.memory"
"""Value of the ``format`` field of the state file."""

_EMPTY: dict[bytes, bytes] = {}


class MemoryBackend(BackendBase):
    """Keyed state in Python dicts (``{bin: {raw key: value bytes}}``), optionally on disk."""

    def __init__(
        self,
        key_type: str,
        num_bins: int,
        path: str | os.PathLike[str] | None = None,
        read_only: bool = False,
    ) -> None:
        """Open (load ``path/state.msgpack`` if present) or create an in-memory store."""
        super().__init__(key_type, num_bins)
        self.path = None if path is None else os.fspath(path)
        self.read_only = read_only
        self._bins: dict[int, dict[bytes, bytes]] = {}
        self._meta: dict[str, bytes] = {}
        self._counters = BinCounters(self.num_bins)
        self._timers = TimerIndex()
        self._dirty = False
        self._closed = False
        if self.path is not None:
            self._open_dir(self.path)
        else:
            self._meta[INFO_META] = info_bytes(self.key_type, self.num_bins)

    def _open_dir(self, path: str) -> None:
        if os.path.exists(os.path.join(path, "CURRENT")):
            raise ValueError(f"{path} holds a RocksDB store, not a memory backend")
        file = os.path.join(path, STATE_FILE)
        if os.path.exists(file):
            self._load(file)
        elif self.read_only:
            raise FileNotFoundError(f"no memory backend state at {file}")
        else:
            os.makedirs(path, exist_ok=True)
            self._meta[INFO_META] = info_bytes(self.key_type, self.num_bins)
            self._dirty = True
            self.flush()

    def _load(self, file: str) -> None:
        with open(file, "rb") as fh:
            doc = msgpack.unpackb(fh.read(), raw=False, strict_map_key=False)
        if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
            raise ValueError(f"{file} is not a megaphone memory backend state file")
        meta = {str(k): bytes(v) for k, v in doc.get("meta", {}).items()}
        if INFO_META not in meta:
            raise ValueError(f"{file} lacks the megaphone.backend descriptor")
        check_info(meta[INFO_META], self.key_type, self.num_bins, self.path or file)
        self._meta = meta
        self._bins = {int(b): d for b, d in doc.get("bins", {}).items() if d}
        self._timers = TimerIndex.of(self._bins)
        if STATS_META in meta:
            self._counters = BinCounters.from_bytes(meta[STATS_META], self.num_bins)

    # ------------------------------------------------------------------ primitives

    def get_raw(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Multi-get raw values, ``None`` where absent."""
        keys = list(raw_keys)
        bins = bins_of_raw(keys).tolist()
        table = self._bins
        return [table.get(b, _EMPTY).get(k) for b, k in zip(bins, keys, strict=True)]

    def get_meta(self, name: str) -> bytes | None:
        """Read one metadata entry."""
        return self._meta.get(name)

    def _commit(
        self,
        keys: list[bytes],
        values: list[bytes | None],
        bins: np.ndarray,
        counters: BinCounters | None,
        meta: dict[str, bytes],
    ) -> None:
        table = self._bins
        bin_ids = bins.tolist()
        for b, k, v in zip(bin_ids, keys, values, strict=True):
            d = table.get(b)
            if v is None:
                if d is not None:
                    d.pop(k, None)
                    if not d:
                        del table[b]
                continue
            if d is None:
                d = table[b] = {}
            d[k] = v
        self._timers.update(bin_ids, keys, values)
        self._meta.update({k: bytes(v) for k, v in meta.items()})
        if counters is not None:
            self._counters = counters
            self._meta[STATS_META] = counters.to_bytes()
        self._dirty = True

    def _scan(self, start: int, stop: int) -> Iterator[tuple[bytes, bytes]]:
        if stop - start <= len(self._bins):
            bins: Iterable[int] = range(start, stop)
        else:
            bins = sorted(b for b in self._bins if start <= b < stop)
        for b in bins:
            d = self._bins.get(b)
            if d:
                yield from sorted(d.items())  # keys are unique: values are never compared

    def due_timers(self, bins: Iterable[int], upto: int) -> list[bytes]:
        """Raw timer keys of ``bins`` with time ``<= upto`` (see :class:`StateBackend`), found
        by bisecting each bin's sorted list of timer keys."""
        return collect_due(bins, upto, self.num_bins, self._timers.between)

    def _drop(self, bins: np.ndarray, runs: list[tuple[int, int]], counters: BinCounters) -> None:
        for b in bins.tolist():
            self._bins.pop(b, None)
        self._timers.drop(bins.tolist())
        self._counters = counters
        self._meta[STATS_META] = counters.to_bytes()
        self._dirty = True

    # ------------------------------------------------------------------ persistence

    def _document(self) -> dict[str, Any]:
        return {"format": FILE_FORMAT, "version": 1, "meta": self._meta, "bins": self._bins}

    def _write_file(self, directory: str) -> None:
        data = msgpack.packb(self._document(), use_bin_type=True)
        fd, tmp = tempfile.mkstemp(prefix=".state-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, os.path.join(directory, STATE_FILE))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(directory)

    def checkpoint(self, dest_dir: str) -> None:
        """Write a snapshot of the current state to the new (or empty) directory ``dest_dir``."""
        dest = os.fspath(dest_dir)
        os.makedirs(dest, exist_ok=True)
        if os.listdir(dest):
            raise FileExistsError(f"checkpoint directory {dest} is not empty")
        self._write_file(dest)

    def flush(self) -> None:
        """Write the state file atomically if anything changed (no-op without ``path``)."""
        if self.path is not None and self._dirty and not self.read_only:
            self._write_file(self.path)
        self._dirty = False

    def flush_if_volatile(self) -> None:
        """Write the state file: the memory backend has no log, so each commit rewrites it."""
        self.flush()

    def close(self) -> None:
        """Flush (when persistent) and drop the in-memory state."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._bins = {}
        self._timers = TimerIndex()

    def __repr__(self) -> str:
        """Short description for logs."""
        return (f"MemoryBackend(key_type={self.key_type!r}, num_bins={self.num_bins}, "
                f"path={self.path!r})")


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
