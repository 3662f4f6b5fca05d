"""A window aggregate's state: a key's open windows and their accumulators, as stored.

A window's accumulator is ``[count, sum, min, max]`` of its non-null values (``count`` counts
every record for ``agg="count"``, whose sum, min and max stay ``None``; they are ``None`` too
while a window has no value). A key's state is its open windows sorted by end, packed as
little-endian 64-bit words (``None`` when no window is open): a header word naming the layout
(:data:`COUNTS`: ``end, count`` per window; :data:`INTS` or :data:`FLOATS`: ``end, count, sum,
min, max``, float64 bits for floats, zeros where ``count`` is 0). So an epoch decodes and
encodes all its keys' states with numpy (:func:`decode_all`, :func:`encode_all`) instead of
Python per window. Accumulators these layouts cannot hold (an integer sum beyond int64,
values of other types) are kept as the list ``[[end, [count, sum, min, max]], ...]``, the
layout every state had before this one and which is still read.

Both ways of running :class:`~megaphone.operators.window.WindowAggregate`, record by record
(:mod:`~megaphone.operators.window`) and an epoch at once in columns
(:mod:`~megaphone.operators.window_epoch`), read and write these layouts through this module,
and compute results with :func:`result`, so they are interchangeable on the same stored state;
one key's state is packed and read by the same :func:`encode_all` and :func:`decode_all` as an
epoch's, so both write the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Layouts of a packed state (the header word's low byte): counts only, or with integer or
#: float sums, minima and maxima.
COUNTS, INTS, FLOATS = 1, 2, 3
#: Words per window of each layout.
WIDTH = {COUNTS: 2, INTS: 5, FLOATS: 5}
#: The header word without its layout byte ("megawin").
_MAGIC = int.from_bytes(b"megawin", "big") << 8
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def open_windows(state: Any) -> dict[int, list]:
    """A key's open windows, ``end -> accumulator``, from its stored state (new lists, which
    :func:`fold` may change in place)."""
    if state is None:
        return {}
    if not isinstance(state, bytes):  # the list layout
        return {int(end): acc for end, acc in state}
    rows = decode_all([state], _layout(int.from_bytes(state[:8], "little")))
    assert rows is not None  # its own layout
    return dict(zip(rows.end.tolist(), rows.accumulators(), strict=True))


def stored(windows: dict[int, list]) -> Any:
    """The stored state of a key's open windows (``None`` when none is open): packed by
    :func:`encode_all`, as an epoch's keys are, or the list layout when a value does not fit
    one (:func:`layout_of`)."""
    if not windows:
        return None
    items = sorted(windows.items())
    layout = layout_of([acc for _, acc in items])
    if layout is None:
        return [[end, acc] for end, acc in items]
    ends = np.array([end for end, _ in items], np.int64)
    rows = WindowRows(np.zeros(len(items), np.int64), ends,
                      np.array([acc[0] for _, acc in items], np.int64), layout)
    if layout != COUNTS:
        vtype = np.float64 if layout == FLOATS else np.int64
        values = np.array([acc[1:] if acc[0] else (0, 0, 0) for _, acc in items], vtype)
        rows.total, rows.low, rows.high = values[:, 0], values[:, 1], values[:, 2]
    return encode_all(rows, 1)[0]


def layout_of(accs: list[list]) -> int | None:
    """The packed layout of these accumulators (one key's), ``None`` if none holds them:
    :data:`COUNTS` when no window has a value, else :data:`INTS` or :data:`FLOATS` when every
    value is a Python int within int64, or every one a float."""
    if any(type(acc[0]) is not int or not _INT64_MIN <= acc[0] <= _INT64_MAX for acc in accs):
        return None
    if all(v is None for acc in accs for v in acc[1:]):
        return COUNTS
    values: list[Any] = []
    for acc in accs:  # a value layout's window has its three values, or none and count 0
        if acc[0] == 0 and acc[1:] == [None, None, None]:
            continue
        if acc[0] == 0 or None in acc[1:]:
            return None
        values += acc[1:]
    if all(type(v) is float for v in values):
        return FLOATS
    if all(type(v) is int and _INT64_MIN <= v <= _INT64_MAX for v in values):
        return INTS
    return None


@dataclass
class WindowRows:
    """Open windows of many keys as columns, sorted by ``(slot, end)``: each window's key
    ``slot``, ``end``, ``count`` and, for value layouts, ``total``, ``low``, ``high`` (int64 or
    float64 as ``layout`` says; meaningless where ``count`` is 0)."""

    slot: np.ndarray
    end: np.ndarray
    count: np.ndarray
    layout: int
    total: np.ndarray | None = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    def take(self, at: np.ndarray) -> WindowRows:
        """The windows at indexes ``at`` (ascending: the order stays)."""
        values = [None if c is None else c[at] for c in (self.total, self.low, self.high)]
        return WindowRows(self.slot[at], self.end[at], self.count[at], self.layout, *values)

    def accumulators(self) -> list[list]:
        """Each window's ``[count, sum, min, max]`` (sum, min and max ``None`` without a
        value), as :func:`fold` and :func:`result` take them."""
        counts = self.count.tolist()
        if self.total is None or self.low is None or self.high is None:
            return [[count, None, None, None] for count in counts]
        return [[count, total, low, high] if count else [count, None, None, None]
                for count, total, low, high in zip(counts, self.total.tolist(),
                                                   self.low.tolist(), self.high.tolist(),
                                                   strict=True)]


def decode_all(states: list[Any], layout: int) -> WindowRows | None:
    """The open windows of ``states`` (slot ``i`` is ``states[i]``) as :class:`WindowRows` of
    ``layout`` (a value layout also reads :data:`COUNTS` states whose windows have no value
    yet); ``None`` when a state has another layout or cannot be packed (the caller
    declines)."""
    raws: list[bytes] = []
    slots: list[int] = []
    for i, state in enumerate(states):
        if state is None:
            continue
        if not isinstance(state, bytes):  # the list layout: packed here if it can be
            state = stored(open_windows(state))
            if not isinstance(state, bytes):
                return None
        raws.append(state)
        slots.append(i)
    width = WIDTH[layout]
    lengths = np.fromiter(map(len, raws), np.int64, len(raws)) // 8
    words = np.frombuffer(b"".join(raws), "<i8")
    starts = np.cumsum(lengths) - lengths
    headers = words[starts]
    own = headers == _header_word(layout)
    counts_only = headers == _header_word(COUNTS)
    if not np.all(own | counts_only):
        return None
    widths = np.where(own, width, WIDTH[COUNTS])
    per_key = (lengths - 1) // widths
    slot = np.repeat(np.asarray(slots, np.int64), per_key)
    rows = np.zeros((int(per_key.sum()), width), np.int64)
    row_widths = np.repeat(widths, per_key)
    first = np.repeat(starts + 1, per_key) + \
        (np.arange(len(rows)) - np.repeat(np.cumsum(per_key) - per_key, per_key)) * row_widths
    rows[:, 0], rows[:, 1] = words[first], words[first + 1]
    if layout != COUNTS:
        if np.any(rows[row_widths != width, 1]):  # a count's windows, not a value's
            return None
        wide = np.flatnonzero(row_widths == width)
        for column in (2, 3, 4):
            rows[wide, column] = words[first[wide] + column]
        values = rows[:, 2:].view("<f8") if layout == FLOATS else rows[:, 2:]
        return WindowRows(slot, rows[:, 0], rows[:, 1], layout, values[:, 0].copy(),
                          values[:, 1].copy(), values[:, 2].copy())
    return WindowRows(slot, rows[:, 0], rows[:, 1], layout)


def encode_all(rows: WindowRows, slots: int) -> list[bytes | None]:
    """The packed state of each of ``slots`` keys from ``rows`` (sorted by ``(slot, end)``),
    ``None`` for a key without an open window: each key's own layout is :data:`COUNTS` when
    none of its windows has a value, else ``rows.layout``, as :func:`stored` picks it."""
    out: list[bytes | None] = [None] * slots
    if not len(rows.slot):
        return out
    keys, first, per_key = np.unique(rows.slot, return_index=True, return_counts=True)
    layouts = np.full(len(keys), COUNTS)
    if rows.layout != COUNTS:
        valued = np.add.reduceat((rows.count > 0).astype(np.int64), first) > 0
        layouts[valued] = rows.layout
    widths = np.array([WIDTH[x] for x in layouts.tolist()], np.int64)
    sizes = 1 + per_key * widths
    starts = np.cumsum(sizes) - sizes
    words = np.zeros(int(sizes.sum()), np.int64)
    words[starts] = [_header_word(x) for x in layouts.tolist()]
    row_widths = np.repeat(widths, per_key)
    at = np.repeat(starts + 1, per_key) + \
        (np.arange(len(rows.slot)) - np.repeat(first, per_key)) * row_widths
    words[at], words[at + 1] = rows.end, rows.count
    if rows.layout != COUNTS:
        wide = np.flatnonzero((row_widths == WIDTH[rows.layout]) & (rows.count > 0))
        for offset, column in enumerate((rows.total, rows.low, rows.high), start=2):
            assert column is not None
            bits = column.view("<i8") if rows.layout == FLOATS else column
            words[at[wide] + offset] = bits[wide]
    data = words.astype("<i8", copy=False).tobytes()
    for key, start, size in zip(keys.tolist(), starts.tolist(), sizes.tolist(), strict=True):
        out[key] = data[start * 8:(start + size) * 8]
    return out


def _header_word(layout: int) -> int:
    return _MAGIC | layout


def _layout(word: int) -> int:
    layout = word & 0xFF
    if word & ~0xFF != _MAGIC or layout not in WIDTH:
        raise ValueError(f"not a window aggregate's state (header word {word:#x})")
    return layout


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
