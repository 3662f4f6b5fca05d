"""A window aggregate's epoch at one worker, in columns: what
:class:`~megaphone.operators.window.WindowAggregate` computes record by record, computed with
numpy and one Arrow ``group_by`` (docs/operators.md, "Windows at native speed").

1. Each record becomes its windows' contributions: one end per record for tumbling windows,
   ``ceil((size - t % slide) / slide)`` for sliding ones (``numpy.repeat`` and a ramp), in
   event-time order (a stable sort, as each key's records are sorted record by record).
2. Contributions to closed windows (end at or before the watermark) are dropped and counted.
3. The open windows of the keys that got a contribution become *seed* rows, ahead of the
   contributions, and one ``group_by`` over ``(slot, end)`` folds each window: count, sum,
   min, max. Arrow sums a group's rows in row order, so a sum adds the stored sum and then each
   value in time order, exactly as the record-by-record fold does (floats included); min and
   max keep the first of equal values, as it does; NaN is the max of a group that has one and
   the min only of a group of NaN alone (Spark's order, Arrow's min already skips NaN); a sum
   of negative zeros alone is ``-0.0`` (Arrow's starts at ``+0.0``).

What stays per key and per window, in Python: decoding and encoding a key's state (msgpack
of its open windows, the stored layout of :mod:`~megaphone.operators.window_state`), firing
its due timers, and turning each touched window's row into its accumulator and output: the
work is per window, no longer per record and window.

:func:`fold_epoch` declines (returns ``None``, and the runtime runs the epoch record by
record) what it cannot compute exactly in int64 or float64: values of another type (strings,
booleans, decimals), an integer sum that could leave int64 (Python's integers do not wrap),
event times so near the ends of int64 that a window end would wrap, and stored accumulators
that do not fit the value column's type.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.operators.process import Context, EpochBatch, KeyResults
from megaphone.operators.window_state import open_windows, result, stored


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
    windows: dict[int, dict[int, list]] = {}  # slot -> its open windows, once decoded
    fired: list[list[int]] = [[] for _ in batch.keys]
    outputs: list[list[dict[str, Any]]] = [[] for _ in batch.keys]
    due = zip(batch.timer_slots.tolist(), batch.timer_times.tolist(), strict=True)
    for slot, t in sorted(due):
        fired[slot].append(t)
        if slot not in windows:
            windows[slot] = open_windows(states[slot])
        acc = windows[slot].pop(t, None)
        if acc is not None and fn.emit == "append":
            outputs[slot].append(_output(fn, t, acc))
    slots, ends, late, folded = _contributions(fn, batch, values, ctx.watermark)
    new_timers: list[set[int]] = [set() for _ in batch.keys]
    new_states = list(states)
    for slot in windows:
        new_states[slot] = stored(windows[slot])
    if len(slots):
        touched = np.unique(slots).tolist()
        for slot in touched:
            if slot not in windows:
                windows[slot] = open_windows(states[slot])
        rows = _fold(fn.agg, touched, windows, slots, ends, folded)
        if rows is None:
            return None
        for slot in touched:
            new_states[slot] = _apply(fn, rows.pop(slot), windows[slot], outputs[slot],
                                      new_timers[slot])
    ctx.drop_late(late)
    out = KeyResults(new_states, fired, new_timers, late=ctx.late)
    for key, emitted in zip(batch.keys, outputs, strict=True):
        out.out_keys += [key] * len(emitted)
        out.out_values += emitted
    return out


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


def _fold(agg: str, touched: list[int], windows: dict[int, dict[int, list]],
          slots: np.ndarray, ends: np.ndarray, values: pa.Array | None
          ) -> dict[int, list[tuple]] | None:
    """Each touched slot's windows after the epoch, as rows ``(end, count, sum, min, max,
    seeded, contributed)`` sorted by end; ``None`` to decline."""
    seeds = [(slot, end, acc) for slot in touched for end, acc in windows[slot].items()]
    seed_n = pa.array([acc[0] for _, _, acc in seeds], pa.int64())
    columns = {"s": np.concatenate([np.fromiter((s for s, _, _ in seeds), np.int64, len(seeds)),
                                    slots]),
               "e": np.concatenate([np.fromiter((e for _, e, _ in seeds), np.int64, len(seeds)),
                                    ends]),
               "seed": np.concatenate([np.ones(len(seeds), np.int64),
                                       np.zeros(len(slots), np.int64)])}
    aggs: list[tuple] = [("seed", "sum"), ([], "count_all")]
    if values is None:
        columns["n"] = pa.concat_arrays([seed_n, pa.array(np.ones(len(slots), np.int64))])
        aggs.append(("n", "sum"))
    else:
        try:
            stored_parts = [pa.array([acc[i] for _, _, acc in seeds], values.type)
                            for i in (1, 2, 3)]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            return None
        valid = values.is_valid().cast(pa.int64())
        columns["n"] = pa.concat_arrays([seed_n, valid])
        for name, part in zip(("v", "lo", "hi"), stored_parts, strict=True):
            columns[name] = pa.concat_arrays([part, values])
        aggs += [("n", "sum"), ("v", "sum"), ("lo", "min"), ("hi", "max")]
        if pa.types.is_floating(values.type):
            columns["nan"] = pc.is_nan(columns["hi"])
            columns["nz"] = _not_negative_zero(columns["v"])
            aggs += [("nan", "any"), ("nz", "any")]
        else:
            columns["vf"] = columns["v"].cast(pa.float64(), safe=False)
            aggs.append(("vf", "sum"))
    grouped = pa.table(columns).group_by(["s", "e"], use_threads=False).aggregate(aggs)
    return _rows(grouped, values)


def _not_negative_zero(values: pa.Array) -> pa.Array:
    """True for a non-null value that is not ``-0.0`` (a sum is ``-0.0`` iff it has none)."""
    x = values.fill_null(1.0).to_numpy()
    return pa.array(values.is_valid().to_numpy(zero_copy_only=False) &
                    ~((x == 0) & np.signbit(x)))


def _rows(grouped: pa.Table, values: pa.Array | None) -> dict[int, list[tuple]] | None:
    """The grouped windows as rows per slot (see :func:`_fold`); ``None`` if an integer sum
    may have wrapped around."""
    order = pc.sort_indices(grouped, [("s", "ascending"), ("e", "ascending")])
    g = grouped.take(order)
    seeded = g.column("seed_sum").to_numpy() > 0
    contributed = g.column("count_all").to_numpy() > g.column("seed_sum").to_numpy()
    if values is None:
        nones = [None] * g.num_rows
        total, low, high = nones, nones, nones
    else:
        sums = g.column("v_sum")
        high_col = g.column("hi_max")
        if pa.types.is_floating(values.type):
            negative_zero = pc.and_(pc.invert(g.column("nz_any").fill_null(False)),
                                    sums.is_valid())
            sums = pc.if_else(negative_zero, -0.0, sums)
            high_col = pc.if_else(g.column("nan_any").fill_null(False), math.nan, high_col)
        elif g.num_rows and float(pc.max(pc.abs(g.column("vf_sum").fill_null(0.0))).as_py()) \
                >= _SAFE_SUM:
            return None
        total, low, high = sums.to_pylist(), g.column("lo_min").to_pylist(), \
            high_col.to_pylist()
    rows: dict[int, list[tuple]] = {}
    for row in zip(g.column("s").to_pylist(), g.column("e").to_pylist(),
                   g.column("n_sum").to_pylist(), total, low, high, seeded.tolist(),
                   contributed.tolist(), strict=True):
        rows.setdefault(row[0], []).append(row[1:])
    return rows


def _apply(fn: WindowShape, rows: list[tuple], windows: dict[int, list],
           outputs: list[dict[str, Any]], timers: set[int]) -> Any:
    """A touched slot's new stored state from its grouped rows; its update-mode outputs and
    new timers (its windows the epoch opened) go to ``outputs`` and ``timers``."""
    state = []
    for end, count, total, low, high, seeded, contributed in rows:
        if not contributed:
            state.append([end, windows[end]])  # untouched: as stored
            continue
        acc = [count, total, low, high]
        state.append([end, acc])
        if not seeded:
            timers.add(end)
        if fn.emit == "update":
            outputs.append(_output(fn, end, acc))
    return state or None


def _output(fn: WindowShape, end: int, acc: list) -> dict[str, Any]:
    return {"start": end - fn.size_us, "end": end, "value": result(fn.agg, acc)}
