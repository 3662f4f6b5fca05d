"""Plain-Python references for the event-time operators: what a window or a join must emit
for a sequence of epochs, computed directly from the records and the watermark rule (the
watermark of epoch e is the largest event time of epochs before e, less the lateness), with
none of the operators' code."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

#: A record: (key, event time in microseconds, value).
Record = tuple[Any, int, Any]


def watermarks(epochs: list[list[Record]], lateness: int) -> list[int | None]:
    """The watermark each epoch runs with."""
    out: list[int | None] = []
    high = None
    for batch in epochs:
        out.append(None if high is None else high - lateness)
        for _, t, _ in batch:
            high = t if high is None else max(high, t)
    return out


def window_ends(t: int, size: int, slide: int) -> list[int]:
    """Brute force: the ends of the windows [k*slide, k*slide + size) that hold t."""
    first = (t - size) // slide - 1
    return [k * slide + size for k in range(first, t // slide + 2)
            if k * slide <= t < k * slide + size]


def aggregate(agg: str, values: list[Any]) -> Any:
    """Spark's aggregate of a window's values (count counts rows; the others skip nulls)."""
    if agg == "count":
        return len(values)
    present = [v for v in values if v is not None]
    if not present:
        return None
    if agg == "avg":
        return sum(present) / len(present)
    if agg in ("min", "max") and any(isinstance(v, float) and math.isnan(v) for v in present):
        numbers = [v for v in present if not math.isnan(v)]
        if agg == "max" or not numbers:
            return math.nan
        return min(numbers)
    return {"sum": sum, "min": min, "max": max}[agg](present)


def window_reference(epochs: list[list[Record]], size: int, slide: int, agg: str,
                     lateness: int) -> tuple[dict[tuple[Any, int], Any], set, int]:
    """Every window's aggregate over the contributions that were not late, keyed by
    ``(key, end)``; the windows closed by the last epoch's watermark; and the late count."""
    wms = watermarks(epochs, lateness)
    values: dict[tuple[Any, int], list[Any]] = defaultdict(list)
    late = 0
    for batch, wm in zip(epochs, wms, strict=True):
        for key, t, v in batch:
            for end in window_ends(t, size, slide):
                if wm is not None and end <= wm:
                    late += 1
                else:
                    values[(key, end)].append(v)
    last = wms[-1] if wms else None
    closed = {kw for kw in values if last is not None and kw[1] <= last}
    return {kw: aggregate(agg, vs) for kw, vs in values.items()}, closed, late


def join_reference(epochs: list[list[tuple[Any, int, str, Any]]], how: str, *,
                   within: int | None = None, window: int | None = None,
                   ttl: int | None = None, lateness: int = 0) -> tuple[Counter, int]:
    """The join's outputs as a multiset of ``(key, left, right)`` (right None: an unmatched
    left row, emitted once the watermark passed its keep time) and the late count.

    Records are ``(key, time, side, row)``. A row is late if its time (window: its window's
    end) is at or before the epoch's watermark; a pair is emitted when the later row arrives
    while the earlier one is kept (its keep time after the watermark).
    """
    flat = [[(k, t, None) for k, t, _, _ in batch] for batch in epochs]
    wms = watermarks(flat, lateness)

    def keep(t: int) -> float:
        if within is not None:
            return t + within
        if window is not None:
            return t - t % window + window
        if ttl is not None:
            return t + ttl
        return math.inf

    def late_at(t: int) -> float:
        if window is not None:
            return keep(t)
        return t if (within is not None or ttl is not None) else math.inf

    def match(tl: int, tr: int) -> bool:
        if within is not None:
            return abs(tl - tr) <= within
        if window is not None:
            return tl // window == tr // window
        return True

    rows = []  # (epoch, key, time, side, row)
    late = 0
    for e, (batch, wm) in enumerate(zip(epochs, wms, strict=True)):
        for key, t, side, row in batch:
            if wm is not None and late_at(t) <= wm:
                late += 1
            else:
                rows.append((e, key, t, side, row))
    out: Counter = Counter()
    matched = set()
    lefts = [r for r in rows if r[3] == "left"]
    rights = [r for r in rows if r[3] == "right"]
    for i, (el, kl, tl, _, rl) in enumerate(lefts):
        for er, kr, tr, _, rr in rights:
            if kl != kr or not match(tl, tr):
                continue
            earlier_keep, later = (keep(tl), er) if el < er else (keep(tr), el)
            wm = wms[later]
            if el != er and wm is not None and earlier_keep <= wm:
                continue  # the earlier row had left the state
            out[(kl, rl, rr)] += 1
            matched.add(i)
    if how == "left":
        last = wms[-1] if wms else None
        for i, (_, kl, tl, _, rl) in enumerate(lefts):
            if i not in matched and last is not None and keep(tl) <= last:
                out[(kl, rl, None)] += 1
    return out, late
