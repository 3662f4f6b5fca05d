"""A window aggregate's epoch at one worker, in columns: what
:class:`~megaphone.operators.window.WindowAggregate` computes record by record, computed with
numpy and one Arrow ``group_by`` (docs/operators.md, "Windows at native speed").

1. Each record becomes its windows' contributions: one end per record for tumbling windows,
   ``ceil((size - t % slide) / slide)`` for sliding ones (``numpy.repeat`` and a ramp), in
   event-time order (a stable sort, as each key's records are sorted record by record).
2. Contributions to closed windows (end at or before the watermark) are dropped and counted.
3. The keys' states are decoded in columns (:func:`~megaphone.operators.window_state.
   decode_all`: one ``frombuffer`` of their packed words) and the due timers close their
   windows (one ``isin`` over ``(slot, end)``).
4. The open windows left become *seed* rows, ahead of the contributions, and one ``group_by``
   over ``(slot, end)`` folds each window: count, sum, min, max. Arrow sums a group's rows in
   row order, so a sum adds the stored sum and then each value in time order, exactly as the
   record-by-record fold does (floats included); min and max keep the first of equal values,
   as it does; NaN is the max of a group that has one and the min only of a group of NaN alone
   (Spark's order, Arrow's min already skips NaN); a sum of negative zeros alone is ``-0.0``
   (Arrow's starts at ``+0.0``).
5. The groups are encoded back into each key's packed state
   (:func:`~megaphone.operators.window_state.encode_all`): the same bytes the record-by-record
   path writes.

Nothing stays in Python per window: the timers fired and set and the outputs go to the
runtime in columns (:class:`~megaphone.operators.process.ColumnResults`).

:func:`fold_epoch` declines (returns ``None``, and the runtime runs the epoch record by
record) what it cannot compute exactly in int64 or float64: values of another type (strings,
booleans, decimals), an integer sum that could leave int64 (Python's integers do not wrap),
event times so near the ends of int64 that a window end would wrap, and stored states of
another value type or that no packed layout holds.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.operators.process import ColumnResults, Context, EpochBatch, pairs_in
from megaphone.operators.window_state import (
    COUNTS,
    FLOATS,
    INTS,
    WindowRows,
    decode_all,
    encode_all,
)


class WindowShape(Protocol):
    """What the columnar fold reads of a :class:`~megaphone.operators.window.WindowAggregate`
    (named here so that this module does not import the one that calls it)."""

    agg: str
    emit: str
    size_us: int

    @property
    def slide(self) -> int: ...

#: Integer sums whose float64 twin reaches this may have left int64: the epoch declines.
_SAFE_SUM = 2.0**62
_INT64 = np.iinfo(np.int64)


def fold_epoch(fn: WindowShape, batch: EpochBatch, states: list[Any], ctx: Context
               ) -> ColumnResults | None:
    """The epoch's results for window ``fn``, equal to running it key by key (as
    :class:`~megaphone.operators.process.ColumnResults`); ``None`` when it declines (the
    module docstring says when). Neither ``states`` nor ``ctx`` is changed before it knows it
    does not decline."""
    n = len(batch.times)
    values = None
    if fn.agg != "count":
        values = _numeric(pa.nulls(n, pa.int64()) if batch.values is None else batch.values)
        if values is None:
            return None
    if n and (int(batch.times.max()) > _INT64.max - fn.size_us or
              int(batch.times.min()) < _INT64.min + 2 * fn.size_us):
        return None
    layout = COUNTS if values is None else \
        FLOATS if pa.types.is_floating(values.type) else INTS
    open_rows = decode_all(states, layout)
    if open_rows is None:
        return None
    due = pairs_in(open_rows.slot, open_rows.end, batch.timer_slots, batch.timer_times)
    slots, ends, late, folded = _contributions(fn, batch, values, ctx.watermark)
    kept = open_rows.take(np.flatnonzero(~due))
    folded_rows = _fold(kept, slots, ends, folded)
    if folded_rows is None:
        return None
    rows, seeded, contributed = folded_rows
    opened = contributed & ~seeded
    ctx.drop_late(late)
    emitted = open_rows.take(np.flatnonzero(due)) if fn.emit == "append" else \
        rows.take(np.flatnonzero(contributed))  # closed windows, or the touched ones
    return ColumnResults(batch.keys, encode_all(rows, len(batch.keys)),
                         (batch.timer_slots, batch.timer_times),
                         (rows.slot[opened], rows.end[opened]),
                         emitted.slot, _outputs(fn, emitted), late=ctx.late)


def _outputs(fn: WindowShape, rows: WindowRows) -> pa.StructArray:
    """The windows ``rows`` as outputs, ``{start, end, value}`` (times as their integers):
    the closed windows in append mode, the touched ones in update mode."""
    return pa.StructArray.from_arrays(
        [pa.array(rows.end - fn.size_us), pa.array(rows.end), _results(fn.agg, rows)],
        names=["start", "end", "value"])


def _results(agg: str, rows: WindowRows) -> pa.Array:
    """Each window's aggregate, as :func:`~megaphone.operators.window_state.result` gives it:
    null where a window has no value; an integer average divided in Python where its sum is
    past 2**53 (numpy's division would round it twice)."""
    if agg == "count":
        return pa.array(rows.count)
    assert rows.total is not None and rows.low is not None and rows.high is not None
    empty = rows.count == 0
    if agg != "avg":
        column = {"sum": rows.total, "min": rows.low, "max": rows.high}[agg]
        return pa.array(column, mask=empty)
    counts = np.where(empty, 1, rows.count)
    means = rows.total / counts
    if rows.layout == INTS:
        exact = np.flatnonzero(np.abs(rows.total) > 2**53)
        means[exact] = [t / c for t, c in zip(rows.total[exact].tolist(),
                                              counts[exact].tolist(), strict=True)]
    return pa.array(means, mask=empty)


def _numeric(values: pa.Array) -> pa.Array | None:
    """``values`` as int64 or float64, or ``None`` for another type (or an unsigned integer
    beyond int64)."""
    t = values.type
    if pa.types.is_null(t):
        return values.cast(pa.int64())
    if pa.types.is_floating(t):
        return values.cast(pa.float64())
    if pa.types.is_integer(t):
        try:
            return values.cast(pa.int64())
        except pa.ArrowInvalid:
            return None
    return None


def _contributions(fn: WindowShape, batch: EpochBatch, values: pa.Array | None,
                   watermark: int | None
                   ) -> tuple[np.ndarray, np.ndarray, int, pa.Array | None]:
    """Every record's contribution to each window that holds it, in event-time order:
    ``(slot, end)`` arrays, the number dropped as late, and the values contributed."""
    order = np.argsort(batch.times, kind="stable")
    times = batch.times[order]
    size, slide = fn.size_us, fn.slide
    offset = times % slide  # floor modulo: the window starts are multiples of slide
    per_record = (size - offset + slide - 1) // slide
    record = np.repeat(np.arange(len(times)), per_record)
    step = np.arange(len(record)) - np.repeat(np.cumsum(per_record) - per_record, per_record)
    ends = (times - offset + size)[record] - step * slide
    late = 0
    if watermark is not None:
        keep = ends > watermark
        late = int(len(ends) - np.count_nonzero(keep))
        record, ends = record[keep], ends[keep]
    taken = order[record]
    return (batch.slots[taken], ends, late,
            None if values is None else values.take(pa.array(taken)))


def _fold(kept: WindowRows, slots: np.ndarray, ends: np.ndarray, values: pa.Array | None
          ) -> tuple[WindowRows, np.ndarray, np.ndarray] | None:
    """The open windows after the epoch, sorted by ``(slot, end)``: the ``kept`` ones (the
    seeds, ahead of the contributions) and the contributions ``(slots, ends, values)`` folded
    by one ``group_by``; with which were seeded and which contributed to. ``None`` to
    decline."""
    columns: dict[str, Any] = {
        "s": np.concatenate([kept.slot, slots]), "e": np.concatenate([kept.end, ends]),
        "seed": np.concatenate([np.ones(len(kept.slot), np.int64),
                                np.zeros(len(slots), np.int64)])}
    aggs: list[tuple] = [("seed", "sum"), ([], "count_all"), ("n", "sum")]
    if values is None:
        columns["n"] = np.concatenate([kept.count, np.ones(len(slots), np.int64)])
    else:
        empty = kept.count == 0  # a window without a value: its sum, min and max are null
        parts = [pa.array(c, values.type, mask=empty) for c in (kept.total, kept.low, kept.high)]
        columns["n"] = pa.concat_arrays([pa.array(kept.count), values.is_valid().cast(pa.int64())])
        for name, part in zip(("v", "lo", "hi"), parts, strict=True):
            columns[name] = pa.concat_arrays([part, values])
        aggs += [("v", "sum"), ("lo", "min"), ("hi", "max")]
        if pa.types.is_floating(values.type):
            columns["nan"] = pc.is_nan(columns["hi"])
            columns["nz"] = _not_negative_zero(columns["v"])
            aggs += [("nan", "any"), ("nz", "any")]
        else:
            columns["vf"] = columns["v"].cast(pa.float64(), safe=False)
            aggs.append(("vf", "sum"))
    grouped = pa.table(columns).group_by(["s", "e"], use_threads=False).aggregate(aggs)
    return _rows(grouped, kept.layout, values)


def _not_negative_zero(values: pa.Array) -> pa.Array:
    """True for a non-null value that is not ``-0.0`` (a sum is ``-0.0`` iff it has none)."""
    x = values.fill_null(1.0).to_numpy()
    return pa.array(values.is_valid().to_numpy(zero_copy_only=False) &
                    ~((x == 0) & np.signbit(x)))


def _rows(grouped: pa.Table, layout: int, values: pa.Array | None
          ) -> tuple[WindowRows, np.ndarray, np.ndarray] | None:
    """The grouped windows as :class:`WindowRows` sorted by slot and end, and which were
    seeded and which contributed to (see :func:`_fold`); ``None`` if an integer sum may have
    wrapped around."""
    g = grouped.take(pc.sort_indices(grouped, [("s", "ascending"), ("e", "ascending")]))
    seeds = g.column("seed_sum").to_numpy()
    seeded, contributed = seeds > 0, g.column("count_all").to_numpy() > seeds
    count = g.column("n_sum").to_numpy()
    rows = WindowRows(g.column("s").to_numpy(), g.column("e").to_numpy(), count, layout)
    if values is None:
        return rows, seeded, contributed
    sums, high = g.column("v_sum"), g.column("hi_max")
    if layout == FLOATS:
        negative_zero = pc.and_(pc.invert(g.column("nz_any").fill_null(False)), sums.is_valid())
        sums = pc.if_else(negative_zero, -0.0, sums)
        high = pc.if_else(g.column("nan_any").fill_null(False), math.nan, high)
    elif g.num_rows and float(pc.max(pc.abs(g.column("vf_sum").fill_null(0.0))).as_py()) \
            >= _SAFE_SUM:
        return None
    rows.total, rows.low, rows.high = (
        c.fill_null(0).to_numpy() for c in (sums, g.column("lo_min"), high))
    return rows, seeded, contributed
