"""A window's epoch folded in columns (``WindowAggregate.process_epoch``) equals the same epoch
folded record by record (``process`` and ``on_timer`` key by key): outputs in order, stored
state byte for byte, timers fired and set, late counts; epoch after epoch, over random event
times, values (integers, floats with NaN, infinities and negative zeros, nulls), sizes,
slides, lateness and both emit modes. Plain Python, no Spark."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.operators import Context, WindowAggregate
from megaphone.operators.process import EpochBatch, KeyResults, run_epoch, run_keys
from megaphone.operators.window_state import open_windows
from tests.helpers.epoch_columns import Carried, packed

AGGS = ["count", "sum", "min", "max", "avg"]
keys = st.sampled_from(["a", "b", None])
times = st.one_of(st.integers(0, 25), st.integers(-40, 80))
ints = st.one_of(st.none(), st.integers(-5, 9), st.integers(-(2**40), 2**40))
# Values whose sums round differently in another order, zeros of both signs, NaN, infinities.
floats = st.one_of(st.none(), st.sampled_from([math.nan, -0.0, 0.0, math.inf, -math.inf, 0.1,
                                               0.7, 1e16, -1e16, 3.0]),
                   st.floats(-1e6, 1e6), st.floats(allow_nan=False, allow_infinity=False))


def batch_of(records: list[tuple[Any, int, Any]], due: dict[Any, list[int]],
             value_type: pa.DataType) -> EpochBatch:
    """The epoch as the runtime hands it over: keys with due timers first, then in the order
    of their first record."""
    order = list(dict.fromkeys([k for k, ts in due.items() if ts] + [k for k, _, _ in records]))
    slot = {k: i for i, k in enumerate(order)}
    timers = [(slot[k], t) for k, ts in due.items() for t in ts]
    return EpochBatch(order, np.array([s for s, _ in timers], np.int64),
                      np.array([t for _, t in timers], np.int64),
                      np.array([slot[k] for k, _, _ in records], np.int64),
                      np.array([t for _, t, _ in records], np.int64),
                      pa.array([v for _, _, v in records], value_type))


def both_ways(fn: WindowAggregate, batch: EpochBatch, states: list[Any], wm: int | None
              ) -> tuple[KeyResults, KeyResults | None]:
    """The epoch record by record and in columns, each from its own copy of the states."""
    by_record = run_keys(fn, batch.keys, batch.timers(), batch.rows(), copy.deepcopy(states),
                         Context(0, wm))
    return by_record, fn.process_epoch(batch, copy.deepcopy(states), Context(0, wm))


def same_outputs(a: list[dict], b: list[dict]) -> bool:
    """Equal output lists, NaN equal to NaN and ``-0.0`` told from ``0.0``."""
    def frozen(v: dict) -> tuple:
        x = v["value"]
        return (v["start"], v["end"], type(x).__name__,
                "nan" if isinstance(x, float) and math.isnan(x) else
                repr(x) if isinstance(x, float) else x)
    return [frozen(v) for v in a] == [frozen(v) for v in b]


def run_both(fn: WindowAggregate, epochs: list[list[tuple[Any, int, Any]]],
             value_type: pa.DataType) -> int:
    """Run the epochs both ways, asserting each epoch equal; returns the epochs that ran in
    columns (not declined)."""
    carried = Carried(fn.lateness_us)
    states = carried.states
    vectorized = 0
    for batch_records in epochs:
        wm = carried.watermark()
        due = carried.due(wm)
        batch = batch_of(batch_records, due, value_type)
        now = [states.get(k) for k in batch.keys]
        want, got = both_ways(fn, batch, now, wm)
        if got is not None:
            vectorized += 1
            assert packed(got.states) == packed(want.states)
            assert [sorted(f) for f in got.fired] == [sorted(f) for f in want.fired]
            assert got.set == want.set
            assert got.out_keys == want.out_keys
            assert same_outputs(got.out_values, want.out_values)
            assert got.late == want.late
        carried.advance(batch.keys, want, want.states, [t for _, t, _ in batch_records])
    return vectorized


@st.composite
def windows(draw: st.DrawFn) -> WindowAggregate:
    size = draw(st.integers(1, 20))
    return WindowAggregate(size_us=size, slide_us=draw(st.integers(1, size)),
                           agg=draw(st.sampled_from(AGGS)),
                           emit=draw(st.sampled_from(["append", "update"])),
                           lateness_us=draw(st.integers(0, 15)))


def epochs_of(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(st.lists(st.tuples(keys, times, values), max_size=16), min_size=1,
                    max_size=5)


@given(fn=windows(), epochs=epochs_of(ints))
def test_integer_windows_fold_in_columns_as_record_by_record(fn: WindowAggregate,
                                                             epochs: list) -> None:
    assert run_both(fn, epochs, pa.int64()) == len(epochs)


@given(fn=windows(), epochs=epochs_of(floats))
def test_float_windows_fold_in_columns_as_record_by_record(fn: WindowAggregate,
                                                           epochs: list) -> None:
    assert run_both(fn, epochs, pa.float64()) == len(epochs)


@pytest.mark.parametrize(("agg", "values"), [
    ("sum", [1e16, 1.0, 1.0]),  # 1 + 1 + 1e16 != 1e16 + 1 + 1 in float64
    ("min", [0.0, -0.0]), ("max", [0.0, -0.0]),  # the first of equal values is kept
])
def test_a_window_folds_its_records_in_event_time_order(agg: str, values: list) -> None:
    fn = WindowAggregate(size_us=100, agg=agg)
    arrivals = [("a", 10 - t, v) for t, v in enumerate(values)]  # latest first
    epochs = [[("a", 50, None)], arrivals, [("a", 20, v) for v in values]]
    assert run_both(fn, epochs, pa.float64()) == len(epochs)


@pytest.mark.parametrize("agg", ["sum", "avg"])
def test_an_integer_sum_that_could_leave_int64_runs_record_by_record(agg: str) -> None:
    fn = WindowAggregate(size_us=10, agg=agg)
    big = [("a", 1, 2**62), ("a", 2, 2**62)]
    assert run_both(fn, [big], pa.int64()) == 0
    batch = batch_of(big, {}, pa.int64())
    result = run_epoch(fn, batch, [None], Context(0, None))  # the runtime falls back
    assert result.states == [[[10, [2, 2**63, 2**62, 2**62]]]]


def test_values_of_another_type_run_record_by_record() -> None:
    fn = WindowAggregate(size_us=10, agg="max")
    records = [("a", 1, "x"), ("a", 2, "y")]
    assert run_both(fn, [records], pa.string()) == 0
    counted = WindowAggregate(size_us=10, agg="count")  # count never looks at the values
    assert run_both(counted, [records], pa.string()) == 1


def test_the_per_record_path_stays_reachable() -> None:
    fn = WindowAggregate(size_us=10, vectorized=False)
    batch = batch_of([("a", 1, 3)], {}, pa.int64())
    assert fn.process_epoch(batch, [None], Context(0, None)) is None
    assert repr(fn) == repr(WindowAggregate(size_us=10))  # the pipeline's setting is the same


def test_states_of_the_list_layout_fold_alike_and_are_packed() -> None:
    """A state directory written before windows were packed keeps ``[[end, acc], ...]``."""
    fn = WindowAggregate(size_us=10, slide_us=5, agg="sum")
    legacy = [[10, [2, 5, 1, 4]], [15, [1, 4, 4, 4]]]
    want, got = both_ways(fn, batch_of([("a", 12, 3)], {}, pa.int64()), [legacy], None)
    assert got is not None and packed(got.states) == packed(want.states)
    assert isinstance(got.states[0], bytes)
    assert open_windows(got.states[0]) == {10: [2, 5, 1, 4], 15: [2, 7, 3, 4], 20: [1, 3, 3, 3]}
