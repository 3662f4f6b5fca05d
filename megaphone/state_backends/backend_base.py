"""Engine-independent half of every backend: batching, counters, export and import logic.

A concrete backend only supplies a handful of primitives (multi-get, one atomic commit, an
ordered range scan, range drop, metadata get, SST bulk load); everything the
:class:`~megaphone.state_backends.base.StateBackend` protocol promises on top of them lives here
once, so both backends behave identically byte for byte.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from megaphone.routing.bins import validate_num_bins
from megaphone.routing.keys import check_key_type
from megaphone.state_backends.base import (
    DEFAULT_CHUNK_BYTES,
    BinStats,
    ImportStats,
)
from megaphone.state_backends.bin_files import BinFile
from megaphone.state_backends.descriptor import RESERVED_META
from megaphone.state_backends.encoding import (
    arrow_lengths,
    as_bins,
    bin_runs,
    bins_of_arrow,
    bins_of_raw,
    byte_lengths,
    decode_keys,
    encode_keys,
    pack_values,
    unpack_values,
)
from megaphone.state_backends.fresh_keys import FreshTracker
from megaphone.state_backends.kv_batches import cut_batches, kv_columns, strictly_increasing
from megaphone.state_backends.stats import BinCounters, stats_from_scan
from megaphone.state_backends.timer_keys import without_timers

IMPORT_METHODS = ("auto", "chunk", "sst")
"""Accepted values of ``import_bins(method=...)``."""

SST_MIN_BYTES = 32 << 20
"""``import_bins(method="auto")`` switches to SST ingestion once an import exceeds this size."""


class BackendBase:
    """Shared implementation of :class:`~megaphone.state_backends.base.StateBackend`.

    Subclasses set ``path``/``read_only``, load ``_counters`` and implement :meth:`get_raw`,
    :meth:`_commit`, :meth:`_scan`, :meth:`_drop`, :meth:`get_meta`, :meth:`_import_sst_stream`,
    :meth:`due_timers`, :meth:`checkpoint`, :meth:`flush` and :meth:`close`.
    """

    path: str | None
    read_only: bool
    _counters: BinCounters
    last_drop_s: float = -math.inf

    def __init__(self, key_type: str, num_bins: int) -> None:
        """Validate and record the key type and bin count."""
        self.key_type = check_key_type(key_type)
        validate_num_bins(num_bins)
        self.num_bins = int(num_bins)

    # ------------------------------------------------------------------ primitives (override)

    def get_raw(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Multi-get raw values (see :class:`StateBackend`)."""
        raise NotImplementedError

    def get_meta(self, name: str) -> bytes | None:
        """Read one metadata entry (see :class:`StateBackend`)."""
        raise NotImplementedError

    def _commit(
        self,
        keys: list[bytes],
        values: list[bytes | None],
        bins: np.ndarray,
        counters: BinCounters | None,
        meta: dict[str, bytes],
    ) -> None:
        """Atomically apply puts/deletes, metadata and (if given) the new counters."""
        raise NotImplementedError

    def _scan(self, start: int, stop: int) -> Iterator[tuple[bytes, bytes]]:
        """Lazily yield raw ``(key, value)`` of bins ``start .. stop-1`` in key order."""
        raise NotImplementedError

    def _drop(self, bins: np.ndarray, runs: list[tuple[int, int]], counters: BinCounters) -> None:
        """Atomically delete the given bin runs and store ``counters``."""
        raise NotImplementedError

    def due_timers(self, bins: Iterable[int], upto: int) -> list[bytes]:
        """Raw timer keys due at ``upto`` in ``bins`` (see :class:`StateBackend`)."""
        raise NotImplementedError

    def _import_sst_stream(self, batches: Iterable[pa.RecordBatch]) -> ImportStats:
        """Bulk-load batches (RocksDB: SST files); default: chunk puts."""
        return self._import_chunks(batches)

    def checkpoint(self, dest_dir: str) -> None:
        """Copy the state to ``dest_dir`` (see :class:`StateBackend`)."""
        raise NotImplementedError

    #: Whether this backend writes and ingests whole-bin files (see :class:`StateBackend`).
    supports_bin_files = False

    def write_bin_file(self, b: int, min_bytes: int = 1) -> BinFile | None:
        """Bin ``b`` as one SST file (see :class:`StateBackend`); RocksDB only."""
        raise NotImplementedError(f"{type(self).__name__} cannot write bins as files")

    def ingest_bin_files(self, files: Sequence[BinFile]) -> ImportStats:
        """Ingest whole-bin files (see :class:`StateBackend`); RocksDB only."""
        raise NotImplementedError(f"{type(self).__name__} cannot ingest bin files")

    def flush(self) -> None:
        """Make writes durable (see :class:`StateBackend`)."""
        raise NotImplementedError

    def flush_if_volatile(self) -> None:
        """Make the last write durable if the backend has no log of its own (memory: write the
        state file); a RocksDB write is already durable through its write-ahead log."""

    def property(self, name: str) -> str | None:
        """A storage-engine property (RocksDB's ``rocksdb.*``), ``None`` where there is none."""
        return None

    def memtable_bytes(self) -> int:
        """Bytes in the active memtable (0 for a backend without one): writes since the last
        flush, which the write-ahead log holds on disk too."""
        return 0

    def flush_in_background(self) -> bool:
        """Start flushing the memtable without waiting for it, unless the flush could stall
        (see :class:`~megaphone.state_backends.rocksdb.RocksDBBackend`); whether it started."""
        return False

    def warm_page_cache(self) -> None:
        """Keep the table files' pages cached as they change (nothing for a backend without
        files; see :class:`~megaphone.state_backends.rocksdb.RocksDBBackend`)."""

    def close(self) -> None:
        """Release the store (see :class:`StateBackend`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers

    def _check_writable(self) -> None:
        if getattr(self, "_closed", False):
            raise ValueError("state backend is closed")
        if self.read_only:
            raise PermissionError(f"state backend at {self.path!r} is opened read-only")

    def _check_bin_ids(self, bins: Iterable[int]) -> np.ndarray:
        arr = np.fromiter((int(b) for b in bins), dtype=np.int64)
        return np.unique(as_bins(arr, self.num_bins))

    def _check_raw_bins(self, bins: np.ndarray) -> None:
        if bins.size and int(bins.max()) >= self.num_bins:
            raise ValueError(
                f"raw key with bin id >= num_bins={self.num_bins} (metadata keys are written "
                "through meta=..., not as raw keys)"
            )

    @staticmethod
    def _check_meta_names(meta: dict[str, bytes]) -> None:
        bad = RESERVED_META.intersection(meta)
        if bad:
            raise ValueError(f"metadata names {sorted(bad)} are reserved for the backend")
        for name, value in meta.items():
            if not isinstance(name, str) or not isinstance(value, bytes | bytearray):
                raise TypeError("metadata must map str names to bytes values")

    # ------------------------------------------------------------------ writes

    def write_raw(
        self,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        old_values: Sequence[bytes | None] | None = None,
        meta: dict[str, bytes] | None = None,
    ) -> None:
        """One atomic write of puts (``None`` = delete), ``meta`` and the bin counters.

        ``old_values`` (current values, ``None`` = absent) spare the backend a multi-get for
        the counter update; when omitted they are read.  A repeated key: last value wins.
        """
        self._check_writable()
        keys, values = list(keys), list(values)
        if len(values) != len(keys):
            raise ValueError(f"got {len(values)} values for {len(keys)} keys")
        meta = dict(meta or {})
        self._check_meta_names(meta)
        bins = bins_of_raw(keys)
        self._check_raw_bins(bins)
        old_lens = None
        if old_values is not None:
            if len(old_values) != len(keys):
                raise ValueError(f"got {len(old_values)} old values for {len(keys)} keys")
            old_lens = byte_lengths(old_values)
        self._write(keys, values, bins, old_lens, meta)

    def _write(
        self,
        keys: list[bytes],
        values: list[bytes | None],
        bins: np.ndarray,
        old_lens: np.ndarray | None,
        meta: dict[str, bytes],
        key_lens: np.ndarray | None = None,
        new_lens: np.ndarray | None = None,
        unique: bool = False,
    ) -> None:
        if not unique and len(keys) > 1:
            last = dict(zip(keys, range(len(keys)), strict=True))
            if len(last) < len(keys):  # repeated keys: keep each key's last write
                idx = np.fromiter(last.values(), dtype=np.int64, count=len(last))
                idx.sort()
                keys = [keys[i] for i in idx]
                values = [values[i] for i in idx]
                bins = bins[idx]
                old_lens = None if old_lens is None else old_lens[idx]
                key_lens = None if key_lens is None else key_lens[idx]
                new_lens = None if new_lens is None else new_lens[idx]
        if old_lens is None:
            old_lens = byte_lengths(self.get_raw(keys))
        key_lens = byte_lengths(keys) if key_lens is None else key_lens
        new_lens = byte_lengths(values) if new_lens is None else new_lens
        counters = self._counters.copy()
        counters.add(counters.delta(bins, key_lens, new_lens, old_lens))
        self._commit(keys, values, bins, counters, meta)

    def put_many(self, bins: Any, keys: Any, values: Sequence[Any]) -> None:
        """msgpack-encode ``values`` and write them under ``keys`` of ``bins`` atomically."""
        self._check_writable()
        packed = pack_values(values)
        b = as_bins(bins, self.num_bins, len(packed))
        raw = encode_keys(b, keys, self.key_type)
        self._write(raw, list(packed), b, None, {})

    def get_many(self, bins: Any, keys: Any) -> list[Any | None]:
        """Decoded values of ``keys`` in ``bins`` (``None`` where absent)."""
        raw = encode_keys(as_bins(bins, self.num_bins), keys, self.key_type)
        return unpack_values(self.get_raw(raw))

    def put_meta(self, name: str, value: bytes) -> None:
        """Write one metadata entry atomically."""
        self._check_writable()
        meta = {name: value}
        self._check_meta_names(meta)
        self._commit([], [], np.zeros(0, dtype=np.int64), None, meta)

    # ------------------------------------------------------------------ stats

    def bin_stats(self) -> dict[int, BinStats]:
        """Keys and bytes of every non-empty bin, from the persisted counters (timer keys
        count: they are state that moves with the bin)."""
        return self._counters.as_dict()

    def scan_bin_stats(self) -> dict[int, BinStats]:
        """Per-bin keys and bytes recomputed by scanning every key (for verification)."""
        out = BinCounters(self.num_bins)
        for batch in self.export_bins(range(self.num_bins), chunk_bytes=16 << 20):
            k, v = kv_columns(batch)
            stats_from_scan(self.num_bins, bins_of_arrow(k), arrow_lengths(k), arrow_lengths(v),
                            into=out)
        return out.as_dict()

    # ------------------------------------------------------------------ export / import / drop

    def export_bins(
        self, bins: Iterable[int], chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> Iterator[pa.RecordBatch]:
        """Stream the state of ``bins`` as bounded ``(k, v)`` RecordBatches in key order."""
        if chunk_bytes <= 0:
            raise ValueError("chunk_bytes must be positive")
        runs = bin_runs(self._check_bin_ids(bins))
        return cut_batches((self._scan(start, stop) for start, stop in runs), int(chunk_bytes))

    def import_chunk(self, batch: pa.RecordBatch) -> None:
        """Put one exported ``(k, v)`` batch in one atomic write (counters included)."""
        self._import_chunks([batch])

    def import_sst(self, batches: Iterable[pa.RecordBatch]) -> None:
        """Bulk-load exported batches (see :class:`StateBackend`)."""
        self._check_writable()
        self._import_sst_stream(batches)

    def import_bins(self, batches: Iterable[pa.RecordBatch], method: str = "auto") -> ImportStats:
        """Import exported batches by ``"chunk"`` puts, ``"sst"`` ingestion, or ``"auto"``.

        ``"auto"`` buffers the head of the stream until it holds :data:`SST_MIN_BYTES` of
        keys+values; it then ingests SST files if that head is in key order (as one export
        stream is) and every bin in it is empty at this receiver (the usual migration case).
        Otherwise, or for smaller imports, it uses chunk puts: an interleaved stream would cut
        the SST path into many small ingestions.  The threshold is the measured crossover in
        ``bench/RESULTS.md``.
        """
        if method not in IMPORT_METHODS:
            raise ValueError(f"unknown import method {method!r}; expected one of {IMPORT_METHODS}")
        self._check_writable()
        if method == "chunk":
            return self._import_chunks(batches)
        if method == "sst":
            return self._import_sst_stream(batches)
        it = iter(batches)
        head: list[pa.RecordBatch] = []
        size = 0
        ordered, last = True, b""
        for batch in it:
            head.append(batch)
            k, v = kv_columns(batch)
            if len(k) == 0:
                continue
            size += int(arrow_lengths(k).sum() + arrow_lengths(v).sum())
            ordered = ordered and k[0].as_py() > last and strictly_increasing(k)
            last = k[len(k) - 1].as_py()
            if size >= SST_MIN_BYTES:
                rest = itertools.chain(head, it)
                if ordered and self._bins_empty(head):
                    return self._import_sst_stream(rest)
                return self._import_chunks(rest)
        return self._import_chunks(head)

    def _bins_empty(self, batches: list[pa.RecordBatch]) -> bool:
        empty = self._counters.empty_mask()
        for batch in batches:
            bins = bins_of_arrow(kv_columns(batch)[0])
            self._check_raw_bins(bins)
            if bins.size and not bool(empty[bins].all()):
                return False
        return True

    def _import_chunks(self, batches: Iterable[pa.RecordBatch]) -> ImportStats:
        self._check_writable()
        tracker = FreshTracker(self)
        nkeys = nbytes = 0
        for batch in batches:
            k_arr, v_arr = kv_columns(batch)
            if len(k_arr) == 0:
                continue
            bins = bins_of_arrow(k_arr)
            self._check_raw_bins(bins)
            key_lens, val_lens = arrow_lengths(k_arr), arrow_lengths(v_arr)
            keys = k_arr.to_pylist()
            old_lens, unique = tracker.old_lens(k_arr, keys, bins)
            self._write(keys, v_arr.to_pylist(), bins, old_lens, {}, key_lens, val_lens, unique)
            nkeys += len(keys)
            nbytes += int(key_lens.sum() + val_lens.sum())
        return ImportStats("chunk", nkeys, nbytes)

    def drop_bins(self, bins: Iterable[int]) -> None:
        """Delete all keys of ``bins`` atomically, one range per run of consecutive bins."""
        self._check_writable()
        arr = self._check_bin_ids(bins)
        # Bins that hold no key (by the exact counters) need no range delete: a tombstone over
        # an arriving bin's range would force a memtable flush into the SST ingestion after it.
        arr = arr[~self._counters.empty_mask()[arr]]
        if arr.size == 0:
            return
        counters = self._counters.copy()
        counters.zero(arr)
        self._drop(arr, bin_runs(arr), counters)
        self.last_drop_s = time.monotonic()

    # ------------------------------------------------------------------ reading back

    def items(self, bins: Iterable[int] | None = None) -> Iterator[tuple[int, Any, Any]]:
        """Decoded ``(bin, key, value)`` of ``bins`` (all if ``None``) in key order, timer
        keys skipped (they are no plain keys)."""
        sel = range(self.num_bins) if bins is None else bins
        for batch in self.export_bins(sel, chunk_bytes=1 << 20):
            k, v = without_timers(*kv_columns(batch))
            b, keys = decode_keys(k.to_pylist(), self.key_type)
            ks = keys.tolist() if isinstance(keys, np.ndarray) else keys
            yield from zip(b.tolist(), ks, unpack_values(v.to_pylist()), strict=True)

    def raw_items(self, bins: Iterable[int] | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Raw ``(key, value)`` bytes of ``bins`` (all if ``None``) in key order."""
        sel = range(self.num_bins) if bins is None else bins
        for start, stop in bin_runs(self._check_bin_ids(sel)):
            yield from self._scan(start, stop)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> BackendBase:
        """Return the backend itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the backend."""
        self.close()
