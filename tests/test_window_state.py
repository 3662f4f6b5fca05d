"""A window aggregate's stored state (``operators/window_state.py``): one key's windows packed
and read back as they were, many keys' decoded and encoded in columns to the same bytes as
one at a time, the list layout of older state directories still read, and what does not fit
a packed layout kept as a list. Plain Python, no Spark."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.operators.window_state import (
    COUNTS,
    FLOATS,
    INTS,
    decode_all,
    encode_all,
    layout_of,
    open_windows,
    stored,
)

ends = st.integers(-(2**62), 2**62)
ints = st.integers(-(2**63), 2**63 - 1)
floats = st.one_of(st.floats(), st.sampled_from([math.nan, -0.0, 0.0, math.inf, -math.inf]))


def accumulators(values: st.SearchStrategy) -> st.SearchStrategy:
    """A window's ``[count, sum, min, max]``: with values, or none yet (count 0)."""
    return st.one_of(st.tuples(st.integers(1, 2**40), values, values, values).map(list),
                     st.just([0, None, None, None]))


counts = st.builds(lambda n: [n, None, None, None], st.integers(1, 2**62))
key_windows = st.one_of(*(st.dictionaries(ends, acc, max_size=6)
                          for acc in (counts, accumulators(ints), accumulators(floats))))


def bits(windows: dict[int, list]) -> dict[int, list]:
    """``windows`` with floats as their bits: NaN equal to NaN, ``-0.0`` told from ``0.0``."""
    return {end: [struct.pack("<d", v) if isinstance(v, float) else v for v in acc]
            for end, acc in windows.items()}


@given(windows=key_windows)
def test_a_keys_windows_read_back_as_stored(windows: dict[int, list]) -> None:
    state = stored(windows)
    if not windows:
        assert state is None
        return
    assert isinstance(state, bytes)
    assert bits(open_windows(state)) == bits(windows)
    assert bits(open_windows([[end, acc] for end, acc in sorted(windows.items())])) == \
        bits(windows)  # the list layout of older state directories reads the same


@given(keys=st.lists(st.one_of(st.none(), key_windows), max_size=6),
       layout=st.sampled_from([COUNTS, INTS, FLOATS]))
def test_many_keys_in_columns_pack_as_one_at_a_time(keys: list, layout: int) -> None:
    states = [None if w is None else stored(w) for w in keys]
    rows = decode_all(states, layout)

    def readable(windows: dict[int, list]) -> bool:  # a value layout reads windows of no value
        own = layout_of(list(windows.values()))
        return own == layout or (own == COUNTS and all(a[0] == 0 for a in windows.values()))

    if not all(readable(w) for w in keys if w):  # the columnar fold declines
        assert rows is None
        return
    assert rows is not None
    assert encode_all(rows, len(states)) == states


def test_what_no_packed_layout_holds_stays_a_list() -> None:
    big = {10: [2, 2**63, 2**62, 2**62]}  # an integer sum beyond int64 (Python's do not wrap)
    mixed = {10: [1, 1, 1, 1], 20: [1, 0.5, 0.5, 0.5]}
    flags = {10: [1, True, True, True]}
    for windows in (big, mixed, flags):
        assert stored(windows) == [[end, acc] for end, acc in sorted(windows.items())]
        assert decode_all([stored(windows)], INTS) is None  # the columnar fold declines


def test_a_counts_state_reads_into_a_value_layout_and_back() -> None:
    empty = stored({10: [0, None, None, None]})  # a window of null values only: counts
    valued = stored({10: [1, 3, 3, 3]})
    rows = decode_all([empty, valued], INTS)
    assert rows is not None and rows.count.tolist() == [0, 1]
    assert encode_all(rows, 2) == [empty, valued]


def test_a_state_that_is_not_a_windows_state_is_refused() -> None:
    with pytest.raises(ValueError, match="not a window aggregate's state"):
        open_windows(np.array([1, 2, 3], "<i8").tobytes())

