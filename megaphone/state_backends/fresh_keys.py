"""Which keys of an import stream are certainly absent at the receiver (no lookup needed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa

from megaphone.state_backends.encoding import byte_lengths
from megaphone.state_backends.kv_batches import strictly_increasing
from megaphone.state_backends.stats import BinCounters


class _Receiver(Protocol):
    """What the tracker reads of a backend: its committed counters and a multi-get."""

    _counters: BinCounters

    def get_raw(self, raw_keys: Sequence[bytes]) -> list[bytes | None]: ...


class FreshTracker:
    """Knows which keys of an import stream are certainly absent at the receiver.

    A bin that was empty when an increasing run of the stream started can only hold keys this
    run wrote, all smaller than the current batch; its keys need no lookup of old values.  This
    is the common migration case (the receiver does not own the bins yet) and saves a multi-get
    per imported key.  Assumes nobody else writes the imported bins during the import.
    """

    def __init__(self, backend: _Receiver) -> None:
        """Start tracking from the committed counters of ``backend``."""
        self._backend = backend
        self._fresh: np.ndarray | None = backend._counters.empty_mask()
        self._last: bytes | None = None

    def old_lens(
        self, keys_arr: pa.Array, keys: list[bytes], bins: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        """Old value length of every key (``-1`` = absent) and whether the keys are unique.

        Looks up old values only where the key is not certainly absent.
        """
        be = self._backend
        if not strictly_increasing(keys_arr):
            self._fresh, self._last = None, None
            return byte_lengths(be.get_raw(keys)), False
        if self._fresh is None or (self._last is not None and keys[0] <= self._last):
            self._fresh = be._counters.empty_mask()  # restart from what is committed now
        self._last = keys[-1]
        need = np.flatnonzero(~self._fresh[bins])
        old = np.full(len(keys), -1, dtype=np.int64)
        if need.size == len(keys):
            return byte_lengths(be.get_raw(keys)), True
        if need.size:
            old[need] = byte_lengths(be.get_raw([keys[i] for i in need]))
        return old, True
