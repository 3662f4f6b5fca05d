"""Smoke test of the NEXMark benchmark (``bench/nexmark.py``) at its tiniest: one query, one
megaphone strategy and the native stop-repartition-restart, on the shared SparkSession; and
its capacity sweep at one rate.

It checks that the CSVs, the plot and the summary are written and that both runs passed the
benchmark's own correctness check (their outputs equal the batch SQL; the benchmark raises
otherwise). No timing is asserted: the numbers of a smoke run on a shared machine mean nothing.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.helpers.bench_modules import bench_module


@pytest.fixture(scope="module")
def nexmark():
    """The ``bench/nexmark.py`` module (bench/ is not a package)."""
    with bench_module("nexmark") as module:
        yield module


@pytest.mark.slow
def test_tiny_run_writes_every_output_and_passes_its_checks(spark, nexmark, tmp_path: Path):
    out = tmp_path / "out"
    runs = ("batched", "native-repartition")
    assert nexmark.main(["--quick", "--queries", "q8", "--runs", ",".join(runs), "--pre", "1",
                         "--cooldown", "1", "--drain-epochs", "0", "--out", str(out),
                         "--no-progress"], spark=spark) == 0
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# NEXMark through a live rescale (quick)")
    assert "Command: `python bench/nexmark.py --quick --queries q8" in summary
    assert "Machine: " in summary and "## Q8" in summary
    data = json.loads((out / "summary.json").read_text())
    stats = data["queries"]["q8"]
    assert set(stats) == set(runs)
    for run in runs:
        assert f"| {run} |" in summary
        assert stats[run]["check"].startswith("ok (") and "= batch SQL" in stats[run]["check"]
        assert stats[run]["epochs_during"] > 0 and len(stats[run]["windows"]) == 1
        with open(out / f"q8-{run}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert [int(r["epoch"]) for r in rows] == list(range(len(rows)))
        assert {r["run"] for r in rows} == {run} and rows[0]["phase"] == "warmup"
        assert sum(int(r["outputs"]) for r in rows) > 0, "the query emitted nothing to check"
    with open(out / "q8-batched.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sum(int(r["bins_moved"]) for r in rows) == int(rows[-1]["bins_done"]) == \
        int(rows[-1]["bins_total"]) == 2  # half of 4 bins, from 2 workers to 4
    (pause,) = stats["native-repartition"]["phases"]
    assert pause["partitions"] == 4 and pause["migrate_s"] > 0
    assert "stop " in summary and "repartition " in summary
    assert (out / "q8.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_tiny_sweep_runs_both_systems_and_checks_their_outputs(spark, nexmark, tmp_path: Path):
    """``--sweep`` at one rate for two epochs: a steady megaphone point and a native one, each
    checked against the batch SQL, judged, and written out (their verdicts depend on the
    machine, so they are not asserted)."""
    out = tmp_path / "sweep"
    assert nexmark.main(["--quick", "--sweep", "--queries", "q8", "--sweep-rates", "250",
                         "--sweep-seconds", "2", "--sweep-retries", "0", "--out", str(out),
                         "--no-progress"],
                        spark=spark) == 0
    data = json.loads((out / "sweep.json").read_text())
    points = data["points"]
    assert [(p["query"], p["system"], p["rate"]) for p in points] == \
        [("q8", "steady", 250), ("q8", "native", 250)]
    for p in points:
        assert p["check"].startswith("ok (") and p["expected"] == 2
        assert p["epochs"] == 2 or (not p["sustained"] and p["epochs"] < 2)
        assert p["p99"] >= p["p50"] > 0
        with open(out / "points" / f"q8-{p['system']}-250.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) >= 1 + p["epochs"] and rows[0]["phase"] == "warmup"
        assert {r["bins_moved"] for r in rows} == {"0"}
    assert set(data["capacity"]["q8"]) == {"steady", "native"}
    text = (out / "sweep.md").read_text()
    assert text.startswith("# NEXMark capacity sweep") and "| Q8 | " in text
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "state").exists() or not any((out / "state").iterdir())


def test_settings_and_what_native_spark_cannot_express(nexmark) -> None:
    quick = nexmark.resolve(nexmark.parser().parse_args(["--quick"]))
    full = nexmark.resolve(nexmark.parser().parse_args([]))
    assert quick.queries == full.queries == ("q3", "q4", "q5", "q7", "q8")
    assert quick.runs == ("fluid", "batched", "deadline@2", "native", "native-repartition")
    assert quick.paths == ("vectorized",)
    assert full.runs[2] == "deadline@4" and full.out.name == "nexmark-full"
    assert quick.nexmark.events_per_second == quick.rate
    assert quick.per_epoch * 10 < full.per_epoch * full.bins
    assert nexmark.deadline_target("deadline@2.5") == 2.5
    assert nexmark.deadline_target("deadline@x") is None
    with pytest.raises(SystemExit, match="unknown"):
        nexmark.resolve(nexmark.parser().parse_args(["--queries", "q6"]))
    with pytest.raises(SystemExit, match="operator paths vectorized,per-key"):
        nexmark.resolve(nexmark.parser().parse_args(["--operator-paths", "columns"]))
    import nexmark_native

    assert set(nexmark_native.QUERIES) == {"q3", "q5", "q7", "q8"}
    assert set(nexmark_native.UNSUPPORTED) == {"q4"}


def test_operator_paths_run_each_megaphone_run_both_ways(nexmark) -> None:
    """``--operator-paths vectorized,per-key``: a before/after in one run, the per-key run
    named after its strategy (a deadline run keeps its target) with its operators' flag off."""
    cfg = nexmark.resolve(nexmark.parser().parse_args(
        ["--quick", "--operator-paths", "vectorized, per-key"]))
    assert cfg.paths == ("vectorized", "per-key")
    bench = nexmark.Bench(cfg, None, None)
    before = nexmark.LiveRun(bench, "q5", "deadline@2", "per-key")
    after = nexmark.LiveRun(bench, "q5", "deadline@2")
    assert (before.name, before.strategy, before.target, before.vectorized) == \
        ("deadline@2-per-key", "deadline", 2.0, False)
    assert (after.name, after.strategy, after.target, after.vectorized) == \
        ("deadline@2", "deadline", 2.0, True)
    assert nexmark.deadline_target("deadline@2-per-key") == 2.0
