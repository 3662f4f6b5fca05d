"""The one small interface every keyed state backend implements, plus its result records.

The Spark operator (per epoch, in a Python worker: open, read/merge/write a batch, close), the
migrator (export a set of bins, import them elsewhere, drop them at the source) and the CLI all
talk to state through :class:`StateBackend` only, so the storage engine stays swappable.

Conventions shared by all backends (see :mod:`megaphone.state_backends.encoding`):

* a *raw key* is ``4-byte big-endian bin id + encoded key``; a bin is one contiguous key range;
* a *raw value* is msgpack bytes;
* every write (``write_raw``, ``import_*``, ``drop_bins``) updates per-bin counters in the same
  atomic write, so :meth:`StateBackend.bin_stats` costs ``O(num_bins)`` and is always exact;
* event-time timers are raw keys in their bin's range (:mod:`~megaphone.state_backends.timer_keys`):
  exports, imports, drops, bin files and counters carry them like any state (bin stats count
  them), while :meth:`StateBackend.items` skips them and :meth:`StateBackend.due_timers` finds
  them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from megaphone.state_backends.bin_files import BinFile

EXPORT_SCHEMA = pa.schema([("k", pa.binary()), ("v", pa.binary())])
"""Schema of exported state chunks: raw key (with bin prefix) and msgpack value."""

DEFAULT_CHUNK_BYTES = 4 << 20
"""Default bound on the key+value bytes of one exported RecordBatch."""


@dataclass(frozen=True)
class BinStats:
    """Size of one bin: number of keys and bytes (``len(raw key) + len(value)`` summed); its
    timer keys count too (they are state that moves with the bin)."""

    keys: int
    bytes: int


@dataclass(frozen=True)
class ImportStats:
    """What one :meth:`StateBackend.import_bins` call did: path taken and volume imported."""

    method: str
    keys: int
    bytes: int


@runtime_checkable
class StateBackend(Protocol):
    """Keyed state of one worker, partitioned into ``num_bins`` bins.

    Implementations: :class:`~megaphone.state_backends.memory.MemoryBackend` and
    :class:`~megaphone.state_backends.rocksdb.RocksDBBackend`; open them with
    :func:`megaphone.state_backends.open_backend`.  A backend is used by one thread at a time.
    """

    key_type: str
    """``"int64"`` or ``"str"``: how user keys are encoded."""
    num_bins: int
    """Number of bins keys hash into (a power of two)."""
    path: str | None
    """Directory holding the state, or ``None`` for a purely in-memory backend."""
    read_only: bool
    """True when opened for reading only; writes raise ``PermissionError``."""
    last_drop_s: float
    """``time.monotonic()`` of the last :meth:`drop_bins` that deleted keys (``-inf`` before):
    the log trim holds a flush back while a move drops bins (``rocksdb_tuning.LogTrim``)."""

    # -- raw access -------------------------------------------------------------------------

    def get_raw(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Multi-get: the value bytes of every raw key, ``None`` where absent."""
        ...

    def write_raw(
        self,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        old_values: Sequence[bytes | None] | None = None,
        meta: dict[str, bytes] | None = None,
    ) -> None:
        """One atomic write of puts (``None`` value = delete), metadata and bin counters.

        ``old_values``, when given, are the current values of ``keys`` (``None`` = absent), so
        the counters can be updated without re-reading; when omitted the backend reads them.
        If a key repeats, its last value wins.
        """
        ...

    # -- decoded convenience API (a key of ``None`` is the null key, a key of its own) -------

    def get_many(self, bins: Any, keys: Any) -> list[Any | None]:
        """Decoded values of ``keys`` (living in the given ``bins``), ``None`` where absent."""
        ...

    def put_many(self, bins: Any, keys: Any, values: Sequence[Any]) -> None:
        """msgpack-encode and write ``values`` under ``keys`` in ``bins``, atomically."""
        ...

    # -- metadata ---------------------------------------------------------------------------

    def get_meta(self, name: str) -> bytes | None:
        """The metadata entry ``name`` (e.g. the last committed epoch), or ``None``."""
        ...

    def put_meta(self, name: str, value: bytes) -> None:
        """Write one metadata entry atomically."""
        ...

    # -- timers -----------------------------------------------------------------------------

    def due_timers(self, bins: Iterable[int], upto: int) -> list[bytes]:
        """Raw timer keys of ``bins`` whose time is ``<= upto`` (int64 microseconds).

        Bins come in the given order (a repeated bin once), a bin's timers in key order (time,
        then key); decode them with ``decode_timer_keys``. One seek per bin, not a scan of its
        plain keys, so an event-time operator can ask at every watermark.
        """
        ...

    # -- bin statistics -------------------------------------------------------------------

    def bin_stats(self) -> dict[int, BinStats]:
        """Keys and bytes of every non-empty bin, from the persisted counters (``O(num_bins)``)."""
        ...

    def scan_bin_stats(self) -> dict[int, BinStats]:
        """Same as :meth:`bin_stats` but recomputed by a full scan (``O(keys)``, for checks)."""
        ...

    # -- migration ----------------------------------------------------------------------------

    def export_bins(
        self, bins: Iterable[int], chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> Iterator[pa.RecordBatch]:
        """Lazily stream the state of ``bins`` as ``(k, v)`` RecordBatches in key order.

        Each batch holds at most about ``chunk_bytes`` of key+value bytes (it is closed as soon
        as it reaches the bound, so it exceeds it by less than one entry).  Read-only.
        """
        ...

    def import_chunk(self, batch: pa.RecordBatch) -> None:
        """Put one exported ``(k, v)`` batch with an atomic write (counters included)."""
        ...

    def import_sst(self, batches: Iterable[pa.RecordBatch]) -> None:
        """Bulk-load exported batches (RocksDB: SST files + ingest; memory: plain puts)."""
        ...

    def import_bins(self, batches: Iterable[pa.RecordBatch], method: str = "auto") -> ImportStats:
        """Import exported batches via ``"chunk"``, ``"sst"`` or the faster one (``"auto"``)."""
        ...

    def drop_bins(self, bins: Iterable[int]) -> None:
        """Delete every key of ``bins`` (one range per run of consecutive bins), atomically."""
        ...

    #: Whether :meth:`write_bin_file` and :meth:`ingest_bin_files` work (RocksDB: yes).
    supports_bin_files: bool

    def write_bin_file(self, b: int, min_bytes: int = 1) -> BinFile | None:
        """Bin ``b`` as one sorted SST file in the store's directory; ``None`` if it holds fewer
        than ``min_bytes`` bytes."""
        ...

    def ingest_bin_files(self, files: Sequence[BinFile]) -> ImportStats:
        """Ingest :meth:`write_bin_file` files (moved, not copied) into bins empty here, then
        the patches of files written ahead (RocksDB's ``take_ahead``)."""
        ...

    # -- inspection and lifecycle ------------------------------------------------------------

    def items(self, bins: Iterable[int] | None = None) -> Iterator[tuple[int, Any, Any]]:
        """Decoded ``(bin, key, value)`` of ``bins`` (all bins if ``None``) in key order;
        timer keys are skipped (:meth:`due_timers` reads them)."""
        ...

    def raw_items(self, bins: Iterable[int] | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Raw ``(key, value)`` bytes of ``bins`` (all bins if ``None``) in key order, timer
        keys included."""
        ...

    def checkpoint(self, dest_dir: str) -> None:
        """Write a consistent copy of the state to the new directory ``dest_dir``."""
        ...

    def flush(self) -> None:
        """Make everything written so far durable."""
        ...

    def memtable_bytes(self) -> int:
        """Bytes written since the last flush that only the write-ahead log holds on disk."""
        ...

    def flush_in_background(self) -> bool:
        """Start a flush that cannot stall writes, without waiting; whether it started."""
        ...

    def warm_page_cache(self) -> None:
        """Read the table files written since the last call into the page cache and keep them
        there while they exist (a no-op without table files)."""
        ...

    def close(self) -> None:
        """Flush and release the store; the object must not be used afterwards."""
        ...

    def __enter__(self) -> StateBackend:
        """Context-manager entry: returns the backend itself."""
        ...

    def __exit__(self, *exc: object) -> None:
        """Context-manager exit: :meth:`close`."""
        ...
