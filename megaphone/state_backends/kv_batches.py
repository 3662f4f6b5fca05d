"""Exported state as Arrow ``(k, v)`` batches: reading, ordering and cutting scans into them,
and decoding them into plain ``(key, state)`` rows (:func:`state_rows`).

Export streams and import streams of every backend are RecordBatches of
:data:`~megaphone.state_backends.base.EXPORT_SCHEMA` (raw keys ``k``, msgpack values ``v``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.state_backends.base import EXPORT_SCHEMA
from megaphone.state_backends.encoding import (
    byte_lengths,
    decode_int_keys,
    decode_keys,
    unpack_ints,
    unpack_values,
)
from megaphone.state_backends.timer_keys import without_timers

_SCAN_BLOCK = 1024  # entries pulled from a range scan at a time while exporting


def strictly_increasing(keys: pa.Array) -> bool:
    """True if the binary Arrow array is sorted with no duplicates (byte order)."""
    n = len(keys)
    if n < 2:
        return True
    return bool(pc.all(pc.less(keys.slice(0, n - 1), keys.slice(1))).as_py())


def sorted_unique(keys: pa.Array, values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Sort an import batch by key, keeping the last value of a repeated key (SST needs it)."""
    if strictly_increasing(keys):
        return keys, values
    order = pc.sort_indices(keys)  # stable: among equal keys, later rows stay later
    keys, values = keys.take(order), values.take(order)
    n = len(keys)
    keep = pc.not_equal(keys.slice(0, n - 1), keys.slice(1))
    keep = pa.concat_arrays([keep, pa.array([True])])
    return keys.filter(keep), values.filter(keep)


def kv_columns(batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
    """The ``k`` and ``v`` binary columns of an exported batch (``ValueError`` if missing)."""
    names = batch.schema.names
    if "k" not in names or "v" not in names:
        raise ValueError(f"state batches need columns 'k' and 'v', got {names}")
    return batch.column("k"), batch.column("v")


def record_batch(keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
    """One ``(k, v)`` batch of the export schema from raw keys and values."""
    return pa.RecordBatch.from_arrays(
        [pa.array(keys, type=pa.binary()), pa.array(values, type=pa.binary())],
        schema=EXPORT_SCHEMA,
    )


def cut_batches(
    scans: Iterable[Iterator[tuple[bytes, bytes]]], chunk_bytes: int
) -> Iterator[pa.RecordBatch]:
    """Concatenate raw ``(key, value)`` scans into batches of about ``chunk_bytes`` each.

    A batch closes at the first entry that brings it to ``chunk_bytes`` of keys plus values.
    """
    # Pull entries in small blocks and cut batches with a vectorized cumulative size, so
    # memory stays bounded by one batch + one block and no per-entry Python arithmetic runs.
    ks: list[bytes] = []
    vs: list[bytes] = []
    size = 0
    for it in scans:
        while block := list(itertools.islice(it, _SCAN_BLOCK)):
            bk = [k for k, _ in block]
            bv = [v for _, v in block]
            csum = np.cumsum(byte_lengths(bk) + byte_lengths(bv)) + size
            i = 0
            while True:
                # first entry (from i) at which the open batch reaches chunk_bytes
                j = int(np.searchsorted(csum[i:], chunk_bytes))
                if i + j >= len(block):
                    ks += bk[i:]
                    vs += bv[i:]
                    size = int(csum[-1])
                    break
                ks += bk[i:i + j + 1]
                vs += bv[i:i + j + 1]
                yield record_batch(ks, vs)
                ks, vs = [], []
                csum = csum - csum[i + j]
                i += j + 1
                size = 0
                if i == len(block):
                    break
    if ks:
        yield record_batch(ks, vs)


def state_rows(schema: pa.Schema, key_type: str, k: pa.Array, v: pa.Array,
               decoded: bool) -> pa.RecordBatch:
    """One exported chunk as ``(key, state)`` rows of ``schema``: int keys and int states are
    decoded without Python objects (others per key); undecoded states stay msgpack bytes.
    Timer keys are no state rows (and no plain keys): they are left out."""
    k, v = without_timers(k, v)
    ints = decode_int_keys(k) if key_type == "int64" else None
    if ints is not None:
        keys = pa.array(ints[1], schema.field(0).type)
    else:
        _, raw_keys = decode_keys(k.to_pylist(), key_type)
        keys = pa.array(raw_keys.tolist() if isinstance(raw_keys, np.ndarray) else raw_keys,
                        schema.field(0).type)
    if not decoded:
        values = v.cast(schema.field(1).type)
    else:
        nums = unpack_ints(v)
        values = pa.array(nums if nums is not None else unpack_values(v.to_pylist()),
                          schema.field(1).type)
    return pa.RecordBatch.from_arrays([keys, values], schema=schema)
