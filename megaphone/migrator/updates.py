"""Keyed update functions: the built-in aggregations (vectorized) and a general Python ``f``.

An update turns one epoch's records of a worker into per-key state changes and outputs. It is
engine-agnostic: it sees a pyarrow table of records and a state backend, nothing of Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from megaphone.migrator import columns as C

#: ``f(key, values, state) -> (new_state, outputs)``: the general keyed update.
UpdateFn = Callable[[Any, list, Any], tuple[Any, Iterable[Any]]]

AGGREGATIONS = ("count", "sum", "min", "max")
_STRING = pa.string()


@dataclass(frozen=True)
class Update:
    """What a pipeline does per key: a built-in aggregation name or a general function.

    ``value_kind`` is ``"int"`` or ``"float"`` for the aggregations over a value column (the
    type of the stored aggregate); ``output_type`` is the pyarrow type of a general ``f``'s
    outputs.
    """

    kind: str
    fn: UpdateFn | None = None
    value_kind: str = "int"
    output_type: pa.DataType = _STRING

    @property
    def is_builtin(self) -> bool:
        """True for count/sum/min/max, which run vectorized with no per-record Python call."""
        return self.fn is None

    def output_arrow_type(self) -> pa.DataType:
        """The pyarrow type of the output value column."""
        if not self.is_builtin:
            return self.output_type
        if self.kind == "count" or self.value_kind == "int":
            return pa.int64()
        return pa.float64()


def make_update(
    update: str | UpdateFn, value_kind: str | None, output_type: pa.DataType = _STRING
) -> Update:
    """Check a user's ``update`` argument and build the :class:`Update` for it."""
    if callable(update):
        return Update("custom", update, output_type=output_type)
    if update not in AGGREGATIONS:
        raise ValueError(f"update must be one of {AGGREGATIONS} or a callable, got {update!r}")
    if update != "count" and value_kind not in ("int", "float"):
        raise ValueError(f"update {update!r} needs a numeric value column")
    return Update(update, None, value_kind or "int")


def _unpack(raw: bytes | None) -> Any:
    return None if raw is None else msgpack.unpackb(raw)


def apply_builtin(
    update: Update, records: pa.Table, old_raw: list[bytes | None]
) -> tuple[list[bytes], pa.Array]:
    """Merge one epoch's per-key partial aggregates into the stored values.

    ``records`` holds one row per key (columns ``key``, ``_bin``, ``partial``) and ``old_raw``
    the stored msgpack value of each key (None when new). Returns the new msgpack values and
    the new aggregates as an arrow array (the epoch's outputs).
    """
    partial = records.column("partial").to_numpy()
    present = np.fromiter((raw is not None for raw in old_raw), bool, len(old_raw))
    dtype = np.float64 if update.output_arrow_type() == pa.float64() else np.int64
    old = np.zeros(len(old_raw), dtype=dtype)
    if present.any():
        old[present] = [msgpack.unpackb(raw) for raw in old_raw if raw is not None]
    partial = partial.astype(dtype, copy=False)
    if update.kind in ("count", "sum"):
        new = old + partial
    elif update.kind == "min":
        new = np.where(present, np.minimum(old, partial), partial)
    else:
        new = np.where(present, np.maximum(old, partial), partial)
    packb = msgpack.Packer().pack
    return [packb(v) for v in new.tolist()], pa.array(new)


def partial_aggregates(update: Update, records: pa.Table) -> pa.Table:
    """Group an epoch's records by key: one row per key with its ``partial`` aggregate (the
    null key included: Arrow's ``group_by`` groups nulls together, like Spark's)."""
    if update.kind == "count":
        grouped = records.group_by([C.KEY, C.BIN], use_threads=False).aggregate(
            [([], "count_all")]
        )
        return grouped.rename_columns([C.KEY, C.BIN, "partial"])
    table = records.filter(pa.compute.is_valid(records.column(C.VALUE)))
    grouped = table.group_by([C.KEY, C.BIN], use_threads=False).aggregate(
        [(C.VALUE, update.kind)]
    )
    return grouped.rename_columns([C.KEY, C.BIN, "partial"])


def apply_custom(
    update: Update, records: pa.Table, old_raw: list[bytes | None]
) -> tuple[list[bytes], list[Any], list[Any]]:
    """Run ``f`` once per key of the epoch (``records``: ``key``, ``_bin``, ``values`` list).

    The null key is a key like any: ``f`` gets ``key=None`` for it. Returns the new msgpack
    states, and the output rows as parallel lists of keys and values.
    """
    assert update.fn is not None
    keys = records.column(C.KEY).to_pylist()
    values = records.column("values").to_pylist()
    packb = msgpack.Packer().pack
    new_raw: list[bytes] = []
    out_keys: list[Any] = []
    out_values: list[Any] = []
    for key, vals, raw in zip(keys, values, old_raw, strict=True):
        state, outputs = update.fn(key, vals, _unpack(raw))
        new_raw.append(packb(state))
        for out in outputs:
            out_keys.append(key)
            out_values.append(out)
    return new_raw, out_keys, out_values


def group_values(records: pa.Table) -> pa.Table:
    """Group an epoch's records by key for ``f``: ``key``, ``_bin``, ``values`` (a list).

    Arrow's ``group_by`` puts the records with a null key in one group of their own.
    """
    grouped = records.group_by([C.KEY, C.BIN], use_threads=False).aggregate([(C.VALUE, "list")])
    return grouped.rename_columns([C.KEY, C.BIN, "values"])
