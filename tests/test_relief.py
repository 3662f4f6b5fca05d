"""Relief-first ordering: pure, fast property tests against a plain reference (no Spark)."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone.plan_cmd import add_arguments, order_lines
from megaphone.plans import (
    ALL_AT_ONCE,
    BATCHED,
    DEADLINE,
    FIXED_STRATEGIES,
    FLUID,
    STRATEGIES,
    BinSizes,
    PlanError,
    PlanningInputs,
    make_plan,
    plan_rescale,
    target_moves,
)
from megaphone.plans.policy import EpochView
from megaphone.plans.relief import busiest_workers, order_steps, relief_first, relief_steps
from megaphone.records import EpochMetrics, WorkerMetrics
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move, RoutingTable


def table_with(owners: list[int] | np.ndarray) -> RoutingTable:
    """A routing table whose newest version has exactly ``owners``."""
    owners = np.asarray(owners)
    table = RoutingTable.initial(Fingerprint("p", owners.size, "int64"), 1)
    moves = [Move(int(b), 0, int(w)) for b, w in enumerate(owners) if w != 0]
    if moves:
        table.apply_step(moves, 1)
    return table


def max_loads(owners, load, steps) -> list[float]:
    """Reference: the largest worker load after each step, with plain dicts."""
    per: dict[int, float] = {}
    for b, w in enumerate(owners):
        per[int(w)] = per.get(int(w), 0.0) + float(load[b])
    out = []
    for step in steps:
        for b, src, dst in step:
            per[src] -= float(load[b])
            per[dst] = per.get(dst, 0.0) + float(load[b])
        out.append(max(per.values()))
    return out


@st.composite
def layouts(draw, max_workers: int = 5):
    """Owners, a target and a load vector (some zeros, many ties) of one pipeline."""
    n = draw(st.sampled_from([2, 4, 8, 16]))
    owners = draw(st.lists(st.integers(0, max_workers - 1), min_size=n, max_size=n))
    target = draw(st.lists(st.integers(0, max_workers - 1), min_size=n, max_size=n))
    load = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 5.0, 13.5, 40.0]), min_size=n,
                         max_size=n))
    return np.array(owners), np.array(target), np.array(load)


def steps_of(plan) -> list[list[Move]]:
    return [list(s.moves) for s in plan.steps]


@settings(max_examples=150, deadline=None)
@given(layouts(), st.sampled_from(FIXED_STRATEGIES), st.integers(1, 3))
def test_relief_moves_the_same_bins_in_the_same_steps_only_in_another_order(
        layout, strategy, per_worker):
    owners, target, load = layout
    table = table_with(owners)
    moves = target_moves(owners, target)
    k = per_worker if strategy == BATCHED else 1
    bins = make_plan(table, moves, strategy, per_worker=k, order="bins", load=load)
    relief = make_plan(table, moves, strategy, per_worker=k, load=load)
    plain = make_plan(table, moves, strategy, per_worker=k)
    assert steps_of(bins) == steps_of(plain) and plain.meta["order"] == "bins"
    assert sorted(m for s in steps_of(relief) for m in s) == sorted(moves)
    pairs = sorted(sorted((m.src, m.dst) for m in s) for s in steps_of(relief))
    assert pairs == sorted(sorted((m.src, m.dst) for m in s) for s in steps_of(bins))
    for step in steps_of(relief):  # still no worker sends or receives more per step
        for side in (Counter(m.src for m in step), Counter(m.dst for m in step)):
            assert max(side.values()) <= (k if strategy != ALL_AT_ONCE else len(moves))
    if strategy != BATCHED:  # batched may also take a pair's heaviest bins first
        assert sorted(map(sorted, steps_of(relief))) == sorted(map(sorted, steps_of(bins)))
    assert [s.epoch for s in relief.steps] == [s.epoch for s in bins.steps]
    relief.validate(table, 0)
    expect = "relief" if load.any() and moves else "bins"
    assert relief.meta["order"] == expect or not moves


@settings(max_examples=150, deadline=None)
@given(layouts(), st.sampled_from(FIXED_STRATEGIES))
def test_every_relief_step_is_the_best_next_step_so_the_first_beats_bin_order(layout, strategy):
    owners, target, load = layout
    table = table_with(owners)
    moves = target_moves(owners, target)
    relief = steps_of(make_plan(table, moves, strategy, load=load, order="relief"))
    bins = steps_of(make_plan(table, moves, strategy, load=load, order="bins"))
    if not moves:
        return
    ours, theirs = max_loads(owners, load, relief), max_loads(owners, load, bins)
    assert ours[0] <= theirs[0] + 1e-9
    assert ours[-1] == pytest.approx(theirs[-1])  # the same moves end in the same layout
    for k, step in enumerate(relief):  # no other remaining step would leave a lower maximum
        done = relief[:k]
        for other in relief[k:]:
            assert ours[k] <= max_loads(owners, load, [*done, other])[-1] + 1e-9, (k, step, other)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 5.0, 13.5]), min_size=1, max_size=6),
       st.lists(st.sampled_from([0.0, 1.0, 5.0, 13.5]), max_size=3), st.sampled_from([0.0, 3.0]),
       st.randoms(use_true_random=False))
def test_while_the_busiest_worker_stays_busiest_relief_per_step_never_grows(moved, others,
                                                                              extra, rnd):
    # Worker 0 sheds the bins `moved`, each to a new worker of its own, and keeps a bin at
    # least as heavy as any (plus `extra`); workers 1.. keep no more than that: worker 0 stays
    # the busiest throughout, so each step's relief is its bin's load, heaviest first.
    kept = max(moved) + extra
    load = np.array([*moved, kept, *[min(o, kept) for o in others]])
    owners = np.array([0] * (len(moved) + 1) + list(range(1, len(others) + 1)))
    load = np.pad(load, (0, 16 - load.size))  # 16 bins: the rest empty, on worker 0
    owners = np.pad(owners, (0, 16 - owners.size))
    fresh = 1 + len(others)
    moves = [Move(b, 0, fresh + b) for b in range(len(moved))]
    rnd.shuffle(moves)
    steps = steps_of(make_plan(table_with(owners), moves, FLUID, load=load))
    assert [s[0].bin for s in steps] == sorted(range(len(moved)), key=lambda b: (-moved[b], b))
    relief = relief_steps(steps, owners, load)
    assert [r["busiest"] for r in relief] == [0] * len(moved)
    assert [r["relief"] for r in relief] == sorted(moved, reverse=True)


def test_greedy_is_not_pointwise_below_bin_order_which_is_why_the_guarantee_is_per_step():
    # Worker 2 carries 13 (bins 0: 8, 2: 5), worker 1 carries 5 (bin 1); the plan swaps them.
    owners, load = np.array([2, 1, 2, 0]), np.array([8.0, 5.0, 5.0, 0.0])
    moves = [Move(0, 2, 1), Move(1, 1, 2), Move(2, 2, 1)]
    relief = order_steps([[m] for m in moves], owners, load, "relief").steps
    assert [s[0].bin for s in relief] == [2, 1, 0]
    assert max_loads(owners, load, relief) == [10.0, 13.0, 13.0]
    assert max_loads(owners, load, [[m] for m in moves]) == [13.0, 10.0, 13.0]


def test_ties_go_by_bin_and_the_order_is_deterministic():
    owners, load = np.zeros(8, dtype=np.int64), np.full(8, 3.0)
    moves = [Move(b, 0, 1) for b in (5, 2, 4, 0)]
    table = table_with(owners)
    plans = [make_plan(table, ms, FLUID, load=load) for ms in (moves, moves[::-1])]
    assert steps_of(plans[0]) == steps_of(plans[1])
    assert plans[0].meta["order"] == "relief"
    assert [s.moves[0].bin for s in plans[0].steps] == [0, 2, 4, 5]


def test_the_overloaded_workers_heaviest_bin_goes_first():
    # Worker 0 is behind (30 records/epoch); worker 1 (5) also sheds a bin; 2 is new.
    owners = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    load = np.array([2.0, 20.0, 8.0, 4.0, 1.0, 0.0, 0.0, 0.0])
    moves = [Move(0, 0, 2), Move(1, 0, 2), Move(3, 1, 2)]
    plan = make_plan(table_with(owners), moves, FLUID, load=load)
    assert [s.moves[0].bin for s in plan.steps] == [1, 0, 3]  # bin order: 0, 1, 3
    assert max_loads(owners, load, steps_of(plan)) == [20.0, 22.0, 26.0]


def test_batched_sends_a_pairs_heaviest_bin_in_the_first_matching():
    # Worker 0 carries 20, worker 1 18; worker 1 sends bins 0 (1) and 3 (5) to worker 3.
    owners = np.array([1, 1, 1, 1, 0, 1, 1, 0])
    load = np.array([1.0, 0.0, 10.0, 5.0, 10.0, 1.0, 1.0, 10.0])
    moves = [Move(0, 1, 3), Move(3, 1, 3), Move(7, 0, 2)]
    table = table_with(owners)
    bins = make_plan(table, moves, BATCHED, load=load, order="bins")
    relief = make_plan(table, moves, BATCHED, load=load)
    assert steps_of(bins) == [[Move(0, 1, 3), Move(7, 0, 2)], [Move(3, 1, 3)]]
    assert steps_of(relief) == [[Move(3, 1, 3), Move(7, 0, 2)], [Move(0, 1, 3)]]
    assert max_loads(owners, load, steps_of(bins)) == [17.0, 12.0]
    assert max_loads(owners, load, steps_of(relief)) == [13.0, 12.0]


def test_without_load_the_order_is_bin_order_and_the_plan_says_so():
    owners = np.array([0, 0, 1, 1])
    moves = [Move(1, 0, 2), Move(0, 0, 2), Move(3, 1, 2)]
    table = table_with(owners)
    for load in (None, np.zeros(4)):
        plan = make_plan(table, moves, FLUID, load=load, order="relief")
        assert plan.meta == {"order": "bins", "order_reason": "no load measured: bin order"}
        assert steps_of(plan) == steps_of(make_plan(table, moves, FLUID))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"order": "hottest"}, "unknown order 'hottest'"),
    ({"load": np.ones(3)}, "load must be 4 finite"),
    ({"load": np.array([1.0, -1.0, 0.0, 0.0])}, "load must be 4 finite"),
    ({"load": np.array([1.0, np.nan, 0.0, 0.0])}, "load must be 4 finite"),
])
def test_bad_order_or_load_is_a_plan_error(kwargs, message):
    with pytest.raises(PlanError, match=message):
        make_plan(table_with([0, 0, 1, 1]), [Move(0, 0, 1)], FLUID, **kwargs)


def test_deadline_plan_lists_moves_by_relief_and_tries_them_by_relief_per_byte():
    owners = np.array([0, 0, 0, 1])
    load = np.array([1.0, 9.0, 5.0, 0.0])
    moves = [Move(0, 0, 2), Move(1, 0, 2), Move(2, 0, 2)]
    plan = make_plan(table_with(owners), moves, DEADLINE, target_latency=2.0, load=load)
    assert [m.bin for m in plan.moves] == [1, 0, 2] and plan.policy["priority"] == "relief"
    plain = make_plan(table_with(owners), moves, DEADLINE, target_latency=2.0, load=load,
                      order="bins")
    assert [m.bin for m in plain.moves] == [0, 1, 2] and "priority" not in plain.policy
    given_priority = make_plan(table_with(owners), moves, DEADLINE, target_latency=2.0,
                               load=load, priority="smallest")
    assert given_priority.policy["priority"] == "smallest"


def test_relief_first_orders_by_records_per_byte_ties_in_plan_order():
    moves = (Move(3, 0, 1), Move(0, 0, 1), Move(1, 0, 1), Move(2, 0, 1))
    sizes = {0: 10, 1: 1000, 2: 400, 3: 0}
    records = {0: 1.0, 1: 500.0, 2: 400.0, 3: 0.5}  # per byte: 0.1, 0.5, 1.0; bin 3: 0.5
    view = EpochView(3, moves, sizes, records)
    order = relief_first(view, {m: sizes[m.bin] for m in moves})
    assert [m.bin for m in order] == [2, 3, 1, 0]


def test_relief_first_tries_the_busiest_workers_moves_first():
    # The newest epoch: worker 1 applied the most records, so its bins relieve the backlog;
    # worker 0's bin 0 has more records per byte but does not shorten the epoch.
    moves = (Move(0, 0, 2), Move(1, 1, 2), Move(2, 1, 3))
    sizes = {0: 1, 1: 100, 2: 10}
    records = {0: 50.0, 1: 100.0, 2: 20.0}  # per byte: 50, 1, 2
    epoch = EpochMetrics(7, per_worker={0: WorkerMetrics(records_in=50),
                                        1: WorkerMetrics(records_in=400)})
    view = EpochView(8, moves, sizes, records, (epoch,))
    size = {m: sizes[m.bin] for m in moves}
    assert busiest_workers((epoch,)) == {1}
    assert [m.bin for m in relief_first(view, size)] == [2, 1, 0]
    assert [m.bin for m in relief_first(EpochView(8, moves, sizes, records), size)] == [0, 2, 1]
    assert busiest_workers(()) == set()


@settings(max_examples=100, deadline=None)
@given(layouts(), st.sampled_from(STRATEGIES), st.randoms(use_true_random=False))
def test_relief_plans_end_in_bin_orders_routing_whatever_the_order_moves_come_in(
        layout, strategy, rnd):
    owners, target, load = layout
    table = table_with(owners)
    moves = target_moves(owners, target)
    shuffled = list(moves)
    rnd.shuffle(shuffled)
    extra = {"target_latency": 1.0} if strategy == DEADLINE else {}
    relief = make_plan(table, moves, strategy, load=load, **extra)
    again = make_plan(table, shuffled, strategy, load=load, **extra)
    bins = make_plan(table, moves, strategy, load=load, order="bins", **extra)
    assert relief.to_dict() == again.to_dict()  # deterministic, ties too
    ends = []
    for plan in (relief, bins):
        plan.validate(table, 0)
        final = np.array(owners)
        for step in plan.steps:
            for b, src, dst in step.moves:
                assert final[b] == src
                final[b] = dst
        ends.append(final)
    assert (ends[0] == ends[1]).all() and (ends[0] == target).all()


def test_plan_cli_shows_order_and_relief_per_step():
    owners = np.array([0, 0, 0, 1])
    load = np.array([2.0, 20.0, 8.0, 4.0])
    sizes = BinSizes(np.full(4, 10), np.full(4, 100))
    inputs = PlanningInputs(table_with(owners), sizes, load)
    plan = plan_rescale(inputs, 3, strategy=FLUID, balance="load")
    text = "\n".join(order_lines(plan))
    assert plan.meta["relief"]["max_load_before"] == 30.0
    assert "order       relief; largest worker load before: 30.0 records/epoch" in text
    lines = text.splitlines()
    head = lines.index(next(ln for ln in lines if ln.startswith("step")))
    assert lines[head].split() == ["step", "epoch", "bins", "from->to", "moved", "busiest",
                                   "relief", "its", "load", "after", "max", "load", "after"]
    assert [ln.split() for ln in lines[head + 1:]] == [
        ["0", "0", "2", "0->2", "8.0", "0", "8.0", "22.0", "22.0"],
        ["1", "1", "0", "0->1", "2.0", "0", "2.0", "20.0", "20.0"]]
    bins = plan_rescale(inputs, 3, strategy=FLUID, balance="load", order="bins")
    assert "order       bins;" in "\n".join(order_lines(bins))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--state-dir", "d", "--workers", "3", "--order", "bins"])
    assert args.order == "bins"
    assert parser.parse_args(["--state-dir", "d", "--workers", "3"]).order is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--state-dir", "d", "--workers", "3", "--order", "hot"])


def test_relief_counts_only_what_leaves_the_busiest_worker():
    # Worker 0 carries 20, worker 1 6; bin 0 (10) goes to worker 2, bin 2 (3) to worker 3.
    owners, load = np.array([0, 0, 1, 1]), np.array([10.0, 10.0, 3.0, 3.0])
    moves = [Move(0, 0, 2), Move(2, 1, 3)]
    plan = make_plan(table_with(owners), moves, FLUID, load=load)
    assert steps_of(plan) == [[Move(0, 0, 2)], [Move(2, 1, 3)]]
    assert relief_steps(steps_of(plan), owners, load) == [
        {"records": 10.0, "busiest": 0, "relief": 10.0, "busiest_after": 10.0, "max_load": 10.0},
        # workers 0 and 2 tie at 10 (the lower number is the busiest): worker 1's bin moves
        # 3 records, none of them off the busiest worker
        {"records": 3.0, "busiest": 0, "relief": 0.0, "busiest_after": 10.0, "max_load": 10.0},
    ]


def test_plan_cli_cuts_long_plans_and_lists_a_deadline_plans_order():
    owners = np.array([0, 0, 0, 0, 0, 0, 0, 1])
    load = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.0])
    sizes = BinSizes(np.full(8, 10), np.full(8, 100))
    inputs = PlanningInputs(table_with(owners), sizes, load)
    plan = plan_rescale(inputs, target={str(b): 2 for b in range(7)}, strategy=FLUID)
    lines = order_lines(plan, shown=3)
    # heaviest first, then bin 0: bin 4 would make the receiver (18) the new maximum
    assert [ln.split()[2] for ln in lines[4:7]] == ["6", "5", "0"]
    assert lines[-1] == "... 4 more steps; max load after the last: 28.0"
    deadline = plan_rescale(inputs, target={str(b): 2 for b in range(7)}, strategy=DEADLINE,
                            target_latency=1.0)
    assert "relief" not in deadline.meta
    assert order_lines(deadline, shown=3) == [
        "order       relief; the policy tries the moves in this order: 6, 5, 0 ..."]
