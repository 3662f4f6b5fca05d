"""A join's epoch at one worker, in columns: what :class:`~megaphone.operators.join.Join`
computes key by key (``on_timer`` for each due timer, then ``process``), computed with numpy
over the epoch's keys at once (docs/operators.md, "Joins at native speed").

1. **Expiry.** The stored rows' event times are read out of the keys' states into one array
   per side; a row leaves when a due timer of its key is at or after its keep time, found for
   every row at once by one sort of rows and timers. A left-outer join emits each unmatched
   left row that leaves, in the order the timers would: by the timer that removes it, then by
   its place in the key's list.
2. **Matching.** The epoch's rows that are not late, sorted by key and event time (as each
   key's rows are sorted), are matched by a sort-merge equi-join on the key (and the tumbling
   window, with ``window_us``): the new left rows against every right row of their key (the
   stored ones, then the new ones), then the stored left rows against the new right rows;
   ``within_us`` keeps the pairs close enough in time. The pairs come out in the order the
   nested loops of the per-key path emit them.
3. **State.** Each key's list stays as stored, one msgpack value per key: the rows that did not
   leave, in their order, then the new rows; a left row's ``matched`` flag is set when it
   matched. The bytes equal the per-key path's, so either path runs on the other's state.

What stays per row in Python is what the stored format needs: reading each stored row's time
(``map(itemgetter(0), ...)``, no Python call per row), building a new row's list, and one
output dict per pair. There is no Python loop over pairs of rows that do not match.

:func:`join_epoch` declines (returns ``None``, and the runtime runs the epoch key by key, which
raises the per-key path's errors) a value column that is not ``struct<left, right>``, a record
that is not late and has no row (or no value), and event times or bounds beyond ``2**61`` in
magnitude (numpy's int64 would wrap where Python's integers do not).
"""

from __future__ import annotations

from itertools import chain, compress
from operator import itemgetter
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.operators.process import Context, EpochBatch, KeyResults

#: Keep time of a row that is never purged.
FOREVER = 2**63 - 1
#: Event times and bounds within this magnitude cannot wrap int64 in any sum or difference.
_SAFE = 2**61
_time = itemgetter(0)
_row = itemgetter(1)
_matched = itemgetter(2)


class JoinShape(Protocol):
    """What the columnar join reads of a :class:`~megaphone.operators.join.Join` (named here
    so that this module does not import the one that calls it)."""

    how: str
    within_us: int | None
    window_us: int | None
    ttl_us: int | None

    def keep_until(self, time_us: Any) -> Any: ...

    def late_at(self, time_us: Any) -> Any: ...


class _Side:
    """One side's rows as flat arrays, in key (slot) order then list order: ``rows`` the stored
    lists themselves (``[time, row, ...]``), ``slots`` and ``times`` their columns."""

    __slots__ = ("rows", "slots", "times")

    def __init__(self, rows: list, slots: np.ndarray, times: np.ndarray) -> None:
        self.rows, self.slots, self.times = rows, slots, times

    @classmethod
    def stored(cls, lists: list[list]) -> _Side:
        sizes = np.fromiter(map(len, lists), np.int64, len(lists))
        rows = list(chain.from_iterable(lists))
        return cls(rows, np.repeat(np.arange(len(lists)), sizes),
                   np.fromiter(map(_time, rows), np.int64, len(rows)))

    def keep(self, mask: np.ndarray) -> _Side:
        return _Side(list(compress(self.rows, mask.tolist())), self.slots[mask],
                     self.times[mask])


def join_epoch(fn: JoinShape, batch: EpochBatch, states: list[Any], ctx: Context
               ) -> KeyResults | None:
    """The epoch's :class:`~megaphone.operators.process.KeyResults` for join ``fn``, equal to
    running it key by key; ``None`` when it declines (the module docstring says when).
    Neither ``states`` nor ``ctx`` is changed before it knows it does not decline."""
    new = _new_rows(fn, batch, ctx.watermark)
    if new is None:
        return None
    late, order, is_left, left_values, right_values = new
    n_slots = len(batch.keys)
    sides = [[[], []] if s is None else s for s in states]
    lefts = _Side.stored([s[0] for s in sides])
    rights = _Side.stored([s[1] for s in sides])
    if _unsafe(fn, lefts.times) or _unsafe(fn, rights.times):
        return None
    due = sorted(zip(batch.timer_slots.tolist(), batch.timer_times.tolist(), strict=True))
    fired: list[list[int]] = [[] for _ in range(n_slots)]
    for slot, t in due:
        fired[slot].append(t)
    timer_slots = np.array([s for s, _ in due], np.int64)
    timer_times = np.array([t for _, t in due], np.int64)

    # 1. expiry: the timer that removes each stored row (-1: none does)
    left_by = _removed_by(lefts.slots, _keep_until(fn, lefts.times), timer_slots, timer_times)
    right_by = _removed_by(rights.slots, _keep_until(fn, rights.times), timer_slots,
                           timer_times)
    streams: list[tuple[np.ndarray, list[Any]]] = []
    if fn.how == "left":
        gone = np.flatnonzero(left_by >= 0)
        unmatched = gone[~np.fromiter(map(_matched, (lefts.rows[i] for i in gone.tolist())),
                                      bool, len(gone))]
        emitted = unmatched[np.lexsort((unmatched, left_by[unmatched]))]
        streams.append((lefts.slots[emitted],
                        [{"left": lefts.rows[i][1], "right": None} for i in emitted.tolist()]))
    lefts, rights = lefts.keep(left_by < 0), rights.keep(right_by < 0)

    # 2. matching: the new rows sorted by slot and event time, then the pairs in loop order
    new_slots, new_times = batch.slots[order], batch.times[order]
    on_left = is_left[order]
    new_lefts = _Side(left_values.take(pa.array(order[on_left])).to_pylist(),
                      new_slots[on_left], new_times[on_left])
    new_rights = _Side(right_values.take(pa.array(order[~on_left])).to_pylist(),
                       new_slots[~on_left], new_times[~on_left])
    all_rights = _Side(rights.rows + new_rights.rows,
                       np.concatenate([rights.slots, new_rights.slots]),
                       np.concatenate([rights.times, new_rights.times]))
    groups = _groups(fn, [new_lefts, all_rights, lefts, new_rights])
    a_left, a_right = _pairs(fn, new_lefts, all_rights, groups[0], groups[1])
    b_left, b_right = _pairs(fn, lefts, new_rights, groups[2], groups[3])
    right_rows = list(map(_row, rights.rows)) + new_rights.rows
    streams.append((new_lefts.slots[a_left],
                    [{"left": new_lefts.rows[i], "right": right_rows[j]}
                     for i, j in zip(a_left.tolist(), a_right.tolist(), strict=True)]))
    streams.append((lefts.slots[b_left],
                    [{"left": lefts.rows[i][1], "right": new_rights.rows[j]}
                     for i, j in zip(b_left.tolist(), b_right.tolist(), strict=True)]))

    # 3. state: the stored rows kept, then the new ones; matched left rows flagged
    for i in np.unique(b_left).tolist():
        row = lefts.rows[i]
        if not row[2]:
            lefts.rows[i] = [row[0], row[1], True]
    a_matched = np.zeros(len(new_lefts.rows), bool)
    a_matched[a_left] = True
    new_left_rows = [[t, row, m] for t, row, m in zip(
        new_lefts.times.tolist(), new_lefts.rows, a_matched.tolist(), strict=True)]
    new_right_rows = [[t, row] for t, row in zip(new_rights.times.tolist(), new_rights.rows,
                                                 strict=True)]
    new_states = _states(n_slots, lefts, new_lefts.slots, new_left_rows, rights,
                         new_rights.slots, new_right_rows)
    timers = _timers(fn, n_slots, new_slots, new_times)
    ctx.drop_late(late)
    slots = np.concatenate([s for s, _ in streams])
    values = list(chain.from_iterable(v for _, v in streams))
    by_key = np.argsort(slots, kind="stable")  # per key: expiry, then the pairs
    return KeyResults(new_states, fired, timers, [batch.keys[s] for s in slots[by_key].tolist()],
                      [values[i] for i in by_key.tolist()], ctx.late)


def _new_rows(fn: JoinShape, batch: EpochBatch, watermark: int | None
              ) -> tuple[int, np.ndarray, np.ndarray, pa.Array, pa.Array] | None:
    """The epoch's rows that are not late: the late count, their indices sorted by slot and
    event time (stable, as each key's rows are sorted), which are left rows, and the left and
    right row columns; ``None`` to decline."""
    values = batch.values
    if values is None or not pa.types.is_struct(values.type) or \
            {f.name for f in values.type} != {"left", "right"} or \
            _unsafe(fn, batch.times):
        return None
    late_mask = np.zeros(len(batch.times), bool)
    if watermark is not None:
        late_mask = _late_at(fn, batch.times) <= watermark
    left = pc.struct_field(values, "left")
    right = pc.struct_field(values, "right")
    is_left = _valid(left) & _valid(values)
    is_right = ~is_left & _valid(right) & _valid(values)
    if np.any(~late_mask & ~is_left & ~is_right):
        return None  # a record with no row: the per-key path raises its error
    by_time = np.argsort(batch.times, kind="stable")
    by_slot = by_time[np.argsort(batch.slots[by_time], kind="stable")]
    order = by_slot[~late_mask[by_slot]]
    return int(np.count_nonzero(late_mask)), order, is_left, left, right


def _valid(values: pa.Array) -> np.ndarray:
    return values.is_valid().to_numpy(zero_copy_only=False)


def _unsafe(fn: JoinShape, times: np.ndarray) -> bool:
    """Whether int64 arithmetic on these event times (and ``fn``'s bound) could wrap."""
    bound = max(b or 0 for b in (fn.within_us, fn.window_us, fn.ttl_us))
    return bound >= _SAFE or (len(times) > 0 and (int(times.max()) >= _SAFE or
                                                  int(times.min()) <= -_SAFE))


def _keep_until(fn: JoinShape, times: np.ndarray) -> np.ndarray:
    """Each row's keep time (``Join.keep_until``, element-wise)."""
    return _per_row(fn.keep_until(times), times)


def _late_at(fn: JoinShape, times: np.ndarray) -> np.ndarray:
    """The watermark from which each row is late (``Join.late_at``, element-wise)."""
    return _per_row(fn.late_at(times), times)


def _per_row(value: Any, times: np.ndarray) -> np.ndarray:
    """A rule's value for every row: its array, or a constant (``FOREVER``) repeated."""
    out = np.asarray(value, np.int64)
    return out if out.ndim else np.full(len(times), out, np.int64)


def _removed_by(slots: np.ndarray, keeps: np.ndarray, timer_slots: np.ndarray,
                timer_times: np.ndarray) -> np.ndarray:
    """For each row, the rank of the first due timer of its slot at or after its keep time
    (the ``on_timer`` call that removes it), ``-1`` if none: rows and timers sorted together
    by slot and time, a row before a timer of the same time."""
    n = len(slots)
    if not n or not len(timer_slots):
        return np.full(n, -1, np.int64)
    all_slots = np.concatenate([slots, timer_slots])
    all_times = np.concatenate([keeps, timer_times])
    is_timer = np.concatenate([np.zeros(n, np.int64), np.ones(len(timer_slots), np.int64)])
    order = np.lexsort((is_timer, all_times, all_slots))
    total = len(order)
    at = np.where(is_timer[order] == 1, np.arange(total), total)
    next_timer = np.minimum.accumulate(at[::-1])[::-1]
    position = np.empty(total, np.int64)
    position[order] = np.arange(total)
    following = next_timer[position[:n]]
    found = following < total
    same = np.zeros(n, bool)
    same[found] = all_slots[order[following[found]]] == slots[found]
    return np.where(same, following, -1)


def _groups(fn: JoinShape, sides: list[_Side]) -> list[np.ndarray]:
    """Each row's equi-join group: its slot, or its slot and tumbling window (``window_us``):
    ``slot * windows + window`` when that fits int64, else an id from ``numpy.unique``."""
    if fn.window_us is None or not sum(len(s.slots) for s in sides):
        return [s.slots for s in sides]
    slots = np.concatenate([s.slots for s in sides])
    windows = np.concatenate([s.times for s in sides]) // fn.window_us
    windows -= windows.min()
    span = int(windows.max()) + 1
    if (int(slots.max()) + 1) * span < _SAFE:
        ids = slots * span + windows
    else:
        _, ids = np.unique(np.stack([slots, windows], axis=1), axis=0, return_inverse=True)
        ids = ids.reshape(-1)
    cuts = np.cumsum([len(s.slots) for s in sides])[:-1]
    return np.split(ids, cuts)


def _pairs(fn: JoinShape, lefts: _Side, rights: _Side, left_groups: np.ndarray,
           right_groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The matching ``(left, right)`` index pairs, ordered by left then right index: a
    sort-merge on the groups (no pair of different groups is formed), then ``within_us``."""
    by_group = np.argsort(right_groups, kind="stable")
    sorted_groups = right_groups[by_group]
    low = np.searchsorted(sorted_groups, left_groups, "left")
    counts = np.searchsorted(sorted_groups, left_groups, "right") - low
    left = np.repeat(np.arange(len(left_groups)), counts)
    step = np.arange(len(left)) - np.repeat(np.cumsum(counts) - counts, counts)
    right = by_group[np.repeat(low, counts) + step]
    if fn.within_us is not None:
        close = np.abs(lefts.times[left] - rights.times[right]) <= fn.within_us
        left, right = left[close], right[close]
    return left, right


def _states(n_slots: int, lefts: _Side, new_left_slots: np.ndarray, new_lefts: list,
            rights: _Side, new_right_slots: np.ndarray, new_rights: list) -> list[Any]:
    """Each slot's stored state: ``[lefts, rights]`` (kept rows, then new ones), ``None`` when
    both are empty."""
    cuts = [np.searchsorted(s, np.arange(n_slots + 1)).tolist()
            for s in (lefts.slots, new_left_slots, rights.slots, new_right_slots)]
    out: list[Any] = []
    for slot in range(n_slots):
        lo, hi = slot, slot + 1
        left = lefts.rows[cuts[0][lo]:cuts[0][hi]] + new_lefts[cuts[1][lo]:cuts[1][hi]]
        right = rights.rows[cuts[2][lo]:cuts[2][hi]] + new_rights[cuts[3][lo]:cuts[3][hi]]
        out.append([left, right] if left or right else None)
    return out


def _timers(fn: JoinShape, n_slots: int, slots: np.ndarray, times: np.ndarray
            ) -> list[set[int]]:
    """The timers the new rows set: each one's keep time (none for rows kept for ever)."""
    timers: list[set[int]] = [set() for _ in range(n_slots)]
    keeps = _keep_until(fn, times)
    mask = keeps != FOREVER
    if np.any(mask):
        pairs = np.unique(np.stack([slots[mask], keeps[mask]], axis=1), axis=0)
        for slot, t in pairs.tolist():
            timers[slot].add(t)
    return timers
