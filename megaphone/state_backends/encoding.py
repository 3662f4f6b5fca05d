"""Byte layout of keys and values, shared by every state backend.

A *raw key* is ``4-byte big-endian bin id + encoded key``.  Because the bin id leads, all keys
of one bin form one contiguous, byte-ordered key range, so a bin (or a run of consecutive bins)
can be scanned, exported or deleted as a single range.  Encoded keys:

* ``"int64"``: 8 bytes big-endian of ``k XOR 0x8000000000000000`` (order-preserving: the
  bytes sort like the signed integers).
* ``"str"``: UTF-8.
* a null key (either type): the single byte :data:`NULL_KEY` (``0xFF``). It never collides
  with a real key: no int64 key is 1 byte long, ``b"\xff"`` alone is not valid UTF-8, and the
  empty string encodes to zero bytes. Null keys decode to ``None`` (an Arrow null).

*Timer keys* (event-time callbacks, :mod:`megaphone.state_backends.timer_keys`) live in their
bin's range too, so they migrate, persist and commit with its state: ``bin prefix +``
:data:`TIMER_MARK` ``(0xFE) + 8 bytes big-endian of time XOR 2**63 + encoded key`` (empty
value), or, as an epoch writes them, one *group* row per bin, time and epoch (``0xFE`` and
the epoch instead of a key; its value lists the keys). Within a bin they sort by time. No str
key starts with ``0xFE`` (not valid UTF-8), but an int64 key can (e.g.
``0x7E00_0000_0000_0001``), so a plain int64 key (12 raw bytes) may fall inside the timer
range: a raw key is a timer iff ``raw[4] == 0xFE`` and it is at least 13 bytes long, and every
scan (for timers or for plain keys) must apply that test.

Values are msgpack (``use_bin_type=True``; tuples come back as lists, numpy scalars and arrays
are stored as plain numbers and lists).  Metadata entries live under :data:`META_PREFIX`, which
sorts after every bin because bin ids are below ``2**20``.

Everything here is vectorized where it matters: int64 keys are encoded and decoded through numpy
structured arrays without a per-key Python loop (null keys, when there are any, are patched
in one by one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from megaphone.routing.keys import check_key_type

META_PREFIX = b"\xff\xff\xff\xff"
"""Prefix of metadata keys; sorts after every bin key range (bin ids are below 2**20)."""

BIN_PREFIX_LEN = 4
"""Length in bytes of the bin-id prefix of a raw key."""

NULL_KEY = b"\xff"
"""Encoded null key (after the bin prefix): no int64 or str key encodes to it."""

TIMER_MARK = b"\xfe"
"""Byte after the bin prefix that starts a timer key (an int64 key may start with it too)."""

_SIGN = np.uint64(0x8000000000000000)
_INT_KEY = np.dtype([("b", ">u4"), ("k", ">u8")])
_UNPACK = partial(msgpack.unpackb, raw=False, strict_map_key=False)


# --------------------------------------------------------------------------- validation


def as_bins(bins: Any, num_bins: int, n: int | None = None) -> np.ndarray:
    """Bins as an ``int64`` array, checked to lie in ``[0, num_bins)`` (and to number ``n``)."""
    arr = np.asarray(bins, dtype=np.int64).reshape(-1)
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"got {arr.shape[0]} bins for {n} keys")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= num_bins):
        raise ValueError(f"bin ids must lie in [0, {num_bins})")
    return arr


def _as_int64_keys(keys: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """int64 keys as an int64 array (0 at null keys) and the mask of null keys (None if none).

    Takes an integer numpy or Arrow array, a numpy masked array, or a list / object array
    whose nulls are ``None``.
    """
    nulls = None
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_null(keys.type):
            return np.zeros(len(keys), np.int64), np.ones(len(keys), bool)
        if not pa.types.is_integer(keys.type):
            raise TypeError(f"int64 keys must be integers, got Arrow type {keys.type}")
        if keys.null_count:
            nulls = keys.is_null().to_numpy(zero_copy_only=False)
            keys = keys.fill_null(0)
        arr = keys.to_numpy(zero_copy_only=False)
    elif isinstance(keys, np.ma.MaskedArray):
        nulls = np.ma.getmaskarray(keys).reshape(-1) if np.ma.is_masked(keys) else None
        arr = np.ma.getdata(keys) if nulls is None else keys.filled(0)
    else:
        arr = np.asarray(keys)
        if arr.dtype == object and arr.size:
            nulls = np.equal(arr, None).reshape(-1)
            arr = np.asarray(np.where(nulls, 0, arr.reshape(-1)).tolist())
            nulls = nulls if nulls.any() else None
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64), None
    if arr.dtype.kind not in "iu":
        raise TypeError(f"int64 keys must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and bool((arr > np.iinfo(np.int64).max).any()):
        raise OverflowError("int64 key out of range")
    return arr.astype(np.int64, copy=False).reshape(-1), nulls


# --------------------------------------------------------------------------- keys


def meta_key(name: str) -> bytes:
    """Raw key of the metadata entry ``name`` (outside every bin's key range)."""
    return META_PREFIX + name.encode("utf-8")


def bin_prefix(bin_id: int) -> bytes:
    """The 4-byte big-endian prefix shared by every raw key of ``bin_id``."""
    return int(bin_id).to_bytes(BIN_PREFIX_LEN, "big")


def bin_range(bin_id: int) -> tuple[bytes, bytes]:
    """Half-open raw key range ``[begin, end)`` holding exactly the keys of ``bin_id``."""
    return bins_range(bin_id, bin_id + 1)


def bins_range(start: int, stop: int) -> tuple[bytes, bytes]:
    """Half-open raw key range holding the keys of the consecutive bins ``start .. stop-1``."""
    return bin_prefix(start), bin_prefix(stop)


def bin_runs(bins: Iterable[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive bins as half-open ``(start, stop)`` pairs, in bin order.

    One run maps to one key range, so range operations (delete, scan) touch as few ranges as
    possible.
    """
    arr = np.unique(np.fromiter((int(b) for b in bins), dtype=np.int64))
    if arr.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(arr) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [arr.size]))
    return [(int(arr[a]), int(arr[b - 1]) + 1) for a, b in zip(starts, stops, strict=True)]


def encode_keys(bins: Any, keys: Any, key_type: str) -> list[bytes]:
    """Raw keys (bin prefix + encoded key) for parallel arrays of bins and keys.

    ``keys`` is a list, a numpy array (masked or not) or an Arrow array; null keys (``None``,
    Arrow nulls, masked entries) encode to the bin prefix + :data:`NULL_KEY`. int64 keys go
    through a ``[('b','>u4'),('k','>u8')]`` structured array viewed as ``V12``, so the bytes
    objects are built in C with no per-key Python loop (only null keys are patched one by one).
    """
    check_key_type(key_type)
    b = np.asarray(bins, dtype=np.int64).reshape(-1)
    if key_type == "int64":
        k, nulls = _as_int64_keys(keys)
        if k.shape[0] != b.shape[0]:
            raise ValueError(f"got {b.shape[0]} bins for {k.shape[0]} keys")
        rec = np.empty(k.shape[0], dtype=_INT_KEY)
        rec["b"] = b
        rec["k"] = k.view(np.uint64) ^ _SIGN
        raw = rec.view("V12").tolist()
        if nulls is not None:
            for i in np.flatnonzero(nulls).tolist():
                raw[i] = raw[i][:BIN_PREFIX_LEN] + NULL_KEY
        return raw
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        ks = keys.to_pylist()
    else:
        ks = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
    if len(ks) != b.shape[0]:
        raise ValueError(f"got {b.shape[0]} bins for {len(ks)} keys")
    prefixes = b.astype(">u4").view("V4").tolist()
    try:
        return [p + k.encode("utf-8") for p, k in zip(prefixes, ks, strict=True)]
    except AttributeError:  # None among the keys (or a key that is no str: raises again)
        return [p + (NULL_KEY if k is None else k.encode("utf-8"))
                for p, k in zip(prefixes, ks, strict=True)]


def byte_lengths(items: Sequence[bytes | None]) -> np.ndarray:
    """``len`` of every item as int64, with ``-1`` for ``None`` (a missing value)."""
    n = len(items)
    try:
        return np.fromiter(map(len, items), dtype=np.int64, count=n)
    except TypeError:
        return np.fromiter((-1 if x is None else len(x) for x in items), dtype=np.int64, count=n)


def bins_of_raw(raw: Sequence[bytes]) -> np.ndarray:
    """Bin id (int64) of every raw key, vectorized over one ``b"".join`` of the keys.

    Metadata keys yield ``0xFFFFFFFF``; keys shorter than the prefix raise ``ValueError``.
    """
    n = len(raw)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lens = np.fromiter(map(len, raw), dtype=np.int64, count=n)
    if int(lens.min()) < BIN_PREFIX_LEN:
        raise ValueError("raw keys must start with a 4-byte bin prefix")
    data = np.frombuffer(b"".join(raw), dtype=np.uint8)
    starts = np.cumsum(lens) - lens
    return _gather_bins(data, starts)


def _gather_bins(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    out = np.zeros(starts.shape[0], dtype=np.int64)
    for i in range(BIN_PREFIX_LEN):
        out = (out << 8) | data[starts + i]
    return out


def binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Zero-copy ``(data uint8, offsets int64[n+1])`` view of a binary Arrow array.

    Lets backends compute lengths and bin ids of exported/imported keys without touching the
    bytes from Python.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise ValueError("binary column must not contain nulls")
    if pa.types.is_large_binary(arr.type):
        off_dtype: Any = np.int64
    elif pa.types.is_binary(arr.type):
        off_dtype = np.int32
    else:
        raise TypeError(f"expected a binary column, got {arr.type}")
    bufs = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(bufs[1], dtype=off_dtype, count=arr.offset + n + 1)[arr.offset :]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return data, offsets.astype(np.int64)


def bins_of_arrow(keys: pa.Array) -> np.ndarray:
    """Bin id (int64) of every raw key in a binary Arrow array, without a Python loop."""
    data, offsets = binary_parts(keys)
    if len(keys) and int(np.diff(offsets).min()) < BIN_PREFIX_LEN:
        raise ValueError("raw keys must start with a 4-byte bin prefix")
    return _gather_bins(data, offsets[:-1])


def arrow_lengths(arr: pa.Array) -> np.ndarray:
    """Byte length (int64) of every element of a binary Arrow array."""
    _, offsets = binary_parts(arr)
    return np.diff(offsets)


def payload_bytes(batch: pa.RecordBatch) -> int:
    """Key plus value bytes of an exported ``(k, v)`` batch, as :class:`BinStats` counts them."""
    return int(sum(arrow_lengths(column).sum() for column in batch.columns))


def decode_keys(raw: Sequence[bytes], key_type: str) -> tuple[np.ndarray, list[Any] | np.ndarray]:
    """Split raw keys into ``(bins int64 array, keys)``.

    int64 keys come back as an int64 array: one ``b"".join`` plus ``np.frombuffer``, or, when
    some key is null, a numpy masked array with the null keys masked (``tolist()`` gives None
    for them, ``pa.array`` a null). str keys are decoded per key, None for a null key.
    """
    if check_key_type(key_type) == "int64":
        if not raw:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        joined = b"".join(raw)
        if len(joined) == 12 * len(raw):
            return _split_int_keys(joined)
        decoded = decode_int_keys(pa.array(raw, pa.binary()))
        if decoded is None:
            raise ValueError("int64 raw keys must be 12 bytes (or 5 for a null key)")
        return decoded
    bins = bins_of_raw(raw)
    try:
        return bins, [r[BIN_PREFIX_LEN:].decode("utf-8") for r in raw]
    except UnicodeDecodeError:  # a null key (or a corrupt one: raises again)
        return bins, [None if r[BIN_PREFIX_LEN:] == NULL_KEY else r[BIN_PREFIX_LEN:].decode("utf-8")
                      for r in raw]


def decode_int_keys(raw: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """``(bins, keys)`` of a binary Arrow array of int64 raw keys without Python objects, or
    None unless every key is a 12-byte int64 raw key or a null key (the caller then decodes
    per key). With null keys, ``keys`` is a numpy masked array masking them."""
    data, offsets = binary_parts(raw)
    n = len(offsets) - 1
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lengths = np.diff(offsets)
    if np.array_equal(lengths, np.full(n, 12)):
        return _split_int_keys(data[offsets[0]:offsets[-1]].tobytes())
    nulls = lengths == BIN_PREFIX_LEN + len(NULL_KEY)
    if not bool(((lengths == 12) | nulls).all()) or \
            bool((data[offsets[:-1][nulls] + BIN_PREFIX_LEN] != NULL_KEY[0]).any()):
        return None
    bins = _gather_bins(data, offsets[:-1])
    starts = offsets[:-1][~nulls] + BIN_PREFIX_LEN
    words = data[starts[:, None] + np.arange(8)].copy().view(">u8").reshape(-1)
    keys = np.zeros(n, np.int64)
    keys[~nulls] = (words.astype(np.uint64) ^ _SIGN).view(np.int64)
    return bins, np.ma.masked_array(keys, mask=nulls)


def _split_int_keys(joined: bytes) -> tuple[np.ndarray, np.ndarray]:
    """``(bins, keys)`` of concatenated 12-byte int64 raw keys."""
    rec = np.frombuffer(joined, dtype=_INT_KEY)
    return rec["b"].astype(np.int64), (rec["k"].astype(np.uint64) ^ _SIGN).view(np.int64)


#: msgpack integer formats: first byte -> (payload bytes, signed).
_MSGPACK_INTS = {0xCC: (1, False), 0xCD: (2, False), 0xCE: (4, False), 0xCF: (8, False),
                 0xD0: (1, True), 0xD1: (2, True), 0xD2: (4, True), 0xD3: (8, True)}


def unpack_ints(values: pa.Array) -> np.ndarray | None:
    """Vectorized msgpack decode of a binary Arrow array of integers (int64 result), or None
    if any value is not a msgpack integer that fits int64 (the caller decodes per value)."""
    data, offsets = binary_parts(values)
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    if n == 0:
        return np.zeros(0, np.int64)
    if int(lengths.min()) < 1:
        return None
    starts = offsets[:-1]
    first = data[starts].astype(np.int64)
    out = np.full(n, np.iinfo(np.int64).min, np.int64)
    done = np.zeros(n, bool)
    fix = lengths == 1
    pos = fix & (first < 0x80)
    neg = fix & (first >= 0xE0)
    out[pos], out[neg] = first[pos], first[neg] - 256
    done |= pos | neg
    for tag, (width, signed) in _MSGPACK_INTS.items():
        sel = np.flatnonzero((first == tag) & (lengths == width + 1))
        if not len(sel):
            continue
        acc = np.zeros(len(sel), np.uint64)
        for i in range(width):
            acc = (acc << np.uint64(8)) | data[starts[sel] + 1 + i].astype(np.uint64)
        if signed:
            bits = 8 * width
            vals = acc.astype(np.int64) if width == 8 else \
                (acc.astype(np.int64) ^ (1 << (bits - 1))) - (1 << (bits - 1))
        else:
            if width == 8 and int(acc.max()) >= 1 << 63:
                return None
            vals = acc.astype(np.int64)
        out[sel] = vals
        done[sel] = True
    return out if bool(done.all()) else None


# --------------------------------------------------------------------------- values


def _msgpack_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, int):
        raise OverflowError(f"integer {obj} does not fit msgpack's 64 bits")
    raise TypeError(f"cannot msgpack-encode value of type {type(obj).__name__}")


def _packer() -> msgpack.Packer:
    # A fresh Packer per call keeps packing thread-safe (a Packer holds a mutable buffer).
    return msgpack.Packer(use_bin_type=True, default=_msgpack_default)


def pack_value(value: Any) -> bytes:
    """msgpack bytes of one state value (numpy scalars/arrays become plain numbers/lists)."""
    return _packer().pack(value)


def unpack_value(data: bytes) -> Any:
    """Decode one msgpack state value (str keys stay str, binary stays bytes)."""
    return _UNPACK(data)


def pack_values(values: Iterable[Any]) -> list[bytes]:
    """msgpack bytes of every value, in order."""
    pack = _packer().pack
    return [pack(v) for v in values]


def unpack_values(data: Iterable[bytes | None]) -> list[Any]:
    """Decode every msgpack value, passing ``None`` (missing key) through unchanged."""
    unpack = _UNPACK
    return [None if d is None else unpack(d) for d in data]
