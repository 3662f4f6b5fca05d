"""Key -> bin routing: the top ``k`` bits of a key's XXH64 hash (seed 42) pick one of ``2**k`` bins.

The hash is exactly Spark SQL's ``xxhash64(key)`` for a ``LongType`` or ``StringType`` column,
reinterpreted as an unsigned 64-bit integer, so the driver (numpy, :func:`bin_of`) and the JVM
(:func:`bin_column`) always agree on which bin a key lives in. XXH64 is implemented here in
vectorized numpy (:mod:`megaphone.routing.xxh64`): arrays of keys are hashed without a per-key
Python loop. A bin's worker under one routing version is looked up in the JVM too
(:func:`owner_column`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from megaphone.routing.keys import KEY_SPARK_CASTS, Keys, check_key_type, normalize_keys
from megaphone.routing.xxh64 import SEED, hash_int64, hash_strings

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "DEFAULT_NUM_BINS",
    "MAX_NUM_BINS",
    "MIN_NUM_BINS",
    "bin_column",
    "bin_of",
    "owner_column",
    "validate_num_bins",
    "xxhash64_unsigned",
]

#: Default number of bins (``2**12``).
DEFAULT_NUM_BINS: int = 4096
#: Smallest allowed number of bins.
MIN_NUM_BINS: int = 2
#: Largest allowed number of bins (``2**20``).
MAX_NUM_BINS: int = 2**20


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


def _hash(keys: Keys) -> tuple[np.ndarray, bool]:
    kind, payload, scalar, nulls = normalize_keys(keys)
    with np.errstate(over="ignore"):
        h = hash_strings(payload) if kind == "str" else hash_int64(payload)
    if nulls is not None:
        h[nulls] = SEED  # Spark's xxhash64 of a null is its seed
    return h, scalar


def xxhash64_unsigned(keys: Keys) -> np.ndarray:
    """Unsigned XXH64 (seed 42) of each key: int64 as 8 little-endian bytes, str as UTF-8.

    Equals Spark SQL's ``xxhash64(key)`` on a LongType / StringType column reinterpreted as
    uint64. Accepts the same inputs as :func:`bin_of`; always returns a uint64 array (length 1
    for a scalar key). A null key (``None``, an Arrow null) hashes to the seed, 42, as Spark's
    ``xxhash64(NULL)`` does.
    """
    return _hash(keys)[0]


def bin_of(keys: Keys, num_bins: int = DEFAULT_NUM_BINS) -> np.ndarray | int:
    """Bin of each key: the top ``log2(num_bins)`` bits of its unsigned XXH64 (seed 42).

    Vectorized; matches :func:`bin_column` computed in Spark. ``keys`` is a Python int/str, a
    list, a numpy array or a pyarrow (Chunked)Array of int64 or str keys. Returns an int64
    array, or a Python int for a scalar key. Null keys (``None``, Arrow nulls) are keys of
    their own: their hash is the seed, 42, as in Spark, so they land in bin
    ``42 >> (64 - log2(num_bins))`` = 0, and ``bin_of(None)`` is 0.
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
    string (``key_type="str"``). A null key hashes to the seed, 42: bin 0.
    """
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    k = validate_num_bins(num_bins)
    check_key_type(key_type)
    if isinstance(col, str):
        col = F.col(col)
    elif not isinstance(col, Column):
        raise TypeError(f"col must be a column name or a Column, got {type(col).__name__}")
    key = col.cast(KEY_SPARK_CASTS[key_type])
    return F.shiftrightunsigned(F.xxhash64(key), 64 - k).cast("int")


def owner_column(owners: np.ndarray, bin_: Column) -> Column:
    """The worker of bin ``bin_`` under one routing version (``owners``: the worker of every
    bin), as a Spark expression.

    The owners are one string literal split into an ``array<int>``, which Spark's optimizer
    folds into a constant: a lookup per record, with no broadcast join (and no extra job) per
    epoch, and one expression however many bins there are. (For local input too: a pipeline
    turns off the rule that would compute it row by row before folding,
    :data:`~megaphone.spark.LOCAL_RELATION_RULE`.)
    """
    from pyspark.sql import functions as F

    text = ",".join(str(int(w)) for w in owners)
    table = F.split(F.lit(text), ",").cast("array<int>")
    return F.element_at(table, bin_ + 1)
