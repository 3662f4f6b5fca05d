"""A join's epoch matched in columns (``Join.process_epoch``) equals the same epoch run key by
key (``on_timer`` and ``process``): outputs in order, stored state byte for byte, timers fired
and set, late counts; epoch after epoch, over random keys, event times, sides, bounds
(``within_us``, ``window_us``, ``ttl_us``, none), inner and left-outer joins and lateness.
Plain Python, no Spark."""

from __future__ import annotations

import copy
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.operators import Context, Join
from megaphone.operators.process import EpochBatch, KeyResults, run_epoch, run_keys
from tests.helpers.epoch_columns import Carried, packed

LEFT = pa.struct([("id", pa.string()), ("x", pa.int64())])
RIGHT = pa.struct([("y", pa.int64()), ("z", pa.float64())])
VALUE = pa.struct([("left", LEFT), ("right", RIGHT)])
#: A record: ``(key, event time, value)``; the value has one side set.
Record = tuple[Any, int, dict]

keys = st.sampled_from(["a", "b", "c", None])
times = st.one_of(st.integers(0, 30), st.integers(-50, 90))
lefts = st.builds(lambda i, x: {"left": {"id": i, "x": x}, "right": None},
                  st.sampled_from(["p", "q", None]), st.one_of(st.none(), st.integers(-3, 3)))
rights = st.builds(lambda y, z: {"left": None, "right": {"y": y, "z": z}},
                   st.integers(-3, 3), st.one_of(st.none(), st.floats(-2, 2)))
records = st.tuples(keys, times, st.one_of(lefts, rights))


def batch_of(records: list[Record], due: dict[Any, list[int]]) -> EpochBatch:
    """The epoch as the runtime hands it over: keys with due timers first, then in the order
    of their first record."""
    order = list(dict.fromkeys([k for k, ts in due.items() if ts] + [k for k, _, _ in records]))
    slot = {k: i for i, k in enumerate(order)}
    timers = [(slot[k], t) for k, ts in due.items() for t in ts]
    return EpochBatch(order, np.array([s for s, _ in timers], np.int64),
                      np.array([t for _, t in timers], np.int64),
                      np.array([slot[k] for k, _, _ in records], np.int64),
                      np.array([t for _, t, _ in records], np.int64),
                      pa.array([v for _, _, v in records], VALUE))


def run_both(fn: Join, epochs: list[list[Record]]) -> int:
    """Run the epochs key by key and in columns, asserting each epoch equal (the states as
    msgpack stores them); returns the epochs that ran in columns (not declined)."""
    carried = Carried(fn.lateness_us)
    states = carried.states
    vectorized = 0
    for epoch_records in epochs:
        wm = carried.watermark()
        due = carried.due(wm)
        batch = batch_of(epoch_records, due)
        now = [None if k not in states else msgpack.unpackb(states[k]) for k in batch.keys]
        want = run_keys(fn, batch.keys, batch.timers(), batch.rows(), copy.deepcopy(now),
                        Context(0, wm))
        got: KeyResults | None = fn.process_epoch(batch, now, Context(0, wm))
        if got is not None:
            vectorized += 1
            assert packed(got.states) == packed(want.states)
            assert packed(now) == [states.get(k) for k in batch.keys]  # inputs unchanged
            assert [sorted(f) for f in got.fired] == [sorted(f) for f in want.fired]
            assert got.set == want.set
            assert got.out_keys == want.out_keys
            assert got.out_values == want.out_values
            assert got.late == want.late
        carried.advance(batch.keys, want, packed(want.states), [t for _, t, _ in epoch_records])
    return vectorized


@st.composite
def joins(draw: st.DrawFn) -> Join:
    how = draw(st.sampled_from(["inner", "left"]))
    bounds = ["within_us", "window_us", "ttl_us"] + ([] if how == "left" else [None])
    bound = draw(st.sampled_from(bounds))
    span = draw(st.integers(1 if bound == "window_us" else 0, 12))
    return Join(how=how, lateness_us=draw(st.integers(0, 10)),
                **({} if bound is None else {bound: span}))


@given(fn=joins(), epochs=st.lists(st.lists(records, max_size=14), min_size=1, max_size=6))
def test_joins_match_in_columns_as_key_by_key(fn: Join, epochs: list) -> None:
    assert run_both(fn, epochs) == len(epochs)


@pytest.mark.parametrize("fn", [Join(), Join(how="left", within_us=5),
                                Join(how="left", window_us=10), Join(ttl_us=3)])
def test_a_hot_key_keeps_its_order_and_its_flags(fn: Join) -> None:
    """One key with many rows on both sides over epochs: every pair, in loop order; rows
    matched late in their life are flagged, unmatched left rows emitted as they expire."""
    left = {"left": {"id": "p", "x": 1}, "right": None}
    right = {"left": None, "right": {"y": 2, "z": None}}
    epochs = [[("k", t, left if t % 3 else right) for t in range(e * 10 + 9, e * 10 - 1, -1)]
              for e in range(5)]
    epochs.append([("k", 200, right)])  # moves the watermark on: every row expires
    epochs.append([])
    assert run_both(fn, epochs) == len(epochs)


def test_a_record_without_a_row_fails_as_key_by_key() -> None:
    fn = Join(within_us=5)
    empty = {"left": None, "right": None}
    row = {"left": {"id": "p", "x": 1}, "right": None}
    batch = batch_of([("a", 10, row), ("b", 11, empty)], {})
    assert fn.process_epoch(batch, [None, None], Context(0, None)) is None
    with pytest.raises(ValueError, match="neither a left nor a right row"):
        run_epoch(fn, batch, [None, None], Context(0, None))
    # a late one is only counted late, in columns too
    assert run_both(fn, [[("a", 50, row)], [("a", 10, empty), ("b", 3, empty)]]) == 2


def test_windows_too_many_to_number_per_key_are_still_told_apart() -> None:
    """Event times 2**61 apart in windows of 1 us: ``slot * windows + window`` would not fit
    int64, so the windows are numbered by ``numpy.unique``."""
    fn = Join(window_us=1)
    left = {"left": {"id": "p", "x": 1}, "right": None}
    right = {"left": None, "right": {"y": 2, "z": None}}
    far = 2**60 - 1
    epoch = [(k, t, side) for k in ("a", "b") for t in (-far, far) for side in (left, right)]
    assert run_both(fn, [epoch, epoch]) == 2


def test_event_times_near_the_ends_of_int64_run_key_by_key() -> None:
    fn = Join(within_us=5)
    record = ("a", 2**62, {"left": {"id": "p", "x": 1}, "right": None})
    assert run_both(fn, [[record]]) == 0


def test_the_per_key_path_stays_reachable() -> None:
    fn = Join(window_us=10, vectorized=False)
    batch = batch_of([("a", 1, {"left": {"id": "p", "x": 1}, "right": None})], {})
    assert fn.process_epoch(batch, [None], Context(0, None)) is None
    assert repr(fn) == repr(Join(window_us=10))  # the pipeline's setting is the same
