"""Writing SST files: the groups a bulk import ingests at once (:class:`SstGroup`), a bin's file
written ahead a few thousand keys at a time (:func:`write_in_chunks`) and its patch
(:func:`write_patch`), for :class:`~megaphone.state_backends.rocksdb.RocksDBBackend`."""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator

from rocksdict import Options, SstFileWriter

from megaphone.state_backends.stats import BinCounters

SST_FILE_BYTES = 64 << 20
"""Target size of one SST file written by :meth:`RocksDBBackend.import_sst`."""

AHEAD_CHUNK_KEYS = 4096
"""Keys a bin's file written ahead takes at a time: the writer checks between chunks whether an
epoch has begun, so it holds the store's lock a few milliseconds at most."""

AHEAD_PAUSE_S = 0.01
"""How long a write ahead waits before checking again whether the epoch it paused for ended."""


@contextlib.contextmanager
def new_sst(path: str, options: Options) -> Iterator[SstFileWriter]:
    """A writer of a new SST file at ``path``, finished when the block ends; the file is
    deleted if the block (or the finish) fails."""
    writer = SstFileWriter(options)
    writer.open(path)
    try:
        yield writer
        writer.finish()
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise


def write_in_chunks(path: str, options: Options, items: Iterator[tuple[bytes, bytes]],
                    check_open: Callable[[], None], pause: Callable[[], bool],
                    lock: contextlib.AbstractContextManager | None,
                    chunk: int = AHEAD_CHUNK_KEYS) -> None:
    """Write the sorted ``items`` into a new SST file at ``path``, ``chunk`` of them at a time,
    each under ``lock`` after ``check_open()`` (which raises if their store closed), waiting
    between chunks while ``pause()`` is true; the file is deleted if anything fails."""
    with new_sst(path, options) as writer:
        while True:
            with lock if lock is not None else contextlib.nullcontext():
                check_open()
                part = list(itertools.islice(items, chunk))
                collections.deque(itertools.starmap(writer.__setitem__, part), maxlen=0)
            if not part:
                break
            while pause():
                time.sleep(AHEAD_PAUSE_S)


def write_patch(path: str, options: Options, changes: Iterable[tuple[bytes, bytes | None]]
                ) -> None:
    """A patch file at ``path``: each sorted ``(key, value)`` of ``changes`` put, or deleted
    where its value is ``None`` (ingested over a file written ahead, it wins); deleted if
    writing fails."""
    with new_sst(path, options) as writer:
        for k, v in changes:
            if v is None:
                del writer[k]
            else:
                writer[k] = v


class SstGroup:
    """SST files of one ingestion: strictly increasing keys, each file about SST_FILE_BYTES."""

    _ids = 0

    def __init__(self, directory: str, options: Options, num_bins: int) -> None:
        SstGroup._ids += 1
        self.id = SstGroup._ids
        self.directory = directory
        self.options = options
        self.files: list[str] = []
        self.writer: SstFileWriter | None = None
        self.last: bytes | None = None
        self.delta = BinCounters(num_bins)

    def add(self, keys: list[bytes], values: list[bytes], delta: BinCounters) -> None:
        """Append one sorted batch (above ``last``); roll to a new file past SST_FILE_BYTES."""
        if self.writer is None:
            path = os.path.join(self.directory, f"data-{self.id}-{len(self.files)}.sst")
            self.writer = SstFileWriter(self.options)
            self.writer.open(path)
            self.files.append(path)
        collections.deque(map(self.writer.__setitem__, keys, values), maxlen=0)
        self.last = keys[-1]
        self.delta.add(delta)
        if self.writer.file_size() >= SST_FILE_BYTES:
            self.writer.finish()
            self.writer = None

    def finish(self) -> list[str]:
        """Close the open file and return every file of the group, in key order."""
        if self.writer is not None:
            self.writer.finish()
            self.writer = None
        return self.files


__all__ = ["AHEAD_CHUNK_KEYS", "SST_FILE_BYTES", "SstGroup", "new_sst", "write_in_chunks",
           "write_patch"]
