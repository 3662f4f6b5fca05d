"""bench/relief.py's measures, on made-up epochs, and a tiny run of it (the benchmark itself
runs on a quiet machine: bench/RESULTS.md; no timing is asserted here)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from tests.helpers.bench_modules import bench_module


def test_time_to_relief_is_from_the_decision_until_backlog_gone_and_latency_under_target():
    with bench_module("relief") as relief:
        def run(latencies: list[float], done: float | None):
            rows = [relief.Row("x", e, 2.0 * (e + 1), 2.0 * (e + 1) + lat, lat, 1.0, 2, 0, 0,
                               0.0) for e, lat in enumerate(latencies)]
            return relief.Run("x", 0, rows, 5.0, done, [], "relief", [], {}, 0)

        s = relief.stats(run([0.5, 3.0, 4.0, 2.5, 1.5, 3.0, 1.0, 0.9], 15.0), target=2.0)
        # decided at 5 s; the last epoch over 2 s (epoch 5) is followed by epoch 6, done at 15 s
        # epochs 2, 3, 4 and 6 waited for the one before them: the backlog is gone at 15 s too
        assert s["time_to_relief_s"] == 10.0 and s["peak_latency_s"] == 4.0
        assert s["backlog_gone_s"] == 10.0 and s["latency_under_target_s"] == 10.0
        assert s["latency_at_decision_s"] == 0.5 and s["scaling_duration_s"] == 10.0
        # under a 3 s target all the time, but epochs 2 and 3 waited (epoch 3 ends at 9 s)
        s = relief.stats(run([0.5, 2.5, 2.5, 1.0, 0.9], None), target=3.0)
        assert s["latency_under_target_s"] == 0.0 and s["backlog_gone_s"] == 4.0
        assert s["time_to_relief_s"] == 4.0
        assert relief.stats(run([3.0, 1.0, 1.0], None), 2.0)["time_to_relief_s"] == 0.0
        never = relief.stats(run([1.0, 3.0, 3.0], None), 2.0)
        assert never["time_to_relief_s"] == float("inf") and never["scaling_duration_s"] is None
        assert relief._ratio(1.0, float("inf")) is None and relief._ratio(1.0, 4.0) == 0.25


#: A tiny open-loop run: 2 measured epochs of 0.5 s at 200 records/s, the decision after one.
TINY = ["--epochs", "2", "--before", "1", "--interval", "0.5", "--rate", "200", "--bins", "16",
        "--keys", "100", "--hot", "3", "--cost-ms", "0.1", "--rounds", "1", "--warmup", "0",
        "--no-progress"]


@pytest.mark.slow
def test_tiny_run_compares_both_orders_and_writes_its_results(spark, tmp_path: Path):
    out, summary = tmp_path / "out", tmp_path / "summary.json"
    with bench_module("relief") as relief:
        assert relief.main([*TINY, "--out", str(out), "--json", str(summary)], spark=spark) == 0
    data = json.loads(summary.read_text())
    assert data == json.loads((out / "summary.json").read_text())
    assert [(r["order"], r["plan_order"]) for r in data["runs"]] == [("bins", "bins"),
                                                                      ("relief", "relief")]
    assert {r["records_fed"] for r in data["runs"]} == {3 * 100}  # the primer and 2 epochs
    for order in ("bins", "relief"):
        with open(out / f"{order}-0.csv", newline="") as fh:
            assert len(list(csv.DictReader(fh))) == 2


def test_the_skewed_stream_puts_its_most_popular_keys_in_distinct_bins_of_worker_0():
    with bench_module("relief") as relief:
        nexmark = relief.relief_nexmark
        for workload, kind in (("q7", "auction"), ("q8", "seller")):
            args = relief.parse(["--workload", workload, "--hot", "5", "--bins", "32",
                                 "--workers", "2", "--seed", "7"])
            config, hot = nexmark.choose_stream(args)
            assert config.seed >= 7 and config.skew == args.skew == 1.2
            assert hot == list(nexmark.most_popular(config, kind, 5))
            bins = [int(b) for b in relief.bin_of(hot, 32)]
            assert len(set(bins)) == 5 and all(b < 16 for b in bins)  # worker 0's range
            assert nexmark.choose_stream(args) == (config, hot)
            # the stage reads --rate records per second: bids are 46 of 50 events, persons and
            # auctions 4 of 50
            share = 46 / 50 if workload == "q7" else 4 / 50
            assert config.events_per_second * share == pytest.approx(args.rate)


#: The tiny run on NEXMark: windows of 0.2 s of event time, so that some close in it, and 50
#: popular ids (Q8: the sellers sign up within the run, so that some auctions find them).
TINY_NEXMARK = [*TINY[:TINY.index("--keys")], *TINY[TINY.index("--hot"):], "--window-s", "0.2",
                "--skew-keys", "50"]


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["q7", "q8"])
def test_tiny_nexmark_run_matches_the_batch_sql_in_both_orders(spark, tmp_path: Path, workload):
    out = tmp_path / "out"
    with bench_module("relief") as relief:
        args = [*TINY_NEXMARK, "--workload", workload, "--out", str(out)]
        assert relief.main(args, spark=spark) == 0
    data = json.loads((out / "summary.json").read_text())
    assert [(r["order"], r["plan_order"]) for r in data["runs"]] == [("bins", "bins"),
                                                                      ("relief", "relief")]
    checks = {r["check"] for r in data["runs"]}
    assert len(checks) == 1 and re.fullmatch(r"[1-9]\d* rows = batch SQL, none late",
                                             checks.pop())
    assert len(data["stream"][f"hot_{'auction' if workload == 'q7' else 'seller'}s"]) == 3
