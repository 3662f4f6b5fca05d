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

What stays in Python per window: the timers of the windows the epoch opened (a set per key,
as the runtime takes them) and the outputs (a dict per window, as every operator's).

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

from megaphone.operators.process import Context, EpochBatch, KeyResults, pairs_in
from megaphone.operators.window_state import (
    COUNTS,
    FLOATS,
    INTS,
    WindowRows,
    decode_all,
    encode_all,
    result,
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
               ) -> KeyResults | None:
    """The epoch's :class:`~megaphone.operators.process.KeyResults` for window ``fn``, equal
    to running it key by key; ``None`` when it declines (the module docstring says when).
    Neither ``states`` nor ``ctx`` is changed before it knows it does not decline."""
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
    fired, due = _due(batch, open_rows)
    slots, ends, late, folded = _contributions(fn, batch, values, ctx.watermark)
    kept = open_rows.take(np.flatnonzero(~due))
    folded_rows = _fold(kept, slots, ends, folded)
    if folded_rows is None:
        return None
    rows, seeded, contributed = folded_rows
    new_timers: list[set[int]] = [set() for _ in batch.keys]
    opened = contributed & ~seeded
    for slot, end in zip(rows.slot[opened].tolist(), rows.end[opened].tolist(), strict=True):
        new_timers[slot].add(end)
    ctx.drop_late(late)
    out = KeyResults(encode_all(rows, len(batch.keys)), fired, new_timers, late=ctx.late)
    emitted = open_rows.take(np.flatnonzero(due)) if fn.emit == "append" else \
        rows.take(np.flatnonzero(contributed))  # closed windows, or the touched ones
    _outputs(fn, batch.keys, emitted, out)
    return out


def _due(batch: EpochBatch, rows: WindowRows) -> tuple[list[list[int]], np.ndarray]:
    """Each slot's due timers in time order, and which of the open ``rows`` they close."""
    fired: list[list[int]] = [[] for _ in batch.keys]
    t_slots, t_times = batch.timer_slots, batch.timer_times
    for slot, t in sorted(zip(t_slots.tolist(), t_times.tolist(), strict=True)):
        fired[slot].append(t)
    return fired, pairs_in(rows.slot, rows.end, t_slots, t_times)


def _outputs(fn: WindowShape, keys: list[Any], rows: WindowRows, out: KeyResults) -> None:
    """The windows ``rows`` (sorted by slot and end) as outputs of their keys, into ``out``:
    the closed windows in append mode, the touched ones in update mode."""
    results = [result(fn.agg, acc) for acc in rows.accumulators()]
    size = fn.size_us
    out.out_keys += [keys[s] for s in rows.slot.tolist()]
    out.out_values += [{"start": end - size, "end": end, "value": v}
                       for end, v in zip(rows.end.tolist(), results, strict=True)]


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
