"""DS2's formula against hand-computed cases: one operator, chains, a join, word count, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.plans.ds2 import (
    OperatorRates,
    optimal_parallelism,
    optimal_workers,
    rates_from_metrics,
    topological_order,
)
from megaphone.records import EpochMetrics


def rates(p: int, per_instance: float, selectivity: float = 1.0) -> OperatorRates:
    """Rates of ``p`` identical instances each processing ``per_instance`` records/s."""
    return OperatorRates(p, p * per_instance, p * per_instance * selectivity)


def test_true_rates_are_summed_over_instances():
    # Instance 0: 1000 records in 1.0 s -> 1000/s; instance 1: 1000 records in 0.5 s -> 2000/s.
    r = OperatorRates.from_instances([(1000, 500, 1.0), (1000, 1500, 0.5)])
    assert r.instances == 2
    assert r.processing_rate == pytest.approx(3000.0)
    assert r.output_rate == pytest.approx(500 + 3000)
    assert r.per_instance_rate == pytest.approx(1500.0)
    # ceil(4000 / 1500) = ceil(2.67) = 3
    assert optimal_workers(r, 4000.0) == 3


def test_single_operator_hand_computed():
    assert optimal_workers(rates(2, 1000.0), 1200.0) == 2  # ceil(1.2)
    assert optimal_workers(rates(2, 1000.0), 3000.0) == 3  # exactly 3, not 4
    assert optimal_workers(rates(4, 1000.0), 900.0) == 1  # scale down
    assert optimal_workers(rates(3, 1000.0), 0.0) == 1  # no input: never zero instances
    r = optimal_parallelism({"op": rates(2, 500.0)}, [("src", "op")], {"src": 2600.0})
    assert r.parallelism == {"op": 6}  # ceil(2600 / 500) = ceil(5.2)
    assert r.target_input == {"op": 2600.0}
    assert r.order == ("src", "op")


def test_two_operator_chain():
    # src -> a -> b. a: 2 instances at 1000/s each, emits 2 records per input.
    # b: 2 instances at 1000/s each, emits 1 per 2 inputs.
    ops = {"a": rates(2, 1000.0, selectivity=2.0), "b": rates(2, 1000.0, selectivity=0.5)}
    r = optimal_parallelism(ops, [("src", "a"), ("a", "b")], {"src": 1500.0})
    # a: ceil(1500 / 1000) = 2; lo_a* = 2 * 1500 = 3000; b: ceil(3000 / 1000) = 3
    assert r.parallelism == {"a": 2, "b": 3}
    assert r.target_input == {"a": 1500.0, "b": 3000.0}
    assert r.target_output == {"src": 1500.0, "a": 3000.0, "b": 1500.0}


def test_adjacency_matrix_gives_the_same_answer_as_edges():
    ops = {"a": rates(2, 1000.0, selectivity=2.0), "b": rates(2, 1000.0, selectivity=0.5)}
    names = ["src", "a", "b"]
    matrix = np.array([[0, 1, 0], [0, 0, 1], [0, 0, 0]])  # A[j, i] = 1 for j -> i
    by_matrix = optimal_parallelism(ops, matrix, {"src": 1500.0}, names=names)
    by_list = optimal_parallelism(ops, matrix.tolist(), {"src": 1500.0}, names=names)
    by_edges = optimal_parallelism(ops, [("src", "a"), ("a", "b")], {"src": 1500.0})
    assert by_matrix.parallelism == by_list.parallelism == by_edges.parallelism == \
        {"a": 2, "b": 3}
    # Without names the rows are "0", "1", ...
    unnamed = optimal_parallelism({"1": rates(1, 100.0)}, [[0, 1], [0, 0]], {"0": 250.0})
    assert unnamed.parallelism == {"1": 3}


def test_two_sources_and_a_join():
    # s1 -> a, s2 -> b, a -> j, b -> j: j must sustain lo_a* + lo_b*.
    ops = {"a": rates(1, 1000.0, 1.0), "b": rates(1, 500.0, 4.0), "j": rates(4, 2000.0, 0.1)}
    edges = [("s1", "a"), ("s2", "b"), ("a", "j"), ("b", "j")]
    r = optimal_parallelism(ops, edges, {"s1": 2500.0, "s2": 1000.0})
    # a: ceil(2500/1000) = 3, lo_a* = 2500; b: ceil(1000/500) = 2, lo_b* = 4000;
    # j: ceil((2500 + 4000) / 2000) = ceil(3.25) = 4
    assert r.parallelism == {"a": 3, "b": 2, "j": 4}
    assert r.target_input["j"] == 6500.0


def simulate(capacity: dict[str, float], selectivity: dict[str, float],
             parallelism: dict[str, int], source_rate: float) -> dict[str, OperatorRates]:
    """One second of a backpressured chain src -> flatmap -> count that scales linearly.

    Each instance of operator ``i`` processes at most ``capacity[i]`` records per second of
    useful time; the source is slowed down to what the bottleneck sustains. Returns the rates
    DS2 would observe (per-instance records, outputs and useful time).
    """
    chain = ["flatmap", "count"]
    gain, admitted = 1.0, source_rate
    for op in chain:  # the source rate the chain admits: limited by every operator
        admitted = min(admitted, parallelism[op] * capacity[op] / gain)
        gain *= selectivity[op]
    observed, flow = {}, admitted
    for op in chain:
        per = flow / parallelism[op]
        observed[op] = OperatorRates.from_instances(
            [(per, per * selectivity[op], per / capacity[op])] * parallelism[op])
        flow *= selectivity[op]
    return observed


WORDCOUNT = [("source", "flatmap"), ("flatmap", "count")]


def test_underprovisioned_word_count_reaches_the_right_size_in_one_step():
    # The paper's kind of example: source -> flatmap (10 words per sentence) -> count, with
    # one instance of each. The flatmap is the bottleneck and backpressures the source, so the
    # observed rates are lower than the target everywhere; the true rates are not.
    capacity = {"flatmap": 500.0, "count": 10_000.0}  # per instance, records/s of useful time
    selectivity = {"flatmap": 10.0, "count": 1.0}
    now = {"flatmap": 1, "count": 1}
    observed = simulate(capacity, selectivity, now, source_rate=2000.0)
    assert observed["flatmap"].records_in == pytest.approx(500.0)  # backpressured
    assert observed["count"].records_in == pytest.approx(5000.0)  # count only half busy
    decision = optimal_parallelism(observed, WORDCOUNT, {"source": 2000.0})
    # flatmap: ceil(2000 / 500) = 4; lo_flatmap* = 10 * 2000 = 20000;
    # count: ceil(20000 / 10000) = 2 (although it looked half idle at 1 instance).
    assert decision.parallelism == {"flatmap": 4, "count": 2}
    assert decision.target_output["flatmap"] == pytest.approx(20_000.0)
    # One step: at the new size the whole source rate gets through and DS2 keeps it.
    after = simulate(capacity, selectivity, decision.parallelism, source_rate=2000.0)
    assert after["flatmap"].records_in == pytest.approx(2000.0)
    again = optimal_parallelism(after, WORDCOUNT, {"source": 2000.0})
    assert again.parallelism == decision.parallelism


@given(
    cap_f=st.floats(10, 1e5), cap_c=st.floats(10, 1e5), sel=st.floats(0.1, 20),
    p_f=st.integers(1, 16), p_c=st.integers(1, 16), rate=st.floats(1, 1e6),
)
def test_linear_scaling_converges_in_one_step(cap_f, cap_c, sel, p_f, p_c, rate):
    capacity = {"flatmap": cap_f, "count": cap_c}
    selectivity = {"flatmap": sel, "count": 1.0}
    start = {"flatmap": p_f, "count": p_c}
    first = optimal_parallelism(simulate(capacity, selectivity, start, rate), WORDCOUNT,
                                {"source": rate}).parallelism
    assert first["flatmap"] == max(1, math.ceil(rate / cap_f - 1e-6))
    second = optimal_parallelism(simulate(capacity, selectivity, first, rate), WORDCOUNT,
                                 {"source": rate}).parallelism
    assert second == first


def epoch(epoch: int, per_worker: dict[str, dict]) -> EpochMetrics:
    return EpochMetrics.from_dict({
        "epoch": epoch, "started": 0.0, "finished": 0.0, "duration_s": 0.0,
        "per_worker": dict(per_worker)})


def test_rates_from_metrics_sums_each_worker_over_the_window():
    window = [
        epoch(1, {"0": {"records_in": 100, "records_out": 50, "useful_s": 0.1},
                  "1": {"records_in": 300, "records_out": 100, "useful_s": 0.2}}),
        epoch(2, {"0": {"records_in": 100, "records_out": 50, "useful_s": 0.1},
                  "1": {"records_in": 100, "records_out": 100, "useful_s": 0.2},
                  # an old owner that only exported state: no useful time, contributes nothing
                  "2": {"bins_out": 3, "keys_out": 10, "export_s": 0.5}}),
    ]
    r = rates_from_metrics(window)
    # worker 0: 200 / 0.2 = 1000/s; worker 1: 400 / 0.4 = 1000/s
    assert r.instances == 2
    assert r.processing_rate == pytest.approx(2000.0)
    assert r.output_rate == pytest.approx(100 / 0.2 + 200 / 0.4)
    assert (r.records_in, r.records_out, r.useful_s) == (600, 300, pytest.approx(0.6))


def test_an_idle_worker_does_not_look_like_a_slow_one():
    # Worker 2 owns bins but got no record: its useful time is pure overhead. It counts as an
    # instance credited with the mean rate of the busy ones, not as an instance of rate zero.
    window = [epoch(1, {"0": {"records_in": 1000, "useful_s": 1.0},
                        "1": {"records_in": 2000, "useful_s": 1.0},
                        "2": {"records_in": 0, "useful_s": 0.05}})]
    r = rates_from_metrics(window)
    assert r.instances == 3
    assert r.per_instance_rate == pytest.approx(1500.0)


@pytest.mark.parametrize("window, message", [
    ([], "no per-worker metrics"),
    ([epoch(1, {"0": {"records_in": 10, "useful_s": 0.0}})], "no instance has any useful time"),
    ([epoch(1, {"0": {"records_in": -1, "useful_s": 1.0}})], "must be finite and >= 0"),
])
def test_rates_from_metrics_rejects_bad_windows(window, message):
    with pytest.raises(ValueError, match=message):
        rates_from_metrics(window)


def test_bad_input_is_a_clear_value_error():
    r = rates(1, 100.0)
    with pytest.raises(ValueError, match="cycle through a, b"):
        optimal_parallelism({"a": r, "b": r}, [("src", "a"), ("a", "b"), ("b", "a")],
                            {"src": 1.0})
    with pytest.raises(ValueError, match="source rate of 'src' must be a finite number >= 0"):
        optimal_parallelism({"a": r}, [("src", "a")], {"src": -5.0})
    with pytest.raises(ValueError, match="instances must be an integer >= 1"):
        OperatorRates(0, 1.0, 1.0)
    with pytest.raises(ValueError, match="processing_rate must be a finite number >= 0"):
        OperatorRates(1, -1.0, 1.0)
    with pytest.raises(ValueError, match="no observed rates for operator 'b'"):
        optimal_parallelism({"a": r}, [("src", "a"), ("a", "b")], {"src": 1.0})
    with pytest.raises(ValueError, match="'x' has no upstream operator and no source rate"):
        optimal_parallelism({"a": r, "x": r}, [("src", "a")], {"src": 1.0})
    with pytest.raises(ValueError, match="processed no record in the window"):
        optimal_parallelism({"a": OperatorRates(1, 0.0, 0.0)}, [("src", "a")], {"src": 10.0})
    with pytest.raises(ValueError, match="must be square"):
        optimal_parallelism({"a": r}, [[0, 1, 0], [0, 0, 1]], {"src": 1.0}, names=["src", "a"])
    with pytest.raises(ValueError, match="adjacency entries must be finite and >= 0"):
        optimal_parallelism({"1": r}, [[0, -1], [0, 0]], {"0": 1.0})
    with pytest.raises(ValueError, match="no instance has any useful time"):
        OperatorRates.from_instances([(0, 0, 0.0)] * 2)


def test_topological_order_is_deterministic():
    upstream = {"c": {"a": 1.0, "b": 1.0}, "a": {"s": 1.0}, "b": {"s": 1.0}, "s": {}}
    assert topological_order(["c", "b", "a", "s"], upstream) == ["s", "b", "a", "c"]
