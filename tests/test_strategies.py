"""Targets and strategies: pure, fast property tests (no Spark, no state backends)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.plans import (
    ALL_AT_ONCE,
    BATCHED,
    FIXED_STRATEGIES,
    FLUID,
    BinSizes,
    MigrationPlan,
    PlanError,
    PlanningInputs,
    balanced_target,
    explicit_target,
    make_plan,
    matching_rounds,
    plan_rescale,
    schedule,
    target_moves,
)
from megaphone.plans.planner import DEFAULT_TRANSFER_RATE, observed_load, transfer_rate
from megaphone.plans.strategies import hopcroft_karp
from megaphone.records import EpochMetrics
from megaphone.routing.bins import bin_of
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move, RoutingTable


@st.composite
def move_sets(draw, max_bins: int = 48, max_workers: int = 8) -> list[Move]:
    """Moves of distinct bins between workers 0..max_workers-1 (never to the same worker)."""
    bins = draw(st.lists(st.integers(0, max_bins - 1), unique=True, max_size=max_bins))
    moves = []
    for b in bins:
        src = draw(st.integers(0, max_workers - 1))
        dst = draw(st.integers(0, max_workers - 2))
        moves.append(Move(b, src, dst if dst < src else dst + 1))
    return moves


def kuhn_size(pairs: set[tuple[int, int]]) -> int:
    """Maximum matching size by simple augmenting paths: the independent reference."""
    adj: dict[int, list[int]] = {}
    for s, d in sorted(pairs):
        adj.setdefault(s, []).append(d)
    match: dict[int, int] = {}

    def augment(u: int, seen: set[int]) -> bool:
        for v in adj[u]:
            if v not in seen:
                seen.add(v)
                if v not in match or augment(match[v], seen):
                    match[v] = u
                    return True
        return False

    return sum(augment(u, set()) for u in adj)


def max_degree(moves: list[Move]) -> int:
    src, dst = Counter(m.src for m in moves), Counter(m.dst for m in moves)
    return max([*src.values(), *dst.values()], default=0)


def table_with(owners: list[int] | np.ndarray, pipeline: str = "p") -> RoutingTable:
    """A routing table whose newest version has exactly ``owners``."""
    owners = np.asarray(owners)
    table = RoutingTable.initial(Fingerprint(pipeline, owners.size, "int64"), 1)
    moves = [Move(int(b), 0, int(w)) for b, w in enumerate(owners) if w != 0]
    if moves:
        table.apply_step(moves, 1)
    return table


# -- strategies --------------------------------------------------------------------------


@given(move_sets(), st.sampled_from(FIXED_STRATEGIES), st.integers(1, 4))
def test_every_move_lands_in_exactly_one_step(moves, strategy, k):
    steps = schedule(moves, strategy, per_worker=k if strategy == BATCHED else 1)
    flat = [m for s in steps for m in s]
    assert Counter(flat) == Counter(moves)
    assert all(steps), "no empty step"
    for step in steps:
        assert len({m.bin for m in step}) == len(step)


@given(move_sets())
def test_fluid_moves_one_bin_per_step(moves):
    steps = schedule(moves, FLUID)
    assert len(steps) == len(moves)
    assert all(len(s) == 1 for s in steps)


@given(move_sets())
def test_all_at_once_is_one_step(moves):
    steps = schedule(moves, ALL_AT_ONCE)
    assert len(steps) == (1 if moves else 0)


@given(move_sets(), st.integers(1, 4))
def test_batched_steps_respect_per_worker_and_are_optimal(moves, k):
    steps = schedule(moves, BATCHED, per_worker=k)
    for step in steps:
        assert max(Counter(m.src for m in step).values()) <= k
        assert max(Counter(m.dst for m in step).values()) <= k
    # Δ matchings are necessary and enough: ceil(Δ / k) steps.
    assert len(steps) == math.ceil(max_degree(moves) / k)


@given(move_sets())
def test_batched_steps_are_maximum_matchings(moves):
    remaining = list(moves)
    rounds = matching_rounds(moves)
    assert len(rounds) == max_degree(moves)
    for step in rounds:
        assert len({m.src for m in step}) == len(step) == len({m.dst for m in step})
        assert len(step) == kuhn_size({(m.src, m.dst) for m in remaining})
        for m in step:
            remaining.remove(m)
    assert not remaining


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=40))
def test_hopcroft_karp_matches_reference(pairs):
    adj = [sorted({d for s, d in pairs if s == u}) for u in range(10)]
    ml = hopcroft_karp(adj, 10)
    used = [v for v in ml if v != -1]
    assert len(used) == len(set(used))
    assert all(v == -1 or v in adj[u] for u, v in enumerate(ml))
    assert len(used) == kuhn_size(set(pairs))


def test_hopcroft_karp_keeps_initial_matching_covered():
    adj = [[0, 1], [0], [1, 2]]
    ml = hopcroft_karp(adj, 3, match_left=[0, -1, -1])
    assert ml[0] != -1 and sum(v != -1 for v in ml) == 3


@given(move_sets(max_workers=4), st.sampled_from(FIXED_STRATEGIES), st.integers(0, 5))
def test_gap_spaces_steps_and_plans_validate(moves, strategy, gap):
    owners = [0] * 64
    for m in moves:
        owners[m.bin] = m.src
    table = table_with(owners)
    if not moves:  # nothing to move: an empty plan, valid and done at once
        empty = make_plan(table, moves, strategy, gap)
        empty.validate(table, 0)
        assert empty.empty and empty.end_version == table.version
        return
    plan = make_plan(table, moves, strategy, gap)
    assert [s.epoch for s in plan.steps] == [i * (gap + 1) for i in range(len(plan.steps))]
    assert plan.strategy == strategy and plan.base_version == table.version
    plan.validate(table, 0)
    again = MigrationPlan.from_json(plan.to_json())
    assert again == plan


def test_schedule_rejects_bad_arguments():
    with pytest.raises(PlanError, match="unknown strategy"):
        schedule([Move(0, 0, 1)], "sideways")
    with pytest.raises(PlanError, match="per_worker"):
        schedule([Move(0, 0, 1)], BATCHED, per_worker=0)
    with pytest.raises(PlanError, match="only once"):
        schedule([Move(0, 0, 1), Move(0, 1, 2)], FLUID)
    with pytest.raises(PlanError, match="gap"):
        make_plan(table_with([0, 1]), [Move(0, 0, 1)], FLUID, gap=-1)


# -- targets -----------------------------------------------------------------------------


@st.composite
def layouts(draw, pow2: bool = False):
    """Current owners over 1..8 workers and a target worker count 1..8."""
    bins = draw(st.sampled_from([2, 4, 8, 16, 32, 64, 128]) if pow2 else st.integers(1, 128))
    current = draw(st.integers(1, 8))
    owners = np.array(draw(st.lists(st.integers(0, current - 1), min_size=bins, max_size=bins)))
    return owners, draw(st.integers(1, 8))


def minimal_count_moves(owners: np.ndarray, n: int) -> int:
    """Fewest moves that leave bin counts within one on workers 0..n-1 (equal bins)."""
    q, r = divmod(owners.size, n)
    counts = sorted((int((owners == w).sum()) for w in range(n)), reverse=True)
    caps = [q + 1] * r + [q] * (n - r)  # the r fullest workers may keep q + 1
    return owners.size - sum(min(c, cap) for c, cap in zip(counts, caps, strict=True))


@given(layouts(), st.integers(1, 1000))
def test_equal_bins_balance_within_one_bin_with_minimal_moves(layout, size):
    owners, n = layout
    target = balanced_target(owners, np.full(owners.size, float(size)), n)
    counts = np.bincount(target, minlength=n)
    assert counts.size == n, "only workers 0..n-1 own bins"
    assert counts.max() <= math.ceil(owners.size / n)
    assert counts.min() >= owners.size // n
    assert len(target_moves(owners, target)) == minimal_count_moves(owners, n)


@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.integers(1, 8))
def test_skewed_bytes_balance_within_ten_percent(seed, current, n):
    # Heavy-tailed sizes (lognormal, sigma 1.2: bins differ by 100x and more), capped at a tenth
    # of a worker's share: a bin larger than that could not be balanced to 10% by anyone.
    rng = np.random.default_rng(seed)
    weights = np.round(rng.lognormal(6, 1.2, 256))
    weights = np.minimum(weights, np.floor(weights.sum() / n / 10))
    owners = rng.integers(0, current, 256)
    target = balanced_target(owners, weights, n)
    load = np.bincount(target, weights=weights, minlength=n)
    assert load.max() <= 1.1 * load.mean()
    assert load.min() >= 0.9 * load.mean()


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=96), st.integers(1, 6),
       st.integers(1, 6), st.randoms(use_true_random=False))
def test_any_weights_end_within_one_bin_of_ideal(weights, current, n, rnd):
    owners = np.array([rnd.randrange(current) for _ in weights])
    w = np.array(weights, dtype=float)
    target = balanced_target(owners, w, n)
    load = np.bincount(target, weights=w, minlength=n)
    assert load.max() <= load.mean() + w.max() + 1e-6
    for worker in range(n):  # nobody exceeds the least loaded by more than its smallest bin
        mine = w[(target == worker) & (w > 0)]
        assert mine.size == 0 or load[worker] - load.min() <= mine.min() + 1e-6
    assert (target < n).all()


@given(layouts(pow2=True), st.sampled_from(FIXED_STRATEGIES), st.integers(0, 2**32 - 1))
def test_same_input_same_plan(layout, strategy, seed):
    owners, n = layout
    weights = np.random.default_rng(seed).integers(0, 100, owners.size)
    sizes = BinSizes(weights, weights * 10)
    plans = [plan_rescale(PlanningInputs(table_with(owners), sizes), n, strategy=strategy).to_dict()
             for _ in range(2)]
    assert plans[0] == plans[1]


def test_scaling_two_to_four_moves_exactly_half():
    owners = np.arange(64) % 2
    target = balanced_target(owners, np.ones(64), 4)
    moves = target_moves(owners, target)
    assert len(moves) == 32
    assert np.bincount(target).tolist() == [16] * 4
    assert {m.dst for m in moves} == {2, 3}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_n_to_n_moves_nothing(n):
    owners = np.arange(64) % n
    assert target_moves(owners, balanced_target(owners, np.ones(64), n)) == []
    sizes = BinSizes(np.full(64, 5), np.full(64, 50))
    plan = plan_rescale(PlanningInputs(table_with(owners), sizes), n, strategy=BATCHED)
    assert plan.steps == () and plan.meta["bins_moved"] == 0


def test_scale_in_moves_only_removed_workers_bins():
    owners = np.arange(64) % 4
    target = balanced_target(owners, np.ones(64), 2)
    moves = target_moves(owners, target)
    assert sorted(m.bin for m in moves) == [b for b in range(64) if b % 4 >= 2]
    assert np.bincount(target).tolist() == [32, 32]


def test_empty_bins_spread_by_count():
    owners = np.zeros(16, dtype=int)
    target = balanced_target(owners, np.zeros(16), 4)
    assert np.bincount(target).tolist() == [4, 4, 4, 4]


def test_balanced_target_rejects_bad_input():
    with pytest.raises(PlanError, match="workers must be in"):
        balanced_target(np.zeros(4, int), np.ones(4), 0)
    with pytest.raises(PlanError, match="weights"):
        balanced_target(np.zeros(4, int), -np.ones(4), 2)


def test_explicit_target_map_and_list():
    owners = np.array([0, 1, 0, 1])
    assert explicit_target(owners, {"2": 3, 0: 0}).tolist() == [0, 1, 3, 1]
    assert explicit_target(owners, [1, 1, 0, 0]).tolist() == [1, 1, 0, 0]
    with pytest.raises(PlanError, match=r"bins that do not exist: 4, 9 \(bins are 0..3\)"):
        explicit_target(owners, {"9": 1, "4": 0, "1": 0})
    with pytest.raises(PlanError, match="every bin"):
        explicit_target(owners, [0, 1])
    with pytest.raises(PlanError, match="target workers"):
        explicit_target(owners, {"1": "x"})
    with pytest.raises(PlanError, match="bins must be integers"):
        explicit_target(owners, {"one": 1})


# -- plan_rescale and its inputs ---------------------------------------------------------


def test_plan_rescale_meta_summarizes_the_plan():
    rng = np.random.default_rng(7)
    keys = rng.integers(1, 100, 64)
    sizes = BinSizes(keys, keys * 37)
    table = table_with(np.arange(64) % 2)
    plan = plan_rescale(PlanningInputs(table, sizes), 3, strategy=BATCHED, gap=2, balance="bytes")
    plan.validate(table, 0)
    meta = plan.meta
    moved = [m.bin for m in plan.moves]
    assert meta["bins_moved"] == len(moved) and meta["steps"] == len(plan.steps)
    assert meta["bytes_moved"] == int(sizes.bytes[moved].sum())
    assert meta["keys_moved"] == int(sizes.keys[moved].sum())
    assert meta["largest_step_bytes"] == max(int(sizes.bytes[[m.bin for m in s.moves]].sum())
                                             for s in plan.steps)
    assert meta["workers_before"] == [0, 1] and meta["workers_after"] == [0, 1, 2]
    assert meta["balance"] == "bytes" and meta["epochs"] == 3 * len(plan.steps) - 2
    for side in ("before", "after"):
        assert sum(d["bytes"] for d in meta[side].values()) == int(sizes.bytes.sum())
    assert meta["skew_after"] < meta["skew_before"]


def test_plan_rescale_with_explicit_target():
    table = table_with([0, 1, 0, 1])
    plan = plan_rescale(PlanningInputs(table, BinSizes.zeros(4)), target={"0": 1, "3": 1},
                        strategy=FLUID)
    assert plan.moves == [Move(0, 0, 1)] and plan.meta["balance"] == "explicit"


def test_plan_rescale_argument_errors():
    table = table_with([0, 1, 0, 1])
    with pytest.raises(PlanError, match="exactly one"):
        plan_rescale(PlanningInputs(table, BinSizes.zeros(4)))
    with pytest.raises(PlanError, match="exactly one"):
        plan_rescale(PlanningInputs(table, BinSizes.zeros(4)), 2, target={0: 1})
    with pytest.raises(PlanError, match="unknown balance"):
        plan_rescale(PlanningInputs(table, BinSizes.zeros(4)), 2, balance="vibes")
    with pytest.raises(PlanError, match="needs recorded epoch metrics"):
        plan_rescale(PlanningInputs(table, BinSizes.zeros(4)), 2, balance="load")


def test_plan_rescale_reads_its_inputs():
    table = table_with([0, 0, 1, 1])
    sizes = BinSizes(np.array([1, 1, 1, 1]), np.array([10, 10, 10, 10]))
    with pytest.raises(PlanError, match="1 plan\\(s\\) in flight"):
        plan_rescale(PlanningInputs(table, sizes, in_flight=1), 3)
    # measured load wins over the estimate from metrics; without it the metrics are used
    measured = PlanningInputs(table, sizes, load=np.array([9.0, 1.0, 1.0, 1.0]))
    assert plan_rescale(measured, 2, balance="load").meta["before"]["0"]["records"] == 10.0
    metrics = (epoch_record(epoch=1, per_worker={"0": {"worker": 0, "records_in": 4}}),)
    observed = PlanningInputs(table, sizes, metrics=metrics)
    assert plan_rescale(observed, 2, balance="load").meta["before"]["0"]["records"] == 4.0
    assert plan_rescale(observed, 2).meta["estimate"]["rate_source"].startswith("default")


def epoch_record(**fields) -> EpochMetrics:
    """An epoch's metrics record with the given fields (times default to 0)."""
    return EpochMetrics.from_dict({"epoch": 0, "started": 0.0, "finished": 0.0,
                                   "duration_s": 0.0, **fields})


def test_observed_load_spreads_worker_records_by_keys():
    table = table_with([0, 0, 1, 1])  # this layout is in force from epoch 1
    keys = np.array([1, 3, 0, 0])
    metrics = [
        epoch_record(epoch=1, per_worker={"0": {"worker": 0, "records_in": 100},
                                          "1": {"worker": 1, "records_in": 10}}),
        epoch_record(epoch=2, per_worker={"0": {"worker": 0, "records_in": 300},
                                          "1": {"worker": 1, "records_in": 30}}),
    ]
    load = observed_load(table, keys, metrics)
    assert load.tolist() == [50.0, 150.0, 10.0, 10.0]  # per epoch; empty bins share evenly
    assert observed_load(table, keys, []) is None


def test_observed_load_gives_watched_hot_keys_records_to_their_bins():
    table = table_with([0, 0, 1, 1])
    hot = next(k for k in range(100) if bin_of(k, 4) == 0)
    metrics = [epoch_record(epoch=1, hot_keys=[[hot, 70, 10]],
                            per_worker={"0": {"worker": 0, "records_in": 100},
                                        "1": {"worker": 1, "records_in": 10}})]
    # bin 0 surely had 60 of the hot key's; worker 0's other 40 go 1:3 by keys
    assert observed_load(table, np.array([1, 3, 0, 0]), metrics).tolist() == \
        [70.0, 30.0, 5.0, 5.0]


def test_transfer_rate_measured_or_default():
    assert transfer_rate([epoch_record(bytes_moved=0, duration_s=1)]) == \
        (DEFAULT_TRANSFER_RATE, 0)
    rate, n = transfer_rate([epoch_record(bytes_moved=300, duration_s=1.0),
                             epoch_record(bytes_moved=100, duration_s=1.0),
                             epoch_record(bytes_moved=0, duration_s=5.0)])
    assert (rate, n) == (200.0, 2)
