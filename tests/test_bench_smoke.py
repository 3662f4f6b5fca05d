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
RUNS = ("steady", "all-at-once", "fluid", "batched", "pause-restart", "native")


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
    assert migration.main(["--keys", "1e5", "--out", str(out), "--no-progress"], spark=spark) == 0
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
    assert moved["all-at-once"] == moved["fluid"] == moved["batched"] == moved["pause-restart"] > 0


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


def test_workload_matches_spark(spark, migration) -> None:
    """The numpy keys of the native baseline are exactly the JVM-generated keys."""
    workload = migration.Workload(keys=1000, per_epoch=500)
    from_jvm = sorted(r.key for r in workload.frame(spark, 3).collect())
    assert from_jvm == sorted(workload.keys_of(3).tolist())
