"""RocksDB state backend (rocksdict, raw mode): one DB per worker directory.

Keys are raw bytes (bin prefix first), so a bin is one contiguous key range: export is a bounded
range scan, drop is one ``delete_range`` per run of bins, and bulk import can write sorted SST
files and ingest them, bypassing the memtable and the WAL.  Every mutation is one ``WriteBatch``
(or one multi-file ingestion) that also carries the per-bin counters, so the counters never
disagree with the data, even after a crash.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from rocksdict import (
    AccessType,
    Checkpoint,
    IngestExternalFileOptions,
    Rdict,
    ReadOptions,
    SstFileWriter,
    WriteBatch,
    WriteOptions,
)

from megaphone.state_backends.backend_base import BackendBase
from megaphone.state_backends.base import ImportStats
from megaphone.state_backends.bin_files import BinFile, new_file_name, transfer_dir
from megaphone.state_backends.descriptor import INFO_META, check_info, info_bytes
from megaphone.state_backends.encoding import (
    arrow_lengths,
    bin_prefix,
    bins_of_arrow,
    meta_key,
)
from megaphone.state_backends.fresh_keys import FreshTracker
from megaphone.state_backends.kv_batches import kv_columns, sorted_unique
from megaphone.state_backends.memory import STATE_FILE
from megaphone.state_backends.page_cache import PageCacheWarmer
from megaphone.state_backends.prepared_bins import AheadWrite, PreparedBins, StoreClosed
from megaphone.state_backends.rocksdb_tuning import (
    compaction_threads_idle,
    db_options,
    flush_in_background,
    memtable_bytes,
)
from megaphone.state_backends.sst_files import (
    AHEAD_CHUNK_KEYS,
    SstGroup,
    new_sst,
    write_in_chunks,
    write_patch,
)
from megaphone.state_backends.stats import STATS_META, BinCounters
from megaphone.state_backends.timer_keys import collect_due

INGEST_DIR_PREFIX = ".megaphone-ingest-"
"""Prefix of the temporary directory (inside the DB dir) that holds SST files being ingested."""

_SYNCED = WriteOptions()
_SYNCED.sync = True
_MOVED = IngestExternalFileOptions()  # ingest by moving (hard-linking) the files in
_MOVED.set_move_files(True)


def write_in_key_order(wb: WriteBatch, keys: Sequence[bytes],
                       values: Sequence[bytes | None]) -> None:
    """Add the writes (``None`` deletes; ``keys`` unique) to ``wb``: the deletes, then the
    puts, each in key order.

    Key order makes RocksDB's write of random keys about 3x faster; sorting indexes by key
    costs less than sorting the pairs did, so the whole batch takes 0.8x of unsorted
    (bench/write_order.py: 220,000 writes, unsorted 422 ms, pairs sorted 435, this 340)."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    if None in values:
        gone = [i for i in order if values[i] is None]
        collections.deque(map(wb.delete, map(keys.__getitem__, gone)), maxlen=0)
        order = [i for i in order if values[i] is not None]
    collections.deque(map(wb.put, map(keys.__getitem__, order), map(values.__getitem__, order)),
                      maxlen=0)


class RocksDBBackend(BackendBase):
    """Keyed state in a rocksdict ``Rdict`` opened in raw mode at ``path``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        key_type: str,
        num_bins: int,
        read_only: bool = False,
    ) -> None:
        """Open or create the DB at ``path``; refuse one made for another key_type/num_bins.

        ``read_only`` opens with ``AccessType.read_only()`` (exporters while no writer is open).
        """
        super().__init__(key_type, num_bins)
        self.path = os.fspath(path)
        self.read_only = read_only
        if os.path.exists(os.path.join(self.path, STATE_FILE)):
            raise ValueError(f"{self.path} holds a memory backend, not a RocksDB store")
        exists = os.path.exists(os.path.join(self.path, "CURRENT"))
        if read_only and not exists:
            raise FileNotFoundError(f"no RocksDB state store at {self.path}")
        if exists and not read_only:  # SST files of an ingestion a crash interrupted
            for name in os.listdir(self.path):
                if name.startswith(INGEST_DIR_PREFIX):
                    shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
        self._options = db_options()
        access = AccessType.read_only(False) if read_only else AccessType.read_write()
        self._db = Rdict(self.path, self._options, access_type=access)
        try:
            self._counters = self._load_header()
        except BaseException:
            self._db.close()
            raise
        # A writer's point reads go to its table files: read them ahead while they fit in
        # memory (an exporter scans each bin once and needs no warming).
        self._warmer = None if read_only else PageCacheWarmer(self.path)
        self.warm_page_cache()
        if not read_only:
            compaction_threads_idle()  # the threads RocksDB started for it
        self._ahead = PreparedBins()  # bins written ahead (docs/transfer.md)

    def warm_page_cache(self) -> None:
        """Warm and map the table files written since the last call (an ingestion's, a
        compaction's) and unmap the ones deleted
        (:class:`~megaphone.state_backends.page_cache.PageCacheWarmer`)."""
        if self._warmer is not None and self._db is not None:
            self._warmer.warm()

    def _load_header(self) -> BinCounters:
        info = self._db.get(meta_key(INFO_META))
        if info is None:
            if not self.read_only and self._is_empty():
                counters = BinCounters(self.num_bins)
                wb = WriteBatch(raw_mode=True)
                wb.put(meta_key(INFO_META), info_bytes(self.key_type, self.num_bins))
                wb.put(meta_key(STATS_META), counters.to_bytes())
                self._db.write(wb)
                return counters
            raise ValueError(f"{self.path} is not a megaphone state store (no descriptor)")
        check_info(info, self.key_type, self.num_bins, self.path)
        blob = self._db.get(meta_key(STATS_META))
        if blob is None:
            return BinCounters(self.num_bins)
        return BinCounters.from_bytes(blob, self.num_bins)

    def _is_empty(self) -> bool:
        return next(iter(self._db.keys()), None) is None

    # ------------------------------------------------------------------ primitives

    def get_raw(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Multi-get raw values, ``None`` where absent."""
        keys = raw_keys if isinstance(raw_keys, list) else list(raw_keys)
        return self._db.get(keys) if keys else []

    def get_meta(self, name: str) -> bytes | None:
        """Read one metadata entry."""
        return self._db.get(meta_key(name))

    def _commit(
        self,
        keys: list[bytes],
        values: list[bytes | None],
        bins: np.ndarray,
        counters: BinCounters | None,
        meta: dict[str, bytes],
    ) -> None:
        wb = WriteBatch(raw_mode=True)
        put = wb.put
        write_in_key_order(wb, keys, values)
        for name, value in meta.items():
            put(meta_key(name), bytes(value))
        if counters is not None:
            put(meta_key(STATS_META), counters.to_bytes())
        # A write with metadata is a commit point (an epoch's marker): it is synced to the
        # write-ahead log's disk (about 0.4 ms here) so it survives a power loss, not only a
        # process crash. Other writes reach the log unsynced and become durable with it.
        self._db.write(wb, _SYNCED if meta else None)
        self._ahead.note(keys, bins)
        if counters is not None:
            self._counters = counters

    def _scan(self, start: int, stop: int) -> Iterator[tuple[bytes, bytes]]:
        ro = ReadOptions()
        ro.set_iterate_upper_bound(bin_prefix(stop))
        ro.fill_cache(False)  # bulk scans must not evict the operator's working set
        # rocksdict keeps a pointer to the bound owned by ``ro``: this generator frame keeps
        # ``ro`` alive for as long as the iterator runs (a temporary would leave it dangling).
        yield from self._db.items(from_key=bin_prefix(start), read_opt=ro)
        del ro

    def due_timers(self, bins: Iterable[int], upto: int) -> list[bytes]:
        """Raw timer keys of ``bins`` with time ``<= upto`` (see :class:`StateBackend`): one
        seek per bin, bounded above so it never walks into the bin's later keys."""
        return collect_due(bins, upto, self.num_bins, self._keys_between)

    def _keys_between(self, b: int, begin: bytes, end: bytes) -> list[bytes]:
        ro = ReadOptions()
        ro.set_iterate_upper_bound(end)
        # ``ro`` owns the bound rocksdict points to: it lives until the list is built.
        keys = list(self._db.keys(from_key=begin, read_opt=ro))
        del ro
        return keys

    def _drop(self, bins: np.ndarray, runs: list[tuple[int, int]], counters: BinCounters) -> None:
        wb = WriteBatch(raw_mode=True)
        for start, stop in runs:
            wb.delete_range(bin_prefix(start), bin_prefix(stop))
        wb.put(meta_key(STATS_META), counters.to_bytes())
        self._db.write(wb)
        self._ahead.forget(bins.tolist())
        self._counters = counters

    # ------------------------------------------------------------------ SST bulk import

    def _import_sst_stream(self, batches: Iterable[pa.RecordBatch]) -> ImportStats:
        """Write batches into sorted SST files in a temp dir and ingest them atomically.

        Keys of a batch are sorted (last value of a repeated key wins); whenever a batch does
        not start after the previous one, the files written so far are ingested first, so no
        ingestion holds overlapping files.  The new counters ride in an extra SST file of the
        same ingestion, keeping data and counters atomic.
        """
        self._check_writable()
        tmp = tempfile.mkdtemp(prefix=INGEST_DIR_PREFIX, dir=self.path)
        nkeys = nbytes = 0
        try:
            group = SstGroup(tmp, self._options, self.num_bins)
            tracker = FreshTracker(self)
            for batch in batches:
                k_arr, v_arr = sorted_unique(*kv_columns(batch))
                if len(k_arr) == 0:
                    continue
                bins = bins_of_arrow(k_arr)
                self._check_raw_bins(bins)
                self._ahead.forget(np.unique(bins).tolist())
                keys = k_arr.to_pylist()
                if group.last is not None and keys[0] <= group.last:
                    self._ingest(group)
                    group = SstGroup(tmp, self._options, self.num_bins)
                key_lens, val_lens = arrow_lengths(k_arr), arrow_lengths(v_arr)
                old_lens, _ = tracker.old_lens(k_arr, keys, bins)
                delta = self._counters.delta(bins, key_lens, val_lens, old_lens)
                group.add(keys, v_arr.to_pylist(), delta)
                nkeys += len(keys)
                nbytes += int(key_lens.sum() + val_lens.sum())
            self._ingest(group)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return ImportStats("sst", nkeys, nbytes)

    def _ingest(self, group: SstGroup) -> None:
        files = group.finish()
        if not files:
            return
        counters = self._counters.copy()
        counters.add(group.delta)
        meta_file = os.path.join(group.directory, f"meta-{group.id}.sst")
        writer = SstFileWriter(self._options)
        writer.open(meta_file)
        writer[meta_key(STATS_META)] = counters.to_bytes()
        writer.finish()
        self._db.ingest_external_file([*files, meta_file], _MOVED)
        self._counters = counters
        self.warm_page_cache()  # the writer dropped the new files' pages

    # ------------------------------------------------------------------ whole-bin files

    supports_bin_files = True

    def write_bin_file(self, b: int, min_bytes: int = 1) -> BinFile | None:
        """Bin ``b``'s keys and values as one sorted SST file in the store's outgoing transfer
        directory; ``None`` if the bin holds fewer than ``min_bytes`` bytes (or none). The scan
        feeds the writer in C (no Python per key); the bin's counters give its keys and bytes."""
        b = int(self._check_bin_ids([b])[0])
        keys, nbytes = int(self._counters.keys[b]), int(self._counters.bytes[b])
        if keys == 0 or nbytes < min_bytes:
            return None
        directory = transfer_dir(self.path, "out")
        os.makedirs(directory, exist_ok=True)
        name = new_file_name(b)
        path = os.path.join(directory, f"out-{name}.sst")
        with new_sst(path, self._options) as writer:
            collections.deque(itertools.starmap(writer.__setitem__, self._scan(b, b + 1)),
                              maxlen=0)
        return BinFile(b, keys, nbytes, os.path.getsize(path), path, name)

    def start_ahead(self, b: int, min_bytes: int) -> AheadWrite | None:
        """Begin writing bin ``b``'s file ahead of its move (docs/transfer.md): its state as
        of now (a RocksDB iterator's implicit snapshot), and from now on the keys written in it
        are noted. ``None`` if it holds fewer than ``min_bytes`` bytes or is already written
        ahead. Call it with the store's lock held; then :meth:`write_ahead` (without it) and
        :meth:`finish_ahead` (with it)."""
        b = int(self._check_bin_ids([b])[0])
        self._check_writable()
        if not self._wants_ahead(b, min_bytes):
            return None
        ro = ReadOptions()
        ro.set_iterate_upper_bound(bin_prefix(b + 1))
        ro.fill_cache(False)  # bulk scans must not evict the operator's working set
        # The iterator is created now, and sees the DB as of now however long it runs.
        return AheadWrite(self._ahead.start(b), self._db.items(from_key=bin_prefix(b),
                                                               read_opt=ro), ro)

    def write_ahead(self, job: AheadWrite, pause: Callable[[], bool] = lambda: False,
                    lock: contextlib.AbstractContextManager | None = None,
                    chunk: int = AHEAD_CHUNK_KEYS) -> str:
        """Write ``job``'s bin as :meth:`start_ahead` saw it into a file in the outgoing
        transfer directory (:func:`~megaphone.state_backends.sst_files.write_in_chunks`: each
        ``chunk`` of keys under ``lock``, waiting between them while ``pause()``); its path.
        :class:`StoreClosed` if the store closes first."""
        directory = transfer_dir(self.path, "out")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"out-{new_file_name(job.entry.bin)}.sst")

        def check_open() -> None:
            if self._db is None:
                raise StoreClosed(f"{self.path} closed while bin {job.entry.bin} was written "
                                  "ahead")

        write_in_chunks(path, self._options, job.items, check_open, pause, lock, chunk)
        return path

    def finish_ahead(self, job: AheadWrite, path: str) -> bool:
        """Keep ``job``'s written file (the store's lock held); False if its bin changed
        otherwise than by key writes meanwhile (the file is deleted)."""
        return self._ahead.finished(job.entry, path)

    def ahead_bins(self) -> list[int]:
        """The bins whose file is written ahead."""
        return self._ahead.ready()

    def ahead_pending(self, bins: Iterable[int], min_bytes: int) -> int:
        """How many of ``bins`` :meth:`start_ahead` would still write: not written or being
        written ahead, and holding at least ``min_bytes`` bytes."""
        return sum(1 for b in self._check_bin_ids(list(bins)).tolist()
                   if self._wants_ahead(b, min_bytes))

    def _wants_ahead(self, b: int, min_bytes: int) -> bool:
        """Whether bin ``b`` is still to write ahead: not written or being written, and holding
        at least ``min_bytes`` bytes."""
        return b not in self._ahead and bool(self._counters.keys[b]) \
            and self._counters.bytes[b] >= min_bytes

    def forget_ahead(self, keep: Iterable[int]) -> None:
        """Delete the files written ahead of every bin not in ``keep`` (no longer wanted)."""
        wanted = {int(b) for b in keep}
        self._ahead.forget([b for b in self._ahead.pending() if b not in wanted])

    def take_ahead(self, b: int) -> list[BinFile]:
        """Bin ``b`` from its file written ahead: that file, counting the bin's keys and bytes
        now, then a patch file of the keys written since its snapshot (their values now, or
        their deletion) if there are any; empty if it has no such file (or is empty now)."""
        entry = self._ahead.take(b)
        if entry is None or entry.path is None:  # (taken only once written)
            return []
        keys, nbytes = int(self._counters.keys[b]), int(self._counters.bytes[b])
        if keys == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
            return []
        name = os.path.basename(entry.path)[len("out-"):-len(".sst")]
        files = [BinFile(b, keys, nbytes, os.path.getsize(entry.path), entry.path, name,
                         "ahead")]
        if entry.dirty:
            dirty = sorted(entry.dirty)
            name = new_file_name(b)
            path = os.path.join(os.path.dirname(entry.path), f"out-{name}.sst")
            try:
                write_patch(path, self._options, zip(dirty, self.get_raw(dirty), strict=True))
            except BaseException:  # no longer tracked: its file written ahead goes too
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                raise
            files.append(BinFile(b, 0, 0, os.path.getsize(path), path, name, "patch"))
        return files

    def ingest_bin_files(self, files: Sequence[BinFile]) -> ImportStats:
        """Ingest :meth:`write_bin_file` files, moving them into the DB, in one ingestion, then
        the patches of files written ahead (:meth:`take_ahead`) in a second one.

        Their bins must be empty here. The counters are written (synced) before the files are
        ingested: a crash in between leaves counters that overstate empty bins, which the next
        attempt's drop of its arriving bins resets; the other order could leave keys that the
        counters call empty, which a drop would skip.
        """
        self._check_writable()
        if not files:
            return ImportStats("files", 0, 0)
        patches = [f for f in files if f.kind == "patch"]
        files = [f for f in files if f.kind != "patch"]
        bins = np.array([f.bin for f in files], dtype=np.int64)
        self._check_raw_bins(bins)
        if len(np.unique(bins)) != len(bins):
            raise ValueError(f"two files for one bin among bins {sorted(bins.tolist())}")
        patched = [f.bin for f in patches]
        if len(set(patched)) != len(patched) or not set(patched) <= set(bins.tolist()):
            raise ValueError(f"patches of bins {sorted(patched)} without one file written "
                             "ahead each to patch")
        full = bins[~self._counters.empty_mask()[bins]]
        if full.size:
            raise ValueError(f"bins {sorted(full.tolist())} are not empty here: a bin file "
                             "installs a whole bin")
        for f in [*files, *patches]:
            if not os.path.isfile(f.path) or os.path.getsize(f.path) != f.size:
                raise ValueError(f"bin file {f.path} is missing or not {f.size} bytes")
        self._ahead.forget(bins.tolist())
        counters = self._counters.copy()
        counters.keys[bins] += [f.keys for f in files]
        counters.bytes[bins] += [f.bytes for f in files]
        wb = WriteBatch(raw_mode=True)
        wb.put(meta_key(STATS_META), counters.to_bytes())
        self._db.write(wb, _SYNCED)
        self._counters = counters
        try:
            self._db.ingest_external_file([f.path for f in sorted(files, key=lambda f: f.bin)],
                                          _MOVED)
            if patches:  # over their bins' files written ahead: a later ingestion wins
                self._db.ingest_external_file(
                    [f.path for f in sorted(patches, key=lambda f: f.bin)], _MOVED)
        except Exception:
            self.drop_bins(bins.tolist())  # back to empty bins and matching counters
            raise
        self.warm_page_cache()  # files a writer made on this host come without their pages
        return ImportStats("files", sum(f.keys for f in files), sum(f.bytes for f in files))

    # ------------------------------------------------------------------ lifecycle

    def checkpoint(self, dest_dir: str) -> None:
        """Create a RocksDB checkpoint (hard-linked SSTs) in the new directory ``dest_dir``."""
        Checkpoint(self._db).create_checkpoint(os.fspath(dest_dir))

    def flush(self) -> None:
        """Flush the memtable to an SST file (no-op when read-only)."""
        if not self.read_only:
            self._db.flush()

    def property(self, name: str) -> str | None:
        """A RocksDB property such as ``rocksdb.estimate-pending-compaction-bytes``."""
        return self._db.property_value(name) if self._db is not None else None

    def memtable_bytes(self) -> int:
        """Bytes in the active memtable (``rocksdb.cur-size-active-mem-table``)."""
        return memtable_bytes(self._db) if self._db is not None else 0

    def flush_in_background(self) -> bool:
        """Start a flush that cannot stall writes (:func:`flush_in_background`)."""
        return not self.read_only and self._db is not None and flush_in_background(self._db)

    def close(self) -> None:
        """Flush and close the DB; safe to call twice."""
        if self._db is not None:
            self._ahead.clear()
            if self._warmer is not None:
                self._warmer.close()
            self._db.close()
            self._db = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        """Short description for logs."""
        return (f"RocksDBBackend(path={self.path!r}, key_type={self.key_type!r}, "
                f"num_bins={self.num_bins}, read_only={self.read_only})")
