"""XXH64 (seed 42) in vectorized numpy, bit-exact with Spark SQL's ``xxhash64``.

Arrays of keys are hashed without a per-key Python loop: int64 keys as 8 little-endian bytes,
strings as their UTF-8 bytes. Inputs are the normalized forms of :mod:`megaphone.routing.keys`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["SEED", "hash_int64", "hash_strings"]

#: Seed of Spark SQL's ``xxhash64`` function; the bins of the driver and the JVM must agree.
SEED: int = 42

# XXH64 primes and the seed, as numpy scalars so every operation stays in wrapping uint64.
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_MASK64 = (1 << 64) - 1
# Initial accumulators of the >= 32-byte stripe path.
_V_INITS = tuple(
    np.uint64((SEED + d) & _MASK64) for d in (int(_P1) + int(_P2), int(_P2), 0, -int(_P1))
)
# Hash state of every input shorter than 32 bytes before its length is added.
_SHORT_INIT = np.uint64((SEED + int(_P5)) & _MASK64)
# The 8-byte int64 path starts from seed + P5 + len(=8).
_INT64_INIT = np.uint64((SEED + int(_P5) + 8) & _MASK64)

_SHIFTS = {r: (np.uint64(r), np.uint64(64 - r)) for r in (1, 7, 11, 12, 18, 23, 27, 31)}
_S8, _S29, _S32, _S33 = np.uint64(8), np.uint64(29), np.uint64(32), np.uint64(33)
_LOW8, _LOW32 = np.uint64(0xFF), np.uint64(0xFFFFFFFF)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    left, right = _SHIFTS[r]
    return (x << left) | (x >> right)


def _round(acc: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """XXH64 round: ``rotl(acc + lane * P2, 31) * P1`` (``lane`` is overwritten)."""
    lane *= _P2
    lane += acc
    out = _rotl(lane, 31)
    out *= _P1
    return out


def _round0(lane: np.ndarray) -> np.ndarray:
    """XXH64 round from a zero accumulator: ``rotl(lane * P2, 31) * P1`` (overwrites ``lane``)."""
    lane *= _P2
    out = _rotl(lane, 31)
    out *= _P1
    return out


def _merge(h: np.ndarray, v: np.ndarray) -> np.ndarray:
    """XXH64 merge of an accumulator into the stripe hash: ``(h ^ round(0, v)) * P1 + P4``."""
    h = h ^ _round0(v.copy())
    h *= _P1
    h += _P4
    return h


def _avalanche(h: np.ndarray) -> np.ndarray:
    """XXH64 final mix (in place)."""
    h ^= h >> _S33
    h *= _P2
    h ^= h >> _S29
    h *= _P3
    h ^= h >> _S32
    return h


def hash_int64(values: np.ndarray) -> np.ndarray:
    """XXH64 of each int64 as 8 little-endian bytes (the fixed 8-byte short-input path)."""
    lane = values.astype(np.int64, copy=False).view(np.uint64).copy()
    h = _round0(lane)
    h ^= _INT64_INIT
    h = _rotl(h, 27)
    h *= _P1
    h += _P4
    return _avalanche(h)


def _unaligned_words(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unaligned little-endian uint64 views of a zero-padded copy of ``data``.

    Returns ``(words, stripes)``: ``words[p]`` is the 8-byte word starting at byte ``p`` and
    ``stripes[p]`` the four words of the 32-byte stripe starting there (1-byte-strided views),
    so a fancy index ``words[positions]`` loads one lane per key in a single gather.
    """
    padded = np.zeros(data.size + 40, dtype=np.uint8)
    padded[: data.size] = data
    words = np.ndarray(shape=(data.size + 33,), dtype="<u8", buffer=padded, strides=(1,))
    stripes = np.ndarray(shape=(data.size + 9, 4), dtype="<u8", buffer=padded, strides=(1, 8))
    return words, stripes


def hash_strings(arr: pa.Array) -> np.ndarray:
    """XXH64 of the UTF-8 bytes of each string of a null-free ``large_string`` array.

    Vectorized over keys, never looping over them: the stripe loop runs over stripe *positions*
    (``max_len / 32`` iterations, each on the keys still long enough), and the < 32-byte tails
    run once per tail length (31 groups at most), each group a contiguous slice after a sort.
    """
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    base = int(offsets[0])
    starts = offsets[:-1] - base
    lengths = np.diff(offsets)
    nbytes = int(offsets[-1]) - base
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8, count=nbytes, offset=base)
        if nbytes
        else np.zeros(0, dtype=np.uint8)
    )
    words, stripes = _unaligned_words(data)

    h = np.full(n, _SHORT_INIT, dtype=np.uint64)

    # >= 32 bytes: 32-byte stripes into four accumulators. Keys are sorted by stripe count so
    # the keys still alive at stripe s are a suffix of the sorted order.
    long_idx = np.flatnonzero(lengths >= 32)
    if long_idx.size:
        nstripes = lengths[long_idx] // 32
        small = int(nstripes.max()) < 2**15  # a 16-bit key lets numpy use its radix sort
        order = np.argsort(nstripes.astype(np.int16) if small else nstripes, kind="stable")
        long_idx = long_idx[order]
        nstripes = nstripes[order]
        long_starts = starts[long_idx]
        # One row of four accumulators (v1..v4) per key.
        accs = np.tile(np.array(_V_INITS, dtype=np.uint64), (long_idx.size, 1))
        for s in range(int(nstripes[-1])):
            lo = int(np.searchsorted(nstripes, s, side="right"))
            accs[lo:] = _round(accs[lo:], stripes[long_starts[lo:] + 32 * s])
        v1, v2, v3, v4 = accs.T
        acc = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        for v in (v1, v2, v3, v4):
            acc = _merge(acc, v)
        h[long_idx] = acc

    h += lengths.view(np.uint64)

    # Tail (< 32 bytes left): up to three 8-byte lanes, then a 4-byte word, then up to three
    # single bytes. Keys are grouped by tail length (radix sort of a small int), so each group
    # runs its fixed sequence of steps on a contiguous slice, with no masks.
    rem = (lengths & 31).astype(np.int8)
    order = np.argsort(rem, kind="stable")
    bounds = np.searchsorted(rem[order], np.arange(33, dtype=np.int8)).tolist()
    hs = h[order]
    tails = (starts + lengths - rem)[order]
    for r in range(1, 32):
        lo, hi = bounds[r], bounds[r + 1]
        if lo == hi:
            continue
        hr = hs[lo:hi]
        pos = tails[lo:hi]
        for j in range(r >> 3):
            hr ^= _round0(words[pos + 8 * j])
            hr = _rotl(hr, 27)
            hr *= _P1
            hr += _P4
        if r & 7:
            # One 8-byte load covers the 4-byte word and the single bytes (bytes past the
            # key's end are never used).
            w = words[pos + (r & 24)]
            if r & 4:
                hr ^= (w & _LOW32) * _P1
                hr = _rotl(hr, 23)
                hr *= _P2
                hr += _P3
                w >>= _S32
            for _ in range(r & 3):
                hr ^= (w & _LOW8) * _P5
                hr = _rotl(hr, 11)
                hr *= _P1
                w >>= _S8
        hs[lo:hi] = hr
    h[order] = hs
    return _avalanche(h)
