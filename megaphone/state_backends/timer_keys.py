"""Event-time timers stored as ordinary raw keys inside their bin's key range.

A timer ("call back key K of bin B once the watermark reaches time T") is the raw key
``bin prefix + TIMER_MARK (0xFE) + 8 bytes big-endian of (T XOR 2**63) + encoded K`` with an
empty value (layout and its pitfalls: :mod:`megaphone.state_backends.encoding`). Living in the
bin's range, timers migrate with the bin, reach the durable copy and commit atomically with the
state, with no machinery of their own. Within a bin they sort by time, then key, so the timers
due at a watermark are one key range per bin (:func:`timer_range`) that a backend reads with one
seek. A plain int64 key may start with ``0xFE`` too, so every scan tests :func:`is_timer_key`.

An epoch writes its timers as **timer groups**: one row per ``(bin, time)`` and epoch, the
raw key ``bin prefix + 0xFE + 8 bytes of time + 0xFE + 8 bytes of the epoch``
(:func:`timer_group_keys`; no timer of one key has ``0xFE`` after its time and is 22 bytes
long: a str key never starts with ``0xFE``, an int64 key is 8 bytes) whose value is the msgpack
list of the encoded keys the epoch set a timer for then, sorted. A window aggregate sets one
timer per key and window end, all at a few times per bin: as groups, an epoch writes a few
rows per bin instead of a key per timer, and reads no old value per timer; a group of its own
per epoch means an epoch never rewrites an earlier one's (docs/operators.md, "Timers in
groups").
A group is a timer key too (it passes :func:`is_timer_key`), so it moves, commits and is
skipped by ``items()`` as one; :func:`expand_due` turns the due rows, groups and per-key timers
of older stores alike, into per-key timer keys.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from megaphone.routing.keys import check_key_type
from megaphone.state_backends.encoding import (
    BIN_PREFIX_LEN,
    NULL_KEY,
    TIMER_MARK,
    as_bins,
    bin_prefix,
    binary_parts,
    byte_lengths,
    decode_keys,
    encode_keys,
)

TIMER_HEAD_LEN = BIN_PREFIX_LEN + len(TIMER_MARK) + 8
"""Bytes before a timer's encoded key (prefix, mark, time); a timer key is at least this long,
a plain int64 key (12 bytes) never is."""

MIN_TIME, MAX_TIME = -(2**63), 2**63 - 1
"""Range of timer times (int64 microseconds)."""

_MARK = TIMER_MARK[0]
_SIGN = np.uint64(1 << 63)
_HEAD = np.dtype([("b", ">u4"), ("m", "u1"), ("t", ">u8")])
_INT_TIMER = np.dtype([("b", ">u4"), ("m", "u1"), ("t", ">u8"), ("k", ">u8")])
_INT_KEY = np.dtype([("b", ">u4"), ("k", ">u8")])
_GROUP = np.dtype([("b", ">u4"), ("m", "u1"), ("t", ">u8"), ("g", "u1"), ("e", ">u8")])
_MAX_BIN = 0xFFFFFFFF  # the metadata prefix: no bin


# --------------------------------------------------------------------------- recognising


def is_timer_key(raw: bytes) -> bool:
    """Whether the raw key ``raw`` is a timer: ``0xFE`` after the prefix and at least
    :data:`TIMER_HEAD_LEN` bytes (a plain int64 key starting with ``0xFE`` is 12 bytes)."""
    return len(raw) >= TIMER_HEAD_LEN and raw[BIN_PREFIX_LEN] == _MARK


def is_timer_group(raw: bytes) -> bool:
    """Whether the raw key ``raw`` is a timer group: a timer head, ``0xFE`` and an epoch."""
    return (len(raw) == _GROUP.itemsize and raw[TIMER_HEAD_LEN] == _MARK
            and raw[BIN_PREFIX_LEN] == _MARK)


def _mark_mask(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """:func:`is_timer_key` of keys ``data[start : start + length]``, vectorized."""
    mask = lengths >= TIMER_HEAD_LEN
    mask[mask] = data[starts[mask] + BIN_PREFIX_LEN] == _MARK
    return mask


def timer_mask(keys: pa.Array) -> np.ndarray:
    """:func:`is_timer_key` of every raw key of a binary Arrow array, without a Python loop."""
    data, offsets = binary_parts(keys)
    return _mark_mask(data, offsets[:-1], np.diff(offsets))


def without_timers(keys: pa.Array, values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The ``(k, v)`` columns of an exported chunk without its timer entries: what code that
    decodes raw keys as plain keys (``items()``, ``pipe.state()``) must read."""
    timers = timer_mask(keys)
    if not timers.any():
        return keys, values
    keep = pa.array(~timers)
    return keys.filter(keep), values.filter(keep)


# --------------------------------------------------------------------------- encoding


def _as_times(times: Any, n: int) -> np.ndarray:
    """Times as an int64 array of ``n`` entries (TypeError unless integers)."""
    arr = np.asarray(times).reshape(-1)
    if arr.shape[0] != n:
        raise ValueError(f"got {arr.shape[0]} times for {n} keys")
    if n == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"timer times must be int64 microseconds, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and int(arr.max()) > MAX_TIME:
        raise OverflowError("timer time out of the int64 range")
    return arr.astype(np.int64, copy=False)


def _check_time(t: Any) -> int:
    t = operator.index(t)
    if not MIN_TIME <= t <= MAX_TIME:
        raise OverflowError(f"timer time {t} is out of the int64 range")
    return t


def encode_timer_keys(bins: Any, times: Any, keys: Any, key_type: str) -> list[bytes]:
    """Raw timer keys for parallel bins, times (int64 microseconds) and keys.

    ``keys`` are taken as :func:`~megaphone.state_backends.encoding.encode_keys` takes them
    (``None`` is the null key). int64 keys without nulls are built in one structured numpy
    array (no per-key Python); otherwise a 13-byte head is prepended to each encoded key.
    """
    check_key_type(key_type)
    b = np.asarray(bins, dtype=np.int64).reshape(-1)
    if b.size and (int(b.min()) < 0 or int(b.max()) >= _MAX_BIN):
        raise ValueError("bin ids must lie in [0, 2**32 - 1)")
    plain = encode_keys(b, keys, key_type)  # checks the keys and their number
    t = _as_times(times, len(plain)).view(np.uint64) ^ _SIGN
    if key_type == "int64" and bool((byte_lengths(plain) == 12).all()):
        rec = np.empty(len(plain), _INT_TIMER)
        rec["b"], rec["m"], rec["t"] = b, _MARK, t
        rec["k"] = np.frombuffer(b"".join(plain), _INT_KEY)["k"]
        return rec.view(f"V{_INT_TIMER.itemsize}").tolist()
    head = np.empty(len(plain), _HEAD)
    head["b"], head["m"], head["t"] = b, _MARK, t
    heads = head.view(f"V{_HEAD.itemsize}").tolist()
    return [h + p[BIN_PREFIX_LEN:] for h, p in zip(heads, plain, strict=True)]


def decode_timer_keys(raw: Sequence[bytes], key_type: str
                      ) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """``(bins int64, times int64, keys)`` of raw timer keys; ``keys`` is a list (``None`` for
    the null key). Raises ``ValueError`` if a key is not a timer key."""
    check_key_type(key_type)
    raw = list(raw)
    if not raw:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), []
    lengths = byte_lengths(raw)
    joined = b"".join(raw)
    starts = np.cumsum(lengths) - lengths
    if not _mark_mask(np.frombuffer(joined, np.uint8), starts, lengths).all():
        raise ValueError("not a timer key (0xFE after the bin prefix, at least 13 bytes)")
    if key_type == "int64" and bool((lengths == _INT_TIMER.itemsize).all()):
        rec = np.frombuffer(joined, _INT_TIMER)
        keys: list[Any] = (rec["k"].astype(np.uint64) ^ _SIGN).view(np.int64).tolist()
        return rec["b"].astype(np.int64), _times(rec["t"]), keys
    head = np.frombuffer(b"".join(r[:TIMER_HEAD_LEN] for r in raw), _HEAD)
    _, decoded = decode_keys([r[:BIN_PREFIX_LEN] + r[TIMER_HEAD_LEN:] for r in raw], key_type)
    keys = decoded.tolist() if isinstance(decoded, np.ndarray) else list(decoded)
    return head["b"].astype(np.int64), _times(head["t"]), keys


def timer_group_keys(bins: np.ndarray, times: np.ndarray, epoch: int) -> list[bytes]:
    """The raw keys of epoch ``epoch``'s timer groups ``(bins[i], times[i])`` (int64 arrays),
    built in one structured numpy array."""
    rec = np.empty(len(bins), _GROUP)
    rec["b"], rec["m"], rec["g"], rec["e"] = bins, _MARK, _MARK, epoch
    rec["t"] = times.astype(np.int64, copy=False).view(np.uint64) ^ _SIGN
    return rec.view(f"V{_GROUP.itemsize}").tolist()


def pack_group(members: Iterable[bytes]) -> bytes | None:
    """A timer group's value: its keys' encoded bytes (after the bin prefix), sorted, as a
    msgpack list; ``None`` (delete the row) when it has none."""
    unique = sorted(set(members))
    return msgpack.packb(unique) if unique else None


def group_members(value: bytes | None) -> list[bytes]:
    """The encoded keys of a timer group's ``value`` (none for ``None``)."""
    if value is None:
        return []
    members = msgpack.unpackb(value)
    if not isinstance(members, list) or not all(isinstance(m, bytes) for m in members):
        raise ValueError("a timer group's value is not a msgpack list of bytes")
    return members


def expand_due(due: Sequence[bytes], values: Sequence[bytes | None]) -> list[bytes]:
    """Due timer rows (``due``, as a backend's ``due_timers`` gives them, with their stored
    ``values``) as per-key timer keys: each group becomes its members' keys. Bins as in
    ``due``, a bin's in time order (within a time, its rows' order and each group's keys in
    key order); a timer in several groups (set by several epochs) or also in a per-key row of
    an older store is there once, where it first is."""
    out: list[bytes] = []
    heads: list[bytes] = []
    for raw, value in zip(due, values, strict=True):
        if is_timer_group(raw):
            head = raw[:TIMER_HEAD_LEN]
            heads.append(head)
            out += [head + m for m in group_members(value)]
        else:
            out.append(raw)
    if heads and (len(heads) < len(due) or len(set(heads)) < len(heads)):
        out = list(dict.fromkeys(out))  # a time with more than one row: drop repeats
    return out


def group_writes(bins: np.ndarray, times: np.ndarray, members: Sequence[bytes], epoch: int
                 ) -> tuple[list[bytes], list[bytes]]:
    """The timers ``(bins[i], times[i], members[i])`` (a key's encoded bytes) that epoch
    ``epoch`` set, grouped: each group's raw key and value (:func:`pack_group`), in key
    order."""
    if not len(bins):
        return [], []
    order = np.lexsort((times, bins))
    b, t = bins[order], times[order]
    starts = np.flatnonzero(np.r_[True, (b[1:] != b[:-1]) | (t[1:] != t[:-1])])
    keys = timer_group_keys(b[starts], t[starts], epoch)
    ordered = [members[i] for i in order.tolist()]
    bounds = np.r_[starts, len(order)].tolist()
    return keys, [pack_group(ordered[lo:hi]) for lo, hi in itertools.pairwise(bounds)]


def _times(encoded: np.ndarray) -> np.ndarray:
    return (encoded.astype(np.uint64) ^ _SIGN).view(np.int64)


# --------------------------------------------------------------------------- ranges


def timer_range(bin_id: int, upto: int) -> tuple[bytes, bytes]:
    """Half-open raw range ``[begin, end)`` holding bin ``bin_id``'s timer keys with time
    ``<= upto`` (and maybe plain int64 keys starting with ``0xFE``: filter with
    :func:`is_timer_key`). For ``upto = 2**63 - 1`` it ends before the bin's ``0xFF`` keys."""
    upto = _check_time(upto)
    begin = bin_prefix(bin_id) + TIMER_MARK
    if upto == MAX_TIME:
        return begin, bin_prefix(bin_id) + NULL_KEY
    return begin, begin + (upto - MIN_TIME + 1).to_bytes(8, "big")


def due_bins(bins: Iterable[int], num_bins: int) -> list[int]:
    """``bins`` checked to lie in ``[0, num_bins)``, in the given order without repeats (a bin
    named twice would return its timers twice)."""
    arr = as_bins(np.fromiter((int(b) for b in bins), dtype=np.int64), num_bins)
    return list(dict.fromkeys(arr.tolist()))


def collect_due(bins: Iterable[int], upto: int, num_bins: int,
                keys_between: Callable[[int, bytes, bytes], Iterable[bytes]]) -> list[bytes]:
    """The timer keys due at ``upto`` in ``bins`` (given order; within a bin, key order), read
    with one ``keys_between(bin, begin, end)`` range read per bin: a backend's ``due_timers``."""
    _check_time(upto)
    out: list[bytes] = []
    for b in due_bins(bins, num_bins):
        begin, end = timer_range(b, upto)
        out.extend(k for k in keys_between(b, begin, end) if is_timer_key(k))
    return out


# --------------------------------------------------------------------------- in-memory index


class TimerIndex:
    """The timer keys of an in-memory store as one sorted list per bin, so finding the due
    ones is a bisection per bin rather than a scan of the bin's dict."""

    def __init__(self) -> None:
        """An empty index."""
        self._bins: dict[int, list[bytes]] = {}

    @classmethod
    def of(cls, bins: dict[int, dict[bytes, bytes]]) -> TimerIndex:
        """The index of a ``{bin: {raw key: value}}`` table (a loaded state file)."""
        index = cls()
        for b, table in bins.items():
            timers = sorted(filter(is_timer_key, table))
            if timers:
                index._bins[int(b)] = timers
        return index

    def update(self, bins: Sequence[int], keys: Sequence[bytes],
               values: Sequence[bytes | None]) -> None:
        """Follow one commit: a timer key put (value not ``None``) is added, a deleted one
        removed; other keys are ignored."""
        if not keys or max(map(len, keys)) < TIMER_HEAD_LEN:  # no timer (int64 state keys)
            return
        for b, k, v in zip(bins, keys, values, strict=True):
            if len(k) >= TIMER_HEAD_LEN and k[BIN_PREFIX_LEN] == _MARK:
                self._set(b, k, v is not None)

    def _set(self, b: int, k: bytes, present: bool) -> None:
        timers = self._bins.setdefault(b, [])
        i = bisect.bisect_left(timers, k)
        there = i < len(timers) and timers[i] == k
        if present and not there:
            timers.insert(i, k)
        elif not present and there:
            del timers[i]
        if not timers:
            del self._bins[b]

    def drop(self, bins: Iterable[int]) -> None:
        """Forget the timers of dropped bins."""
        for b in bins:
            self._bins.pop(int(b), None)

    def between(self, b: int, begin: bytes, end: bytes) -> list[bytes]:
        """Bin ``b``'s timer keys in ``[begin, end)``, in key order."""
        timers = self._bins.get(b)
        if not timers:
            return []
        return timers[bisect.bisect_left(timers, begin):bisect.bisect_left(timers, end)]
