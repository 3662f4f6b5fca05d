"""Reading a store's table files into the OS page cache ahead of its point reads.

A point read that misses RocksDB's block cache reads a block of a table file. When that page is
not in the OS page cache, the read goes to the disk: 82 us a key against 16 us from the page
cache, measured on a 250-million-key store (``docs/worker-store.md``). Stores start cold
more often than it seems: RocksDB's ``SstFileWriter`` drops the pages of every file it writes
(bulk loads, imports), and a reopened or recovered store has nothing cached. Warming up through
the reads themselves takes hundreds of epochs at a billion keys.

:class:`PageCacheWarmer` asks the kernel to read a store's table files ahead
(``posix_fadvise(POSIX_FADV_WILLNEED)``: sequential reads, in the background) when they fit
well in the memory available, and leaves them to the reads otherwise, so a store larger than
memory never pushes the page cache of its neighbours out.
"""

from __future__ import annotations

import logging
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


@dataclass
class PageCacheWarmer:
    """Warms one store's table files once each: call :meth:`warm` after opening the store
    and after every ingestion (new files appear then)."""

    path: str
    warmed: set[str] = field(default_factory=set)

    def warm(self) -> threading.Thread | None:
        """Start reading the table files not warmed yet into the page cache, in a daemon
        thread (returned); ``None`` when there are none, the system cannot, or they total
        more than ``1 / WARM_SHARE`` of the available memory (then they are left cold)."""
        if not hasattr(os, "posix_fadvise"):
            return None
        new = {n: s for n, s in table_files(self.path).items() if n not in self.warmed}
        if not new:
            return None
        self.warmed.update(new)
        total, available = sum(new.values()), available_memory()
        if available is None or total * WARM_SHARE > available:
            log.info("not warming %s: %d bytes of tables, %s bytes of memory available",
                     self.path, total, available)
            return None
        paths = [os.path.join(self.path, n) for n in sorted(new)]
        thread = threading.Thread(target=read_ahead, args=(paths,), daemon=True,
                                  name="megaphone-page-cache")
        thread.start()
        return thread
