"""Key -> bin routing: the top ``k`` bits of a key's XXH64 hash (seed 42) pick one of ``2**k`` bins.

The hash is exactly Spark SQL's ``xxhash64(key)`` for a ``LongType`` or ``StringType`` column,
reinterpreted as an unsigned 64-bit integer, so the driver (numpy, :func:`bin_of`) and the JVM
(:func:`bin_column`) always agree on which bin a key lives in. XXH64 is implemented here in
vectorized numpy: arrays of keys are hashed without a per-key Python loop.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "DEFAULT_NUM_BINS",
    "KEY_TYPES",
    "MAX_NUM_BINS",
    "MIN_NUM_BINS",
    "SEED",
    "bin_column",
    "bin_of",
    "check_key_type",
    "key_type_of",
    "validate_num_bins",
    "xxhash64_unsigned",
]

#: Key types megaphone can route: 64-bit signed integers and (UTF-8) strings.
KEY_TYPES: tuple[str, ...] = ("int64", "str")
#: Seed of Spark SQL's ``xxhash64`` function; the bins of the driver and the JVM must agree.
SEED: int = 42
#: Default number of bins (``2**12``).
DEFAULT_NUM_BINS: int = 4096
#: Smallest allowed number of bins.
MIN_NUM_BINS: int = 2
#: Largest allowed number of bins (``2**20``).
MAX_NUM_BINS: int = 2**20

#: Anything :func:`bin_of` / :func:`xxhash64_unsigned` accept as a batch of keys (or one key).
Keys: TypeAlias = "int | str | np.integer | Sequence[Any] | np.ndarray | pa.Array | pa.ChunkedArray"

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

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


# --------------------------------------------------------------------------------------------
# Validation and key-type inference
# --------------------------------------------------------------------------------------------


def validate_num_bins(num_bins: int) -> int:
    """Check that ``num_bins`` is an integer power of two in [2, 2**20] and return its log2.

    Bins are the top ``log2(num_bins)`` bits of a 64-bit hash, so only powers of two make
    sense; the upper bound keeps per-bin bookkeeping (arrays indexed by bin) small.
    """
    ok = isinstance(num_bins, (int, np.integer)) and not isinstance(num_bins, (bool, np.bool_))
    if ok:
        n = int(num_bins)
        ok = MIN_NUM_BINS <= n <= MAX_NUM_BINS and n & (n - 1) == 0
    if not ok:
        raise ValueError(
            f"num_bins must be an integer power of two from {MIN_NUM_BINS} to 2**20 "
            f"({MAX_NUM_BINS}), got {num_bins!r}"
        )
    return int(num_bins).bit_length() - 1


def check_key_type(key_type: str) -> str:
    """Return ``key_type`` if it is one of :data:`KEY_TYPES`, else raise ``ValueError``."""
    if key_type not in KEY_TYPES:
        raise ValueError(f"key_type must be one of {KEY_TYPES}, got {key_type!r}")
    return key_type


def _type_error(what: object) -> TypeError:
    return TypeError(
        f"keys must all be int64 integers or all be str, got {what}; "
        "mixed, float, bool and bytes keys are not supported"
    )


def _arrow_kind(typ: pa.DataType) -> str:
    """Map an Arrow type to a key type, or raise TypeError for an unsupported one."""
    if pa.types.is_integer(typ):
        return "int64"
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return "str"
    if hasattr(pa.types, "is_string_view") and pa.types.is_string_view(typ):
        return "str"
    if pa.types.is_dictionary(typ):
        return _arrow_kind(typ.value_type)
    raise _type_error(f"Arrow type {typ}")


def _check_no_nulls(arr: pa.Array | pa.ChunkedArray) -> None:
    if arr.null_count:
        raise ValueError(f"keys must not be None/null, got {arr.null_count} null key(s)")


def _check_int_range(values: np.ndarray) -> None:
    """Raise ValueError if an unsigned integer array holds values outside the int64 range."""
    if values.dtype.kind == "u" and values.dtype.itemsize == 8 and values.size:
        top = int(values.max())
        if top > _INT64_MAX:
            raise ValueError(f"integer keys must fit in int64 [-2**63, 2**63 - 1], got {top}")


def _check_scalar_int(value: int) -> int:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"integer keys must fit in int64 [-2**63, 2**63 - 1], got {value}")
    return value


def _from_sequence(keys: Sequence[Any] | np.ndarray) -> pa.Array:
    """Convert a list (or an object-dtype array) of Python keys to an Arrow array."""
    try:
        arr = pa.array(keys)
    except OverflowError as exc:
        raise ValueError(f"integer keys must fit in int64 [-2**63, 2**63 - 1] ({exc})") from exc
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise _type_error(f"a batch that does not convert to one type ({exc})") from exc
    if pa.types.is_null(arr.type):
        if len(arr):
            raise ValueError(f"keys must not be None/null, got {len(arr)} null key(s)")
        return pa.array([], pa.int64())
    return arr


def _normalize(keys: Keys) -> tuple[str, np.ndarray | pa.Array, bool]:
    """Turn any supported key batch into ``(kind, payload, is_scalar)``.

    ``payload`` is an int64 numpy array for ``"int64"`` and a null-free ``large_string`` Arrow
    array for ``"str"``.
    """
    if keys is None:
        raise ValueError("keys must not be None")
    if isinstance(keys, (bool, np.bool_)):
        raise _type_error("a bool")
    if isinstance(keys, (int, np.integer)):
        return "int64", np.array([_check_scalar_int(int(keys))], dtype=np.int64), True
    if isinstance(keys, str):
        return "str", pa.array([keys], pa.large_string()), True
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        return _normalize_arrow(keys)
    if isinstance(keys, np.ndarray):
        return _normalize_numpy(keys)
    if isinstance(keys, (bytes, bytearray, float, numbers.Number)):
        raise _type_error(f"a {type(keys).__name__}")
    if isinstance(keys, Sequence) or hasattr(keys, "__array__"):
        if not isinstance(keys, Sequence):  # e.g. a pandas Series: go through numpy
            return _normalize_numpy(np.asarray(keys))
        return _normalize_arrow(_from_sequence(keys))
    raise _type_error(f"a {type(keys).__name__}")


def _normalize_numpy(keys: np.ndarray) -> tuple[str, np.ndarray | pa.Array, bool]:
    if keys.ndim != 1:
        if keys.ndim == 0:
            return _normalize(keys.item())
        raise ValueError(f"key arrays must be one-dimensional, got shape {keys.shape}")
    kind = keys.dtype.kind
    if kind in "iu":
        _check_int_range(keys)
        return "int64", keys.astype(np.int64, copy=False), False
    if kind == "U":
        return "str", pa.array(keys, pa.large_string()), False
    if kind == "O":
        return _normalize_arrow(_from_sequence(keys))
    raise _type_error(f"a numpy array of dtype {keys.dtype}")


def _normalize_arrow(keys: pa.Array | pa.ChunkedArray) -> tuple[str, np.ndarray | pa.Array, bool]:
    kind = _arrow_kind(keys.type)
    _check_no_nulls(keys)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
        if pa.types.is_dictionary(keys.type):
            keys = keys.dictionary_decode()
    elif pa.types.is_dictionary(keys.type):
        keys = keys.dictionary_decode()
    if kind == "int64":
        values = keys.to_numpy(zero_copy_only=False)
        _check_int_range(values)
        return "int64", values.astype(np.int64, copy=False), False
    return "str", keys.cast(pa.large_string()), False


def key_type_of(keys: Keys) -> str:
    """Infer the key type (one of :data:`KEY_TYPES`) of a batch of keys or of a single key.

    Callers use it to check that a batch matches the key type a pipeline was declared with.
    Raises TypeError for unsupported or mixed keys, ValueError for null keys and for an empty
    list (an empty numpy/Arrow array has a dtype and is fine).
    """
    if isinstance(keys, np.ndarray) and keys.ndim == 1 and keys.dtype.kind in "iuU":
        return "int64" if keys.dtype.kind in "iu" else "str"
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        return _arrow_kind(keys.type)
    if isinstance(keys, Sequence) and not isinstance(keys, str) and len(keys) == 0:
        raise ValueError("cannot infer the key type of an empty list of keys")
    return _normalize(keys)[0]


# --------------------------------------------------------------------------------------------
# XXH64 in numpy
# --------------------------------------------------------------------------------------------


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


def _hash_int64(values: np.ndarray) -> np.ndarray:
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


def _hash_strings(arr: pa.Array) -> np.ndarray:
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


def _hash(keys: Keys) -> tuple[np.ndarray, bool]:
    kind, payload, scalar = _normalize(keys)
    with np.errstate(over="ignore"):
        if kind == "int64":
            return _hash_int64(payload), scalar
        return _hash_strings(payload), scalar


def xxhash64_unsigned(keys: Keys) -> np.ndarray:
    """Unsigned XXH64 (seed 42) of each key: int64 as 8 little-endian bytes, str as UTF-8.

    Equals Spark SQL's ``xxhash64(key)`` on a LongType / StringType column reinterpreted as
    uint64. Accepts the same inputs as :func:`bin_of`; always returns a uint64 array (length 1
    for a scalar key).
    """
    return _hash(keys)[0]


def bin_of(keys: Keys, num_bins: int = DEFAULT_NUM_BINS) -> np.ndarray | int:
    """Bin of each key: the top ``log2(num_bins)`` bits of its unsigned XXH64 (seed 42).

    Vectorized; matches :func:`bin_column` computed in Spark. ``keys`` is a Python int/str, a
    list, a numpy array or a pyarrow (Chunked)Array of int64 or str keys. Returns an int64
    array, or a Python int for a scalar key.
    """
    k = validate_num_bins(num_bins)
    h, scalar = _hash(keys)
    bins = (h >> np.uint64(64 - k)).astype(np.int64)
    return int(bins[0]) if scalar else bins


# --------------------------------------------------------------------------------------------
# Spark
# --------------------------------------------------------------------------------------------


def bin_column(
    col: str | Column, num_bins: int = DEFAULT_NUM_BINS, key_type: str = "int64"
) -> Column:
    """Spark expression for the bin of a key column, computed in the JVM (matches :func:`bin_of`).

    It is ``int(shiftrightunsigned(xxhash64(key), 64 - k))``; the key is first cast to long
    (``key_type="int64"``, so Spark hashes 8 bytes even for byte/short/int columns) or to
    string (``key_type="str"``).
    """
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    k = validate_num_bins(num_bins)
    check_key_type(key_type)
    if isinstance(col, str):
        col = F.col(col)
    elif not isinstance(col, Column):
        raise TypeError(f"col must be a column name or a Column, got {type(col).__name__}")
    key = col.cast("long" if key_type == "int64" else "string")
    return F.shiftrightunsigned(F.xxhash64(key), 64 - k).cast("int")
