"""How megaphone's RocksDB stores are tuned, and how a slowly written store's log stays short.

:func:`db_options` are the options of every store. :class:`LogTrim` is the store service's
rule for flushing a memtable RocksDB would leave unflushed for hours, and
:func:`flush_in_background` the flush it may start without risking a write stall
(``docs/worker-store.md`` has the numbers behind both).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Env, Options, Rdict

from megaphone.state_backends.base import StateBackend

log = logging.getLogger("megaphone.store_service")

BLOCK_CACHE_BYTES = 64 << 20
"""Capacity of the block cache shared by every RocksDB backend of a process."""

#: A store's memtable holding at least ``LOG_TRIM_BYTES`` that RocksDB has not flushed for
#: ``LOG_TRIM_AGE_S`` is flushed between two operations. A store written slowly would otherwise
#: keep up to its 64 MiB memtable's worth of write-ahead log on disk, growing for hours (the
#: soak's working copies grew 3 MiB a minute). A store written fast fills its memtable first.
LOG_TRIM_BYTES = 1 << 20
LOG_TRIM_AGE_S = 120.0
#: A store that a move is taking bins from (its worker has bins still to send, or it dropped
#: some in the last ``DROP_QUIET_S``) keeps its memtable unflushed until ``LOG_TRIM_MAX_AGE_S``:
#: a flush carries the drops' range deletions into the tree, and RocksDB at once rewrites every
#: table file they cover (``docs/transfer.md``, "The senders' compaction"); flushed after the
#: move's last drop, the store is rewritten once, after the move, instead of once in its middle
#: and again for the drops after the flush.
DROP_QUIET_S = 30.0
LOG_TRIM_MAX_AGE_S = 600.0
#: A background flush is started only below this many L0 files (RocksDB compacts at 4 and
#: slows writes at 20).
_L0_QUIET = 4
#: A table file being written is handed to the disk every this many bytes (RocksDB's
#: ``bytes_per_sync``), by the writing thread and so at its I/O priority (a compaction's: idle),
#: instead of piling up dirty pages that the kernel's flusher later writes in one burst while
#: an epoch's ingestion waits for its own sync.
BYTES_PER_SYNC = 1 << 20
_CACHE: Cache | None = None
_COMPACTIONS_YIELD = False
#: Linux's scheduling class for work that runs only when a core is otherwise idle (``None``
#: where the platform has none), and the name RocksDB gives its compaction threads.
_SCHED_IDLE: int | None = getattr(os, "SCHED_IDLE", None) if hasattr(os, "sched_setscheduler") \
    else None
_LOW_POOL = "rocksdb:low"


def _block_cache() -> Cache:
    global _CACHE
    if _CACHE is None:
        _CACHE = Cache(BLOCK_CACHE_BYTES)
    return _CACHE


def compactions_yield() -> None:
    """Run this process's RocksDB compactions in the idle I/O class and, where Linux's
    ``SCHED_IDLE`` is missing, at nice 19 (flushes keep their priorities); with it,
    :func:`compaction_threads_idle` puts them in that class. Dropping half of a store's bins
    made RocksDB rewrite all of it at once (1.7 GB, 41 CPU-seconds per store in the billion-key
    run), and at equal priority that took the cores and the disk from the epochs for a minute
    (docs/transfer.md, "The senders' compaction"). Process-wide (RocksDB's default
    environment), so applied once."""
    global _COMPACTIONS_YIELD
    if not _COMPACTIONS_YIELD:
        env = Env()
        if _SCHED_IDLE is None:
            env.lower_thread_pool_cpu_priority()
        env.lower_thread_pool_io_priority()
        _COMPACTIONS_YIELD = True


def compaction_threads_idle() -> int:
    """Put this process's RocksDB compaction threads (its low-priority pool, ``rocksdb:low``)
    in Linux's ``SCHED_IDLE`` class, and return how many it moved there (0 without that class).
    They then run only on a core nothing else wants, and a task that wakes takes the core from
    them at once; at nice 19 a waking task could wait out the compaction's time slice, and
    epochs without any move took up to 0.8 s against 0.4 s while a billion-key sender compacted
    (docs/transfer.md, "The senders' compaction"). RocksDB starts and names its threads while a
    store opens and never changes their class itself (it is not asked for nice 19, see
    :func:`compactions_yield`), so a writing store's open calls this once."""
    if _SCHED_IDLE is None or not os.path.isdir("/proc/self/task"):
        return 0
    moved = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                if fh.read().strip() != _LOW_POOL:
                    continue
            if os.sched_getscheduler(int(tid)) != _SCHED_IDLE:
                os.sched_setscheduler(int(tid), _SCHED_IDLE, os.sched_param(0))
                moved += 1
        except OSError:  # the thread ended meanwhile
            continue
    return moved


def db_options() -> Options:
    """RocksDB options for a streaming state store (raw keys, LZ4, bloom filters, shared cache).

    Point lookups dominate the per-epoch merge, so tables use 4 KiB blocks and 10-bit bloom
    filters (kept by the table readers, outside the shared data-block cache, so scans cannot
    evict them), and every level uses LZ4: a point read that misses the block cache
    decompresses a block, which took 14-19 us a key with ZSTD against 7.6-7.7 us with LZ4,
    for 1.4x the bytes on disk (``docs/worker-store.md``). Compactions yield the CPU to
    the epochs (:func:`compactions_yield`).
    """
    compactions_yield()
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    cpus = os.cpu_count() or 2
    opts.increase_parallelism(max(2, cpus))
    opts.set_max_background_jobs(max(2, cpus))
    opts.set_write_buffer_size(64 << 20)
    opts.set_max_write_buffer_number(3)
    opts.set_target_file_size_base(64 << 20)
    opts.set_level_compaction_dynamic_level_bytes(True)
    opts.set_compression_type(DBCompressionType.lz4())
    opts.set_keep_log_file_num(2)
    opts.set_bytes_per_sync(BYTES_PER_SYNC)
    table = BlockBasedOptions()
    table.set_block_cache(_block_cache())
    table.set_block_size(4 << 10)
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def memtable_bytes(db: Rdict) -> int:
    """Bytes in the DB's active memtable: writes since its last flush."""
    return db.property_int_value("rocksdb.cur-size-active-mem-table") or 0


def flush_in_background(db: Rdict) -> bool:
    """Start flushing the memtable (not waiting), but only when RocksDB has nothing to catch
    up on: no memtable waiting for its flush, few L0 files, no compaction owed. A manual flush
    otherwise first waits until it cannot cause a write stall, which took 40 s in the
    billion-key run; here it is skipped and tried again later. Returns whether it started."""
    if (db.property_int_value("rocksdb.num-immutable-mem-table")
            or (db.property_int_value("rocksdb.num-files-at-level0") or 0) >= _L0_QUIET
            or db.property_int_value("rocksdb.estimate-pending-compaction-bytes")):
        return False
    db.flush(False)
    return True


@dataclass
class LogTrim:
    """How long a store's memtable has gone unflushed; flushes it once due (see
    ``LOG_TRIM_BYTES``). The service asks on every housekeeping round, holding the store."""

    since: float = field(default_factory=time.monotonic)  # the memtable's last flush
    seen: int = 0  # its size then

    def trim(self, backend: StateBackend, now: float, sending: bool = False) -> bool:
        """Flush ``backend``'s memtable if it is big and old enough, no move is taking bins
        from it (``sending``: its worker has bins still to send; or it dropped some lately),
        up to ``LOG_TRIM_MAX_AGE_S``, and the flush cannot stall writes (else a later round
        tries again); whether a flush started."""
        size = backend.memtable_bytes()
        if size < self.seen:  # RocksDB flushed it meanwhile
            self.since = now
        self.seen = size
        age = now - self.since
        moving = sending or now - backend.last_drop_s < DROP_QUIET_S
        if size < LOG_TRIM_BYTES or age < LOG_TRIM_AGE_S \
                or (moving and age < LOG_TRIM_MAX_AGE_S) \
                or not backend.flush_in_background():
            return False
        self.since, self.seen = now, 0
        log.info("flushing %s (%d bytes in its memtable)", backend.path, size)
        return True
