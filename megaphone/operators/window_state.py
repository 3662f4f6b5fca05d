"""A window aggregate's state: a key's open windows and their accumulators, as stored.

A key's state is ``[[end, [count, sum, min, max]], ...]`` sorted by end (``None`` when no
window is open). Both ways of running :class:`~megaphone.operators.window.WindowAggregate`,
record by record (:mod:`~megaphone.operators.window`) and an epoch at once in columns
(:mod:`~megaphone.operators.window_epoch`), read and write this one layout, and compute results
with :func:`result`, so they are interchangeable on the same stored state.
"""

from __future__ import annotations

from typing import Any


def open_windows(state: Any) -> dict[int, list]:
    """A key's open windows, ``end -> accumulator``, from its stored state (the accumulators
    are the stored lists themselves, which :func:`fold` changes in place)."""
    return {} if state is None else {int(end): acc for end, acc in state}


def stored(windows: dict[int, list]) -> Any:
    """The stored state of a key's open windows (``None`` when none is open)."""
    return [[end, acc] for end, acc in sorted(windows.items())] or None


def fold(agg: str, acc: list | None, value: Any) -> list:
    """One record into a window's accumulator ``[count, sum, min, max]`` of non-null values
    (``count`` counts every record); ``acc`` is changed in place (a new one when ``None``)."""
    if acc is None:
        acc = [0, None, None, None]
    if agg == "count":
        acc[0] += 1
        return acc
    if value is None:
        return acc
    acc[0] += 1
    acc[1] = value if acc[1] is None else acc[1] + value
    acc[2] = value if acc[2] is None else nan_min(acc[2], value)
    acc[3] = value if acc[3] is None else nan_max(acc[3], value)
    return acc


def nan_max(a: Any, b: Any) -> Any:
    """The larger of ``a`` and ``b``, NaN above every number (as in Spark); ``a`` on a tie."""
    return a if a != a or (b == b and a >= b) else b


def nan_min(a: Any, b: Any) -> Any:
    """The smaller of ``a`` and ``b``, NaN above every number (as in Spark); ``a`` on a tie."""
    return b if a != a or (b == b and b < a) else a


def result(agg: str, acc: list) -> Any:
    """A window's aggregate from its accumulator (``avg`` of no value is null)."""
    count, total, low, high = acc
    if agg == "count":
        return count
    if agg == "avg":
        return None if count == 0 else total / count
    return {"sum": total, "min": low, "max": high}[agg]
