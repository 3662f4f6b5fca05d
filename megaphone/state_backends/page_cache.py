"""Reading a store's table files into the OS page cache ahead of its point reads, and keeping
them there.

A point read that misses RocksDB's block cache reads a block of a table file. When that page is
not in the OS page cache, the read goes to the disk: 82 us a key against 16 us from the page
cache, measured on a 250-million-key store (``docs/worker-store.md``). Stores start cold
more often than it seems: RocksDB's ``SstFileWriter`` drops the pages of every file it writes
(bulk loads, imports), and a reopened or recovered store has nothing cached. Warming up through
the reads themselves takes hundreds of epochs at a billion keys.

:class:`PageCacheWarmer` asks the kernel to read a store's table files ahead
(``posix_fadvise(POSIX_FADV_WILLNEED)``: sequential reads, in the background) when they fit
well in the memory available, and leaves them to the reads otherwise, so a store larger than
memory never pushes the page cache of its neighbours out. It keeps the files it warmed mapped
(read-only, never read through the mapping) while they exist: a machine that reclaims page
cache proactively (DAMON's ``pageout`` of unmapped pages unused for a minute, as on the
benchmark machines) then leaves them, where a read at random touching each page every few
minutes would have them read from the disk again and again. Mapped pages stay reclaimable:
under memory pressure the kernel unmaps and drops them like any other page cache.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from dataclasses import dataclass, field

log = logging.getLogger("megaphone.page_cache")

WARM_SHARE = 4
"""A store's new table files are warmed only while they total at most this fraction
(``1 / WARM_SHARE``) of the memory available."""

TABLE_SUFFIX = ".sst"
READ_AHEAD_CHUNK = 2 << 20
"""Bytes per read-ahead request: the kernel reads at most its device read-ahead size (8 MiB
here, 128 KiB on many systems) per request, so one request for a whole file reads only its
start."""


def available_memory() -> int | None:
    """Memory the kernel could give without swapping (``MemAvailable``), in bytes; ``None``
    where the system does not say (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def table_files(path: str) -> dict[str, int]:
    """The table files directly in the store directory ``path``: name -> size in bytes. A file
    a compaction deletes between the listing and its size is left out."""
    sizes = {}
    with os.scandir(path) as entries:
        for e in entries:
            if e.name.endswith(TABLE_SUFFIX) and e.is_file():
                try:
                    sizes[e.name] = e.stat().st_size
                except FileNotFoundError:
                    continue
    return sizes


def read_ahead(paths: list[str]) -> None:
    """Ask the kernel to read each file into the page cache, a chunk at a time; a file deleted
    meanwhile (a compaction's input) is skipped."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            for offset in range(0, os.fstat(fd).st_size, READ_AHEAD_CHUNK):
                os.posix_fadvise(fd, offset, READ_AHEAD_CHUNK, os.POSIX_FADV_WILLNEED)
        except OSError as exc:
            log.debug("read-ahead of %s failed: %s", p, exc)
        finally:
            os.close(fd)


def map_resident(path: str) -> mmap.mmap | None:
    """Map the file read-only with its pages faulted in (``MAP_POPULATE``); ``None`` where the
    system cannot, or the file is empty or gone (a compaction's input)."""
    flags = getattr(mmap, "MAP_POPULATE", None)
    if flags is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | flags, prot=mmap.PROT_READ)
    except (OSError, ValueError):  # empty, or not mappable
        return None
    finally:
        os.close(fd)


@dataclass
class PageCacheWarmer:
    """Warms one store's table files once each and keeps them mapped while they exist: call
    :meth:`warm` after opening the store, after every ingestion (new files appear then) and
    now and then (a compaction's new files, its deleted inputs), and :meth:`close` with the
    store."""

    path: str
    warmed: set[str] = field(default_factory=set)
    _maps: dict[str, mmap.mmap] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closed: bool = False

    def warm(self) -> threading.Thread | None:
        """Release the mappings of deleted files, then start reading and mapping the table
        files not warmed yet, in a daemon thread (returned); ``None`` when there are none, the
        system cannot, or they total more than ``1 / WARM_SHARE`` of the available memory (then
        they are left cold)."""
        if not hasattr(os, "posix_fadvise"):
            return None
        files = table_files(self.path)
        self._release(set(files))
        new = {n: s for n, s in files.items() if n not in self.warmed}
        if not new:
            return None
        self.warmed.update(new)
        total, available = sum(new.values()), available_memory()
        if available is None or total * WARM_SHARE > available:
            log.info("not warming %s: %d bytes of tables, %s bytes of memory available",
                     self.path, total, available)
            return None
        thread = threading.Thread(target=self._load, args=(sorted(new),), daemon=True,
                                  name="megaphone-page-cache")
        thread.start()
        return thread

    def mapped(self) -> list[str]:
        """The table files kept mapped now (names)."""
        with self._lock:
            return sorted(self._maps)

    def close(self) -> None:
        """Release every mapping; files a running warm-up maps later are released at once."""
        with self._lock:
            self._closed = True
            maps, self._maps = self._maps, {}
        for m in maps.values():
            m.close()

    def _load(self, names: list[str]) -> None:
        paths = [os.path.join(self.path, n) for n in names]
        read_ahead(paths)
        for name, path in zip(names, paths, strict=True):
            m = map_resident(path)
            if m is None:
                continue
            with self._lock:
                if not self._closed:
                    self._maps[name], m = m, None
            if m is not None:
                m.close()

    def _release(self, live: set[str]) -> None:
        """Unmap the files no longer in the store (a deleted file's pages and disk space stay
        taken while it is mapped) and forget them."""
        self.warmed &= live
        with self._lock:
            gone = [self._maps.pop(n) for n in list(self._maps) if n not in live]
        for m in gone:
            m.close()
