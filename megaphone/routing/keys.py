"""Key types megaphone can route, and the checks that turn any batch of keys into one of them.

A batch of keys (a Python int or str, a list, a numpy array, a pandas Series or a pyarrow
(Chunked)Array) is normalized to an int64 numpy array or a null-free ``large_string`` Arrow
array, the two forms the hash in :mod:`megaphone.routing.xxh64` reads, plus a mask of the keys
that are null (``None``). A null key is a key of its own, as in Spark's ``groupBy``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa

__all__ = ["KEY_ARROW_TYPES", "KEY_SPARK_CASTS", "KEY_TYPES", "Keys", "NormalizedKeys",
           "check_key_type", "key_type_of", "normalize_keys"]

#: Key types megaphone can route: 64-bit signed integers and (UTF-8) strings.
KEY_TYPES: tuple[str, ...] = ("int64", "str")
#: Each key type as an Arrow type (a shuffle's ``key`` column, an epoch's outputs).
KEY_ARROW_TYPES: dict[str, pa.DataType] = {"int64": pa.int64(), "str": pa.string()}
#: Each key type as the Spark SQL type a key column is cast to before it is hashed.
KEY_SPARK_CASTS: dict[str, str] = {"int64": "long", "str": "string"}

#: Anything :func:`bin_of` / :func:`xxhash64_unsigned` accept as a batch of keys (or one key).
Keys: TypeAlias = ("int | str | np.integer | Sequence[Any] | np.ndarray | pa.Array "
                   "| pa.ChunkedArray | None")

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


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
    if pa.types.is_null(arr.type) and not len(arr):
        return pa.array([], pa.int64())
    return arr


class NormalizedKeys(NamedTuple):
    """A batch of keys as :func:`normalize_keys` returns it."""

    #: ``"int64"`` or ``"str"``; None when no key type shows: every key is an untyped null.
    kind: str | None
    #: int64 numpy array (``"int64"``, 0 at null keys) or null-free ``large_string`` Arrow
    #: array (``"str"``, ``""`` at null keys); zeros for ``kind=None``.
    payload: np.ndarray | pa.Array
    #: True for a single key (a Python/numpy scalar or None).
    scalar: bool
    #: Boolean mask of the null keys, or None when no key is null.
    nulls: np.ndarray | None


def normalize_keys(keys: Keys) -> NormalizedKeys:
    """Turn any supported key batch (or one key) into :class:`NormalizedKeys`.

    Null keys (``None``, Arrow nulls) are allowed: they are marked in ``nulls`` and stand in
    ``payload`` as 0 or ``""``. Unsupported types raise TypeError, out-of-range ints ValueError.
    """
    if keys is None:
        return NormalizedKeys(None, np.zeros(1, np.int64), True, np.ones(1, bool))
    if isinstance(keys, (bool, np.bool_)):
        raise _type_error("a bool")
    if isinstance(keys, (int, np.integer)):
        return NormalizedKeys("int64", np.array([_check_scalar_int(int(keys))], dtype=np.int64),
                              True, None)
    if isinstance(keys, str):
        return NormalizedKeys("str", pa.array([keys], pa.large_string()), True, None)
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


def _normalize_numpy(keys: np.ndarray) -> NormalizedKeys:
    if keys.ndim != 1:
        if keys.ndim == 0:
            return normalize_keys(keys.item())
        raise ValueError(f"key arrays must be one-dimensional, got shape {keys.shape}")
    kind = keys.dtype.kind
    if kind in "iu":
        _check_int_range(keys)
        return NormalizedKeys("int64", keys.astype(np.int64, copy=False), False, None)
    if kind == "U":
        return NormalizedKeys("str", pa.array(keys, pa.large_string()), False, None)
    if kind == "O":
        return _normalize_arrow(_from_sequence(keys))
    raise _type_error(f"a numpy array of dtype {keys.dtype}")


def _normalize_arrow(keys: pa.Array | pa.ChunkedArray) -> NormalizedKeys:
    if pa.types.is_null(keys.type):  # untyped: every key is null
        return NormalizedKeys(None, np.zeros(len(keys), np.int64), False, np.ones(len(keys), bool))
    kind = _arrow_kind(keys.type)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if pa.types.is_dictionary(keys.type):
        keys = keys.dictionary_decode()
    nulls = None
    if keys.null_count:
        nulls = keys.is_null().to_numpy(zero_copy_only=False)
        keys = keys.fill_null(0 if kind == "int64" else "")
    if kind == "int64":
        values = keys.to_numpy(zero_copy_only=False)
        _check_int_range(values)
        return NormalizedKeys("int64", values.astype(np.int64, copy=False), False, nulls)
    return NormalizedKeys("str", keys.cast(pa.large_string()), False, nulls)


def key_type_of(keys: Keys) -> str:
    """Infer the key type (one of :data:`KEY_TYPES`) of a batch of keys or of a single key.

    Callers use it to check that a batch matches the key type a pipeline was declared with.
    Null keys are skipped (``[1, None]`` is int64; a typed Arrow array is its type). Raises
    TypeError for unsupported or mixed keys, ValueError when no type shows: an empty list, or
    keys that are all untyped nulls (``None``, ``[None]``, an Arrow array of type null). An
    empty numpy/Arrow array has a dtype and is fine.
    """
    if isinstance(keys, np.ndarray) and keys.ndim == 1 and keys.dtype.kind in "iuU":
        return "int64" if keys.dtype.kind in "iu" else "str"
    if isinstance(keys, (pa.Array, pa.ChunkedArray)) and not pa.types.is_null(keys.type):
        return _arrow_kind(keys.type)
    if isinstance(keys, Sequence) and not isinstance(keys, str) and len(keys) == 0:
        raise ValueError("cannot infer the key type of an empty list of keys")
    kind = normalize_keys(keys).kind
    if kind is None:
        raise ValueError("cannot infer the key type of keys that are all None/null")
    return kind
