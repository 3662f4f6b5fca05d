"""Smoke test of the migration benchmark (``bench/migration.py --keys 1e5``).

Runs every strategy and baseline at the smallest size on the shared SparkSession and checks
that the CSVs, the plots and the summary are written and name every run. The benchmark itself
checks that every run's counts add up (it raises otherwise). No timing is asserted: the
numbers of a smoke run on a shared CI machine mean nothing.
"""

from __future__ import annotations

import csv
import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
RUNS = ("steady", "all-at-once", "fluid", "batched", "deadline@30", "pause-restart", "native")


@pytest.fixture(scope="module")
def migration():
    """The ``bench/migration.py`` module (bench/ is not a package)."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("migration")
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.slow
def test_smoke_run_writes_every_output(spark, migration, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert migration.main(["--keys", "1e5", "--out", str(out), "--no-progress", "--runs",
                           ",".join(RUNS)], spark=spark) == 0
    for run in RUNS:
        with open(out / f"{run}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert rows, f"{run}.csv has no epochs"
        assert {r["run"] for r in rows} == {run}
        assert all(float(r["latency_s"]) == float(r["latency_s"]) for r in rows)  # no NaN
    for plot in ("latency.png", "memory.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    for run in RUNS:
        assert f"| {run} |" in summary
    data = json.loads((out / "summary.json").read_text())
    assert set(data["runs"]) == set(RUNS)
    assert all(r["check"].startswith("ok") for r in data["runs"].values())
    moved = {name: r["keys_moved"] for name, r in data["runs"].items()}
    assert moved["steady"] == moved["native"] == 0
    # out and back: every migrating run moves the same bins twice.
    assert moved["all-at-once"] == moved["fluid"] == moved["batched"] == moved["pause-restart"] \
        == moved["deadline@30"] > 0
    # The deadline run: its policy's decisions and the latency-target table.
    with open(out / "deadline@30-decisions.csv", newline="") as fh:
        decisions = list(csv.DictReader(fh))
    assert {d["reconfiguration"] for d in decisions} == {"out", "back"}
    assert sum(int(d["bins"]) for d in decisions) == 2 * len(migration.reconfigurations(
        migration.resolve(migration.parser().parse_args(["--keys", "1e5"])))[0][1])
    assert "| 30 | deadline@30 |" in summary and "| 30 | fluid |" in summary
    assert "deadline@30: " in summary and "epochs over 30 s" in summary


def test_profiles_and_scenario_targets(migration) -> None:
    cfg = migration.resolve(migration.parser().parse_args(["--keys", "1e5"]))
    assert cfg.profile == "smoke" and cfg.per_epoch == round(cfg.rate * cfg.interval)
    steps = migration.reconfigurations(cfg)
    (_, out), (_, back) = steps
    # half of the bins of the second half of the workers move to the first half, then back.
    assert set(out) == set(back)
    assert all(b % cfg.workers >= cfg.workers // 2 for b in out)
    assert all(back[b] == b % cfg.workers and out[b] == back[b] - cfg.workers // 2 for b in out)
    assert len(out) == cfg.bins // cfg.workers // 2 * (cfg.workers // 2)
    full = migration.resolve(migration.parser().parse_args(["--keys", "1e7", "--scenario",
                                                             "scale-out"]))
    assert migration.reconfigurations(full) == [("scale-out", 2 * full.workers)]
    half = migration.resolve(migration.parser().parse_args(["--keys", "1e5", "--scenario",
                                                             "half-out"]))
    assert migration.reconfigurations(half) == [("out", out)]
    assert migration.run_order(["native", "deadline@4", "fluid", "deadline@1.5", "steady"]) == \
        ["steady", "fluid", "deadline@1.5", "deadline@4", "native"]
    assert migration.deadline_target("deadline@2.5") == 2.5
    assert migration.deadline_target("deadline@0") is None
    with pytest.raises(SystemExit, match="unknown runs"):
        migration.resolve(migration.parser().parse_args(["--runs", "fluid,deadline@soon"]))


def test_workload_matches_spark(spark, migration) -> None:
    """The numpy keys of the native baseline are exactly the JVM-generated keys."""
    workload = migration.Workload(keys=1000, per_epoch=500)
    from_jvm = sorted(r.key for r in workload.frame(spark, 3).collect())
    assert from_jvm == sorted(workload.keys_of(3).tolist())


def test_native_schedule_anchors_on_the_first_on_time_trigger(migration) -> None:
    # Two batches catch up after the preload, then triggers fall on 2 s boundaries; the
    # fifth overran its interval and the sixth started late.
    starts = [1001.55, 1002.7, 1004.01, 1006.0, 1008.0, 1010.9]
    assert migration.native_schedule(starts, 2.0) == [1000.0, 1002.0, 1004.0, 1006.0, 1008.0,
                                                      1010.0]
    assert migration.native_schedule([1.55, 2.7], 2.0) == [1.55, 3.55]  # never on time


def test_phases_cover_window_and_backlog(migration) -> None:
    import report

    def row(e: int, start: float, finish: float):
        return report.EpochRow("x", e, e + 1.0, start, finish, 10, finish - e - 1.0,
                               finish - start)

    rows = [row(0, 1.0, 1.5), row(1, 2.0, 2.5), row(2, 3.0, 7.0), row(3, 7.0, 7.8),
            row(4, 7.8, 8.4), row(5, 8.4, 8.9), row(6, 8.9, 9.5), row(7, 9.5, 9.9),
            row(8, 9.9, 9.95), row(9, 10.0, 10.3)]
    report.label_phases(rows, [report.Window("out", 3.0, 7.0)], warmup=1)
    # Epochs 2-6 ran in the window or their input ended in it; 7-8 still worked off the
    # backlog; 9 started on time again.
    assert [r.phase for r in rows] == ["warmup", "steady", *["migration"] * 5, "drain", "drain",
                                       "steady"]
