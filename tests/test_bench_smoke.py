"""Smoke test of the migration benchmark (``bench/migration.py --keys 1e5``).

Runs every strategy and baseline at the smallest size on the shared SparkSession and checks
that the CSVs, the plots and the summary are written and name every run. The benchmark itself
checks that every run's counts add up (it raises otherwise). No timing is asserted: the
numbers of a smoke run on a shared CI machine mean nothing.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.helpers.bench_modules import bench_module

RUNS = ("steady", "all-at-once", "fluid", "batched", "deadline@30", "pause-restart", "native")


@pytest.fixture(scope="module")
def migration():
    """The ``bench/migration.py`` module (bench/ is not a package)."""
    with bench_module("migration") as module:
        yield module


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


@pytest.mark.slow
@pytest.mark.parametrize("run", ["restart-app", "native-repartition"])
def test_restart_baselines_pay_the_restart_and_keep_the_counts(spark, migration, run: str,
                                                                tmp_path: Path) -> None:
    """``restart-app`` (one child process per stretch) and ``native-repartition`` at the
    tiniest size: one reconfiguration, a short drain. Their state totals are checked by the
    benchmark itself (it raises on a mismatch)."""
    out = tmp_path / "out"
    assert migration.main(["--keys", "1e4", "--scenario", "half-out", "--cooldown", "1",
                           "--drain-epochs", "2", "--out", str(out), "--no-progress", "--runs",
                           run], spark=spark) == 0
    data = json.loads((out / "summary.json").read_text())
    cfg = migration.resolve(migration.parser().parse_args(["--keys", "1e4"]))
    r = data["runs"][run]
    assert r["check"].startswith("ok")
    assert [p["label"] for p in r["phases"]] == ["out"] and len(r["windows"]) == 1
    phase = r["phases"][0]
    assert phase["pause_s"] > 0 and r["epochs_during"] > 0
    assert abs(sum(phase[k] or 0.0 for k in ("stop_s", "app_start_s", "migrate_s", "reopen_s"))
               - phase["pause_s"]) < 0.05
    with open(out / f"{run}.csv", newline="") as fh:
        epochs = [int(row["epoch"]) for row in csv.DictReader(fh)]
    assert epochs == list(range(len(epochs)))  # every epoch once, across the restart
    assert len(epochs) >= cfg.warmup + cfg.pre + 1
    summary = (out / "summary.md").read_text()
    assert f"| {run} |" in summary and "drain s per reconfiguration" in summary
    if run == "restart-app":
        assert r["keys_moved"] > 0 and phase["app_start_s"] > 0 and phase["session_s"] > 0
        assert "app start" in summary
    else:
        assert phase["partitions"] == 2 * cfg.workers and phase["app_start_s"] is None
        assert "repartition to 4 partitions" in summary


def test_restart_stretches_follow_the_pause_restart_schedule(migration) -> None:
    import restart_baselines as rb

    cfg = migration.resolve(migration.parser().parse_args(["--keys", "1e7", "--hold", "3"]))
    first, out, back = rb.stretches(cfg)
    start = cfg.warmup + cfg.pre
    assert (first.first, first.stop, first.step) == (0, start, None)
    assert (out.first, out.stop, out.step[0]) == (start, start + 3, "out")
    assert (back.first, back.stop, back.step[0]) == (start + 3, None, "back")
    assert back.min_end == back.first + cfg.cooldown
    assert back.max_end == back.min_end + cfg.drain_epochs
    assert rb.native_targets(cfg) == [("out", 2 * cfg.workers), ("back", cfg.workers)]
    # The last stretch runs its cooldown, then stops at the first drained epoch.
    assert not rb.should_stop(back, back.min_end - 1, 0.1, 1.0)
    assert not rb.should_stop(back, back.min_end, 5.0, 1.0)
    assert rb.should_stop(back, back.min_end, 0.5, 1.0)
    assert rb.should_stop(back, back.max_end, 5.0, 1.0)


def test_drain_time_is_from_the_window_end_to_the_first_epoch_back_in_line(migration) -> None:
    import report

    def row(e: int, start: float, finish: float):
        return report.EpochRow("x", e, e + 1.0, start, finish, 10, finish - e - 1.0,
                               finish - start)

    rows = [row(0, 1.0, 1.2), row(1, 2.0, 2.2), row(2, 3.0, 3.2), row(3, 6.0, 6.5),
            row(4, 6.5, 7.0), row(5, 7.0, 7.3), row(6, 7.3, 7.6), row(7, 8.0, 8.2)]
    result = report.RunResult("x", rows, [report.Window("out", 3.5, 6.0)])
    report.label_phases(rows, result.windows, warmup=1)
    # Steady median latency 0.2 s: back in line once an epoch is within 0.3 s -- epoch 7
    # (0.2 s); the backlog was worked off when epoch 6 (still 0.6 s late) completed at 7.6 s,
    # 1.6 s after the window ended.
    assert report.drain_times(result) == pytest.approx([1.6])
    assert report.run_stats(result)["drain_s"] == pytest.approx(1.6)
    rows[3].latency_s = 0.1  # the first epoch after the window is already in line
    assert report.drain_times(result) == [0.0]
    rows[3].latency_s = 2.5
    result.rows = rows[:6]
    assert all(d != d for d in report.drain_times(result))  # not drained: NaN


def test_profiles_and_scenario_targets(migration) -> None:
    cfg = migration.resolve(migration.parser().parse_args(["--keys", "1e5"]))
    assert cfg.profile == "smoke" and cfg.per_epoch == round(cfg.rate * cfg.interval)
    steps = migration.reconfigurations(cfg)
    (_, out), (_, back) = steps
    # half of the bins of the second half of the workers move to the first half, then back.
    assert set(out) == set(back)
    first = [b * cfg.workers // cfg.bins for b in range(cfg.bins)]  # contiguous ranges
    assert all(first[b] >= cfg.workers // 2 for b in out)
    assert all(back[b] == first[b] and out[b] == back[b] - cfg.workers // 2 for b in out)
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
