"""Bins written ahead: a sender's store writes a bin's file before the epoch that moves it, and
that epoch only adds what changed since (docs/transfer.md, "Bins written ahead").

Writing a bin of 244 k keys as an SST file costs its sender about 0.12 s of one core, inside
the epoch that moves it. The store service writes the bins its worker is to send next while it
is idle between epochs, each from a RocksDB snapshot. From the snapshot on, every key the store
writes in such a bin is noted (:meth:`PreparedBins.note`). When the bin moves, its file goes as
it is, followed by a small *patch* file holding the current value (or a deletion) of each noted
key: the receiver ingests the base file, then the patch, and holds exactly the bin's state as of
the move. Anything else that changes the bin (a drop, an ingestion) forgets its file
(:meth:`PreparedBins.forget`); so does closing the store, and a reopened store deletes the
files. This module keeps that bookkeeping; the backend writes the files.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from megaphone.errors import MegaphoneError


@dataclass
class PreparedBin:
    """Bin ``bin``'s file written ahead: its ``path`` once written (``None`` while it is being
    written), and the raw keys written in the bin since its snapshot (``dirty``)."""

    bin: int
    path: str | None = None
    dirty: set[bytes] = field(default_factory=set)


class PreparedBins:
    """A store's bins written ahead, and the keys written in them since (see the module)."""

    def __init__(self) -> None:
        """No bin written ahead."""
        self._bins: dict[int, PreparedBin] = {}
        self._tracked = np.zeros(0, dtype=np.int64)

    def __contains__(self, b: int) -> bool:
        """Whether bin ``b`` is being written ahead or has been."""
        return int(b) in self._bins

    def ready(self) -> list[int]:
        """The bins whose file is written, in bin order."""
        return sorted(b for b, p in self._bins.items() if p.path is not None)

    def pending(self) -> list[int]:
        """Every bin written ahead or being written, in bin order."""
        return sorted(self._bins)

    def start(self, b: int) -> PreparedBin:
        """Begin tracking bin ``b``: call it at the instant of the snapshot the file is written
        from, with no write in between (the store's lock held)."""
        self._bins[int(b)] = entry = PreparedBin(int(b))
        self._tracked = np.array(sorted(self._bins), dtype=np.int64)
        return entry

    def finished(self, entry: PreparedBin, path: str) -> bool:
        """Record ``entry``'s written file at ``path``; False (and the file deleted) if the bin
        was forgotten while it was written."""
        if self._bins.get(entry.bin) is not entry:
            _unlink(path)
            return False
        entry.path = path
        return True

    def note(self, keys: Sequence[bytes], bins: np.ndarray) -> None:
        """Note raw ``keys`` (of ``bins``) just written: those of tracked bins are dirty."""
        if not self._bins or not len(keys):
            return
        for i in np.flatnonzero(np.isin(bins, self._tracked)):
            self._bins[int(bins[i])].dirty.add(keys[i])

    def take(self, b: int) -> PreparedBin | None:
        """Bin ``b``'s written file and dirty keys, no longer tracked; ``None`` if not ready."""
        entry = self._bins.get(int(b))
        if entry is None or entry.path is None:
            return None
        self._drop(int(b))
        return entry

    def forget(self, bins: Iterable[int]) -> None:
        """Forget the files of ``bins`` (deleting them): their state changed in a way that is
        not a key's write (dropped, ingested), or they are no longer wanted."""
        for b in {int(b) for b in bins}.intersection(self._bins):
            entry = self._drop(b)
            if entry.path is not None:
                _unlink(entry.path)

    def clear(self) -> None:
        """Forget every bin (the store closes)."""
        self.forget(list(self._bins))

    def _drop(self, b: int) -> PreparedBin:
        entry = self._bins.pop(b)
        self._tracked = np.array(sorted(self._bins), dtype=np.int64)
        return entry


@dataclass(frozen=True)
class AheadWrite:
    """A bin's file being written ahead: its tracking ``entry``, and the ``items`` of an
    iterator created as the tracking began (RocksDB gives it a consistent view as of then),
    bounded by ``read_options`` (which it points into, so they live as long as it)."""

    entry: PreparedBin
    items: Iterator[tuple[bytes, bytes]]
    read_options: Any


class StoreClosed(MegaphoneError, RuntimeError):
    """The store a bin was being written ahead from closed meanwhile (its files went too)."""


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


__all__ = ["AheadWrite", "PreparedBin", "PreparedBins", "StoreClosed"]
