"""The store service's writer of bins ahead (docs/transfer.md, "Bins written ahead"): while no
epoch runs at the service, it writes the files of the bins its stores are to send next, one bin
at a time, a few thousand keys at a time, and stops between two chunks as soon as an epoch
begins or the next is due (its stores' epochs came at a steady pace: it is their time again).
The bins come with each commit (:class:`AheadWishes`); the files live in the stores
(:meth:`~megaphone.state_backends.rocksdb.RocksDBBackend.start_ahead`).
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from megaphone.state_backends.prepared_bins import StoreClosed

log = logging.getLogger("megaphone.store_service")

#: Seconds after an epoch's first request at a store before the writer stops waiting for its
#: commit (a task that died in between).
EPOCH_OPEN_S = 30.0
#: How often the idle writer looks for work without being woken.
IDLE_POLL_S = 0.5
#: Epoch starts a store remembers to learn their pace, and how many it needs first.
PACE_STARTS = 8
MIN_PACE_STARTS = 3
#: The writer stops this share of the epochs' spacing before the next is due: a margin for a
#: start a little early (an epoch's job first routes its records, so its first request here
#: comes later than its start, and the writer stops at that request only). A billion-key
#: plan's epochs started within a millisecond of their 2 s pace, and a tenth of the spacing
#: (0.2 s) was a fifth of the writer's time between two epochs; the 2% moved its bins in 212 s
#: against 218 s with the tenth, one pair of runs (docs/transfer.md).
DUE_LEAD = 0.02


@dataclass
class AheadWishes:
    """What one store is to write ahead: its worker's next ``bins`` to send, in order, of at
    least ``min_bytes`` each; and until when an epoch counts as running there (``open_until``,
    monotonic: from its first request to its commit)."""

    bins: list[int] = field(default_factory=list)
    min_bytes: int = 1
    #: Bins leaving the worker in the epoch just committed, whose files written ahead stay
    #: for receivers that pull them yet (docs/transfer.md); none are written anew.
    leaving: list[int] = field(default_factory=list)
    open_until: float = 0.0
    starts: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_STARTS))

    def opened(self, started: object = None) -> None:
        """An epoch's request reached the store: it runs until its commit. ``started``: when
        the driver started it (``time.time()``), on an epoch's first request."""
        self.open_until = time.monotonic() + EPOCH_OPEN_S
        ok = isinstance(started, (int, float)) and not isinstance(started, bool)
        if ok and started > 0 and (not self.starts or started > self.starts[-1]):
            self.starts.append(float(started))

    def due(self, now: float) -> bool:
        """Whether the next epoch is due at wall-clock time ``now``: the epochs started at a
        steady pace (the median spacing of the last :data:`PACE_STARTS`) and the next one's
        time, less :data:`DUE_LEAD` of the spacing, has come, for up to half a spacing (an
        epoch that does not come frees the writer again). A billion-key plan's second and third
        epochs took 0.68-0.82 s while the writer wrote into their start, 0.42-0.59 s since."""
        if len(self.starts) < MIN_PACE_STARTS:
            return False
        starts = list(self.starts)
        spacing = statistics.median(b - a for a, b in itertools.pairwise(starts))
        due = starts[-1] + spacing
        return due - DUE_LEAD * spacing <= now < due + spacing / 2

    def committed(self, bins: Iterable[int] | None, min_bytes: int,
                  leaving: Iterable[int] | None = None) -> None:
        """The epoch committed; ``bins`` (``None``: unchanged) are the next to write, and the
        files of ``leaving`` bins are kept, not written."""
        self.open_until = 0.0
        self.leaving = [int(b) for b in leaving or ()]
        if bins is not None:
            self.bins, self.min_bytes = [int(b) for b in bins], max(1, int(min_bytes))

    def kept(self) -> list[int]:
        """The bins whose files written ahead stay: those to write and those leaving."""
        return [*self.bins, *self.leaving]


class AheadWriter:
    """Writes bins ahead for the stores ``entries()`` returns (objects with ``store``,
    ``lock`` and ``ahead``: :class:`AheadWishes`) while the service is not :meth:`busy`
    (``in_flight()``: requests being answered)."""

    def __init__(self, entries: Callable[[], list[Any]], in_flight: Callable[[], int],
                 stopping: threading.Event) -> None:
        """A writer whose thread starts on the first :meth:`wake`."""
        self._entries, self._in_flight, self._stopping = entries, in_flight, stopping
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def busy(self) -> bool:
        """Whether a request is being answered, or an epoch runs at one of the stores (from
        its first request to its commit) or is due there (:meth:`AheadWishes.due`): the writer
        waits meanwhile."""
        now, wall = time.monotonic(), time.time()
        return self._in_flight() > 0 or any(e.ahead.open_until > now or e.ahead.due(wall)
                                            for e in self._entries())

    def wake(self) -> None:
        """Look for work now (a commit named new bins), starting the thread on first use."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ahead-writer", daemon=True)
            self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(IDLE_POLL_S)
            self._wake.clear()
            while not self._stopping.is_set() and not self.busy():
                if not self.write_one():
                    break

    def write_one(self) -> bool:
        """Write the next bin any store wants ahead, if any; whether there was one."""
        for entry in self._entries():
            with entry.lock:
                backend = entry.store.backend
                if not backend.supports_bin_files or backend.read_only:
                    continue
                wishes: AheadWishes = entry.ahead
                backend.forget_ahead(wishes.kept())
                job = next((j for b in wishes.bins
                            if (j := backend.start_ahead(b, wishes.min_bytes)) is not None), None)
            if job is None:
                continue
            try:
                path = backend.write_ahead(job, pause=self.busy, lock=entry.lock)
            except StoreClosed:
                return True  # the store closed meanwhile: its files went with it
            except Exception as exc:  # a full disk, say: the bin goes the usual way
                log.warning("writing bin %d of %s ahead failed: %r", job.entry.bin,
                            backend.path, exc)
                with entry.lock:
                    wishes.bins = [b for b in wishes.bins if b != job.entry.bin]
                    backend.forget_ahead(wishes.kept())
                return False
            with entry.lock:
                backend.finish_ahead(job, path)
            return True
        return False


__all__ = ["DUE_LEAD", "EPOCH_OPEN_S", "MIN_PACE_STARTS", "PACE_STARTS", "AheadWishes",
           "AheadWriter"]
