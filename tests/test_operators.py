"""The event-time operators on their own (no Spark, no store): windows and joins run epoch by
epoch through the process-function runner, against plain-Python references of what they must
emit (tests/helpers/operator_reference.py)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.operators import Context, Join, WindowAggregate, duration_us
from megaphone.operators.process import run_keys, watermark
from megaphone.operators.window import window_ends
from megaphone.operators.window_state import open_windows
from tests.helpers.operator_reference import join_reference, window_reference
from tests.helpers.operator_reference import window_ends as brute_window_ends


def run_epochs(fn: Any, epochs: list[list[tuple[Any, int, Any]]]) -> tuple[list, int, dict]:
    """Run ``fn`` over the epochs with a dict for state and timers, as the runtime does: the
    watermark from earlier epochs, due timers first, then records. Returns every output as
    ``(epoch, key, output)``, the late count and the final states."""
    states: dict[Any, Any] = {}
    timers: dict[Any, set[int]] = {}
    high = None
    outputs = []
    late = 0
    for e, batch in enumerate(epochs):
        wm = watermark(high, fn.lateness_us)
        rows: dict[Any, list] = {}
        for key, t, value in batch:
            rows.setdefault(key, []).append((t, value))
        due = {k: sorted(t for t in ts if wm is not None and t <= wm)
               for k, ts in timers.items()}
        keys = sorted({k for k, ts in due.items() if ts} | set(rows), key=repr)
        ctx = Context(e, wm)
        result = run_keys(fn, keys, [due.get(k, []) for k in keys],
                          [rows.get(k, []) for k in keys], [states.get(k) for k in keys], ctx)
        for key, state, fired, added in zip(keys, result.states, result.fired, result.set,
                                            strict=True):
            states[key] = state
            if state is None:
                del states[key]
            ts = (timers.get(key, set()) - set(fired)) | added
            timers[key] = ts
        outputs += [(e, k, v) for k, v in zip(result.out_keys, result.out_values, strict=True)]
        late += result.late
        for _, t, _ in batch:
            high = t if high is None else max(high, t)
    return outputs, late, states


times = st.integers(0, 60)
keys = st.sampled_from(["a", "b", "c", None])


@given(t=st.integers(-1000, 1000), size=st.integers(1, 20), slide_div=st.integers(1, 5))
def test_window_ends_match_brute_force(t: int, size: int, slide_div: int) -> None:
    slide = max(1, size // slide_div)
    assert window_ends(t, size, slide) == brute_window_ends(t, size, slide)


@pytest.mark.parametrize("agg", ["count", "sum", "min", "max", "avg"])
@given(epochs=st.lists(st.lists(st.tuples(keys, times, st.one_of(st.none(), st.integers(-5, 9))),
                                max_size=8), min_size=1, max_size=8),
       size=st.integers(1, 15), slide_div=st.integers(1, 3), lateness=st.integers(0, 10))
def test_windows_append_equal_reference(agg: str, epochs: list, size: int, slide_div: int,
                                        lateness: int) -> None:
    slide = max(1, size // slide_div)
    fn = WindowAggregate(size_us=size, slide_us=slide, agg=agg, lateness_us=lateness)
    outputs, late, _ = run_epochs(fn, epochs)
    expected, closed, expected_late = window_reference(epochs, size, slide, agg, lateness)
    got = Counter((k, v["end"], _nan(v["value"])) for _, k, v in outputs)
    want = Counter((k, end, _nan(expected[(k, end)])) for k, end in closed)
    assert got == want
    assert all(v["start"] == v["end"] - size for _, _, v in outputs)
    assert late == expected_late


@given(epochs=st.lists(st.lists(st.tuples(keys, times, st.integers(-5, 9)), max_size=8),
                       min_size=1, max_size=8),
       size=st.integers(1, 15), lateness=st.integers(0, 10))
def test_windows_update_mode_ends_at_the_reference(epochs: list, size: int,
                                                   lateness: int) -> None:
    fn = WindowAggregate(size_us=size, agg="sum", emit="update", lateness_us=lateness)
    outputs, _, states = run_epochs(fn, epochs)
    last: dict = {}
    for _, k, v in outputs:
        last[(k, v["end"])] = v["value"]
    expected, closed, _ = window_reference(epochs, size, size, "sum", lateness)
    assert last == expected
    still_open = {(k, end) for k, state in states.items() for end in open_windows(state)}
    assert still_open == set(expected) - closed  # closed windows are purged


def test_window_state_is_purged_once_closed() -> None:
    fn = WindowAggregate(size_us=10, agg="count")
    outputs, late, states = run_epochs(fn, [[("a", 1, None), ("b", 5, None)], [("a", 25, None)],
                                            [("a", 30, None)], [("c", 3, None)]])
    assert [(k, v["end"], v["value"]) for _, k, v in outputs] == [("a", 10, 1), ("b", 10, 1),
                                                                 ("a", 30, 1)]
    assert late == 1  # c's window closed long ago
    assert set(states) == {"a"} and open_windows(states["a"]) == {40: [1, None, None, None]}


def test_window_max_orders_nan_above_numbers() -> None:
    fn = WindowAggregate(size_us=10, agg="max")
    outputs, _, _ = run_epochs(fn, [[("a", 1, 3.0), ("a", 2, math.nan), ("b", 1, 2.0)],
                                    [("a", 50, 1.0)], []])
    got = {k: v["value"] for _, k, v in outputs if v["end"] == 10}
    assert math.isnan(got["a"]) and got["b"] == 2.0


sides = st.sampled_from(["left", "right"])
join_records = st.lists(st.lists(st.tuples(st.sampled_from([1, 2, 3]), times, sides,
                                           st.integers(0, 3)), max_size=7),
                        min_size=1, max_size=7)


@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("bound", ["within", "window", "ttl", "none"])
@given(epochs=join_records, span=st.integers(0, 12), lateness=st.integers(0, 8))
def test_join_equals_reference(how: str, bound: str, epochs: list, span: int,
                               lateness: int) -> None:
    if how == "left" and bound == "none":
        return  # refused: a left-outer join needs a bound
    if bound == "window":
        span = max(1, span)
    kw = {} if bound == "none" else {f"{bound}_us": span}
    fn = Join(how=how, lateness_us=lateness, **kw)
    feed = [[(k, t, {"left": {"id": k, "t": t, "x": x}, "right": None} if side == "left"
              else {"left": None, "right": {"id": k, "t": t, "y": x}})
             for k, t, side, x in batch] for batch in epochs]
    outputs, late, _ = run_epochs(fn, feed)
    got = Counter((k, _freeze(v["left"]), _freeze(v["right"])) for _, k, v in outputs)
    ref_epochs = [[(k, t, side, _freeze({"id": k, "t": t, ("x" if side == "left" else "y"): x}))
                   for k, t, side, x in batch] for batch in epochs]
    ref_kw = {} if bound == "none" else {bound: span}
    want, want_late = join_reference(ref_epochs, how, lateness=lateness, **ref_kw)
    assert got == want
    assert late == want_late


def test_join_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at most one"):
        Join(within_us=5, ttl_us=5)
    with pytest.raises(ValueError, match="needs within_us"):
        Join(how="left")
    with pytest.raises(ValueError, match="how must be"):
        Join(how="outer")
    with pytest.raises(TypeError, match="struct<left, right>"):
        Join().output_type(None)


def test_window_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="agg must be"):
        WindowAggregate(size_us=10, agg="median")
    with pytest.raises(ValueError, match="slide_us"):
        WindowAggregate(size_us=10, slide_us=20)
    with pytest.raises(ValueError, match="size_us"):
        WindowAggregate(size_us=0)
    with pytest.raises(ValueError, match="emit"):
        WindowAggregate(size_us=10, emit="complete")


def test_durations() -> None:
    assert duration_us("10 seconds") == 10_000_000
    assert duration_us("500 ms") == 500_000
    assert duration_us("1.5 minutes") == 90_000_000
    assert duration_us(7) == 7
    with pytest.raises(ValueError, match="duration"):
        duration_us("ten seconds")
    with pytest.raises(TypeError):
        duration_us(True)


def _freeze(row: dict | None) -> Any:
    return None if row is None else tuple(sorted(row.items()))


def _nan(v: Any) -> Any:
    return "nan" if isinstance(v, float) and math.isnan(v) else v
