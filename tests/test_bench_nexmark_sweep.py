"""The capacity sweep's rules (``bench/nexmark_sweep.py``) without Spark: when a rate counts as
sustained, when a run may stop early, which rates a system tries and what its capacity is, the
settings of ``bench/nexmark.py --sweep`` and the files the sweep writes."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.bench_modules import bench_module

LADDER = (10_000.0, 20_000.0, 50_000.0, 100_000.0, 200_000.0)


@pytest.fixture(scope="module")
def sweep():
    """The ``bench/nexmark_sweep.py`` module (bench/ is not a package)."""
    with bench_module("nexmark_sweep") as module:
        yield module


def point(sweep, rate: float, sustained: bool, query: str = "q5", system: str = "steady"):
    return sweep.Point(query, system, rate, 30, 30, 0.5, 1.0 if sustained else 5.0, 0.0,
                       sustained, "sustained" if sustained else "p99", "ok (3 rows)", 61.0)


def test_a_rate_is_sustained_under_twice_the_epoch_without_a_growing_backlog(sweep) -> None:
    steady = [1.0, 1.2, 0.9, 1.1] * 6
    verdict = sweep.judge(steady, 2.0, len(steady))
    assert verdict.sustained and verdict.reason == "sustained"
    assert verdict.p50 == pytest.approx(1.05) and verdict.p99 < 4.0
    # One epoch of 24 at 6 s: p99 is most of the way to the largest, so the rate is lost.
    spiked = sweep.judge([*steady[:-1], 6.0], 2.0, len(steady))
    assert not spiked.sustained and "p99" in spiked.reason
    # Falling behind by 0.1 s an epoch stays under the p99 limit for 24 epochs, and fails.
    behind = [1.0 + 0.1 * i for i in range(24)]
    slow = sweep.judge(behind, 2.0, len(behind))
    assert slow.p99 < 4.0 and not slow.sustained and "falling behind" in slow.reason
    assert slow.growth_s == pytest.approx(1.6)
    # A run stopped early failed, whatever its latencies.
    assert not sweep.judge(steady[:5], 2.0, 24).sustained
    assert not sweep.judge([], 2.0, 24).sustained


def test_a_run_stops_early_once_its_p99_cannot_come_back_under_the_limit(sweep) -> None:
    assert not sweep.hopeless([], 30, 2.0)
    assert not sweep.hopeless([1.0, 5.0], 30, 2.0)  # p99 at best 1 + 0.71 * (5 - 1) = 3.84 s
    assert sweep.hopeless([1.0, 6.0], 30, 2.0)
    assert sweep.hopeless([4.1, 4.2], 30, 2.0)
    assert not sweep.hopeless([1.0] * 30, 30, 2.0)


@given(st.lists(st.floats(0.0, 20.0), min_size=1, max_size=60), st.data())
def test_stopping_early_never_stops_a_run_that_could_still_be_sustained(sweep, lats, data):
    done = data.draw(st.integers(1, len(lats)))
    if sweep.hopeless(lats[:done], len(lats), 2.0):
        assert not sweep.judge(lats, 2.0, len(lats)).sustained


def climb_to(sweep, capacity: float, bisect: int = 1, retries: int = 0, ladder=LADDER) -> list:
    return sweep.climb(ladder, bisect, lambda rate: point(sweep, rate, rate <= capacity),
                       retries)


def test_the_ladder_stops_at_the_first_failed_rate_then_bisects(sweep) -> None:
    tried = climb_to(sweep, 30_000)
    assert [p.rate for p in tried] == [10_000, 20_000, 50_000, 32_000]
    assert sweep.capacity(tried) == (20_000, 20_000)
    tried = climb_to(sweep, 35_000)
    assert sweep.capacity(tried) == (32_000, 32_000)
    tried = climb_to(sweep, 30_000, bisect=2)
    assert [p.rate for p in tried][-1] == 25_000  # between 20,000 and 32,000
    assert sweep.capacity(tried) == (25_000, 25_000)
    assert [p.rate for p in climb_to(sweep, 30_000, bisect=0)] == [10_000, 20_000, 50_000]
    # Each failed rate is run again before it counts.
    assert [p.rate for p in climb_to(sweep, 30_000, retries=1)] == \
        [10_000, 20_000, 50_000, 50_000, 32_000, 32_000]


def test_a_failure_that_does_not_repeat_does_not_stop_the_climb(sweep) -> None:
    runs: list[float] = []

    def flaky(rate: float):  # 20,000 fails its first run only; the capacity is 60,000
        runs.append(rate)
        return point(sweep, rate, rate <= 60_000 and runs != [10_000, 20_000])

    tried = sweep.climb(LADDER, 1, flaky, retries=1)
    assert [p.rate for p in tried] == [10_000, 20_000, 20_000, 50_000, 100_000, 100_000,
                                       71_000, 71_000]
    assert sweep.capacity(tried) == (50_000, 50_000)
    assert sweep.capacity(tried[:3]) == (20_000, math.inf)  # the retry's verdict counts


def test_capacity_when_every_rate_or_the_first_one_fails(sweep) -> None:
    everything = climb_to(sweep, math.inf)
    assert [p.rate for p in everything] == list(LADDER)
    assert sweep.capacity(everything) == (200_000, math.inf)
    nothing = climb_to(sweep, 5_000, retries=2)
    assert [p.rate for p in nothing] == [10_000] * 3
    assert sweep.capacity(nothing) == (0.0, 10_000)
    assert all(math.isnan(v) for v in sweep.capacity([]))
    # A higher rate sustained after a lower one failed (noise) does not count.
    noisy = [point(sweep, 10_000, True), point(sweep, 20_000, False), point(sweep, 50_000, True)]
    assert sweep.capacity(noisy) == (10_000, 10_000)


@given(st.floats(1_000, 500_000), st.integers(0, 4), st.integers(0, 2))
def test_a_monotone_system_gets_its_capacity_bracketed(sweep, capacity, bisect, retries):
    tried = climb_to(sweep, capacity, bisect, retries)
    rates = [p.rate for p in tried]
    assert len(set(rates)) <= len(LADDER) + bisect
    lo, _ = sweep.capacity(tried)
    failed = [p.rate for p in tried if not p.sustained]
    assert lo <= capacity < min(failed, default=math.inf)
    assert len(set(failed)) <= 1 + bisect
    assert all(rates.count(r) == 1 + retries for r in failed)
    assert all(rates.count(p.rate) == 1 for p in tried if p.sustained)


def test_midpoints_are_round_and_capacities_print_with_their_bounds(sweep) -> None:
    assert sweep.nice(31_622.8) == 32_000 and sweep.nice(14_142.1) == 14_000
    assert sweep.nice(707.1) == 710
    assert sweep.fmt_capacity((32_000, 32_000)) == "32,000"
    assert sweep.fmt_capacity((200_000, math.inf)) == ">= 200,000"
    assert sweep.fmt_capacity((0.0, 10_000)) == "< 10,000"
    assert sweep.fmt_capacity((math.nan, math.nan)) == "-"
    assert sweep.fmt_ratio((32_000, 32_000), (20_000, 20_000)) == "1.60x"
    assert sweep.fmt_ratio((200_000, math.inf), (50_000, 50_000)) == ">= 4.00x"
    assert sweep.fmt_ratio((0.0, 10_000), (20_000, 20_000)) == "<= 0.50x"
    assert sweep.fmt_ratio((200_000, math.inf), (200_000, math.inf)) == "-"
    assert sweep.fmt_ratio((20_000, 20_000), (math.nan, math.nan)) == "-"


def test_the_outputs_hold_every_point_and_the_capacities_side_by_side(sweep, tmp_path) -> None:
    points = [point(sweep, 10_000, True), point(sweep, 20_000, False),
              point(sweep, 10_000, True, system="native"),
              point(sweep, 20_000, True, system="native"),
              point(sweep, 50_000, False, system="native"),
              point(sweep, 10_000, True, query="q4")]
    info = {"command": "python bench/nexmark.py --sweep", "machine": "test", "setup": "tiny"}
    text = sweep.write_sweep(tmp_path, points, 2.0, info)
    assert "| Q5 | 10,000 | 20,000 | 0.50x |" in text
    assert "| Q4 | >= 10,000 | - | - |" in text
    assert text.count("| Q5 | ") == 1 + 5  # the capacity table, then every point
    assert "no: p99" in text
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert len(data["points"]) == 6 and data["command"] == info["command"]
    assert data["capacity"]["q5"]["native"] == {"low": 20_000, "high": 20_000}
    assert (tmp_path / "sweep.md").read_text() == text
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_settings(tmp_path: Path) -> None:
    with bench_module("nexmark") as nexmark:
        def resolve(*args: str):
            return nexmark.resolve(nexmark.parser().parse_args(list(args)))

        full = resolve("--sweep")
        assert full.sweep and full.sweep_rates == LADDER and full.sweep_seconds == 60
        assert full.sweep_bisect == full.sweep_retries == 1
        assert full.out.name == "nexmark-sweep-full"
        quick = resolve("--sweep", "--quick", "--sweep-rates", "100,400", "--sweep-seconds", "3")
        assert quick.sweep_rates == (100, 400) and quick.sweep_seconds == 3
        assert quick.out.name == "nexmark-sweep-quick" and not resolve().sweep
        # The generator's auctions in flight follow the rate unless --in-flight sets them.
        assert replace(full, rate=20_000).nexmark.num_in_flight_auctions == 2_000
        fixed = resolve("--sweep", "--in-flight", "50")
        assert replace(fixed, rate=20_000).nexmark.num_in_flight_auctions == 50
        for bad in ("200,100", "100,100", "0,100", "x", ""):
            with pytest.raises(SystemExit, match="--sweep-rates"):
                resolve("--sweep", "--sweep-rates", bad)
        with pytest.raises(SystemExit, match="under one epoch"):
            resolve("--sweep", "--sweep-seconds", "1")
        with pytest.raises(SystemExit, match="--sweep-retries -1 is negative"):
            resolve("--sweep", "--sweep-retries", "-1")
        assert nexmark.sweep_systems(full, "q4") == [("steady", "vectorized")]
        assert nexmark.sweep_systems(replace(full, paths=("vectorized", "per-key")), "q5") == \
            [("steady", "vectorized"), ("steady-per-key", "per-key"), ("native", "")]
        run = nexmark.LiveRun(nexmark.Bench(full, None, None), "q5", "steady", "per-key")
        assert run.steady and run.name == "steady-per-key"
        assert resolve("--runs", "steady,native").runs == ("steady", "native")
