"""Per-bin key/byte counters, persisted as one metadata entry next to the state.

Counters make :meth:`StateBackend.bin_stats` ``O(num_bins)``: the planner asks for bin sizes every
time it plans a migration, and scanning all keys for that would cost as much as the state.
Every write computes the counter deltas vectorized (numpy ``bincount``) and persists the whole
counter blob in the same atomic write.
"""

from __future__ import annotations

import numpy as np

from megaphone.state_backends.base import BinStats

STATS_META = "megaphone.bin_stats"
"""Metadata name of the persisted counters (``2 * num_bins`` little-endian int64)."""


class BinCounters:
    """Number of keys and bytes (``len(raw key) + len(value)``) of every bin."""

    __slots__ = ("bytes", "keys", "num_bins")

    def __init__(self, num_bins: int) -> None:
        """Zeroed counters for ``num_bins`` bins."""
        self.num_bins = num_bins
        self.keys = np.zeros(num_bins, dtype=np.int64)
        self.bytes = np.zeros(num_bins, dtype=np.int64)

    # -- persistence ------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The counters as ``keys[num_bins] ++ bytes[num_bins]`` little-endian int64."""
        return np.concatenate((self.keys, self.bytes)).astype("<i8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, num_bins: int) -> BinCounters:
        """Counters decoded from :meth:`to_bytes` output (``ValueError`` if the size is wrong)."""
        if len(data) != 16 * num_bins:
            raise ValueError(f"bin counters hold {len(data)} bytes, expected {16 * num_bins}")
        arr = np.frombuffer(data, dtype="<i8").astype(np.int64)
        out = cls(num_bins)
        out.keys[:] = arr[:num_bins]
        out.bytes[:] = arr[num_bins:]
        return out

    # -- arithmetic ---------------------------------------------------------------------------

    def copy(self) -> BinCounters:
        """An independent copy (to stage updates that may not be committed)."""
        out = BinCounters(self.num_bins)
        out.keys[:] = self.keys
        out.bytes[:] = self.bytes
        return out

    def add(self, other: BinCounters) -> None:
        """Add another set of counters (deltas) in place."""
        self.keys += other.keys
        self.bytes += other.bytes

    def delta(
        self,
        bins: np.ndarray,
        key_lens: np.ndarray,
        new_lens: np.ndarray,
        old_lens: np.ndarray,
    ) -> BinCounters:
        """Counter change of writing entries (``-1`` length = absent before / deleted after).

        ``bins``, ``key_lens``, ``new_lens`` and ``old_lens`` are parallel int64 arrays over
        distinct keys.
        """
        out = BinCounters(self.num_bins)
        if bins.size == 0:
            return out
        exists = new_lens >= 0
        existed = old_lens >= 0
        dkeys = exists.astype(np.int64) - existed.astype(np.int64)
        dbytes = np.where(exists, key_lens + new_lens, 0)
        dbytes -= np.where(existed, key_lens + old_lens, 0)
        out.keys[:] = _sum_by_bin(bins, dkeys, self.num_bins)
        out.bytes[:] = _sum_by_bin(bins, dbytes, self.num_bins)
        return out

    def zero(self, bins: np.ndarray) -> None:
        """Reset the counters of ``bins`` (after they were dropped)."""
        self.keys[bins] = 0
        self.bytes[bins] = 0

    # -- views ----------------------------------------------------------------------------------

    def as_dict(self) -> dict[int, BinStats]:
        """``{bin: BinStats}`` for every bin holding at least one key."""
        nz = np.flatnonzero(self.keys)
        return {
            int(b): BinStats(int(k), int(v))
            for b, k, v in zip(nz, self.keys[nz], self.bytes[nz], strict=True)
        }

    def empty_mask(self) -> np.ndarray:
        """Boolean array, True for bins holding no key."""
        return self.keys == 0


def _sum_by_bin(bins: np.ndarray, weights: np.ndarray, num_bins: int) -> np.ndarray:
    # bincount sums in float64, exact for the integer totals of one write (< 2**53).
    return np.rint(np.bincount(bins, weights=weights, minlength=num_bins)).astype(np.int64)


def stats_from_scan(num_bins: int, bins: np.ndarray, key_lens: np.ndarray, val_lens: np.ndarray,
                    into: BinCounters | None = None) -> BinCounters:
    """Accumulate counters for scanned ``(bin, key length, value length)`` entries."""
    out = into if into is not None else BinCounters(num_bins)
    out.keys += _sum_by_bin(bins, np.ones_like(bins), num_bins)
    out.bytes += _sum_by_bin(bins, key_lens + val_lens, num_bins)
    return out
