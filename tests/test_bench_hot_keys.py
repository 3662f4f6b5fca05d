"""Smoke test of the hot-keys benchmark (``bench/hot_keys.py --smoke``): the split and unsplit
pipelines agree on every epoch's outputs and on their final states (the benchmark raises
otherwise), the calibration runs, and the summary is written. No timing is asserted (speed
lives in the benchmark, on a quiet machine)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.bench_modules import bench_module


def test_smoke_run_splits_alike_and_writes_its_summary(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with bench_module("hot_keys") as hot_keys:
        assert hot_keys.main(["--smoke", "--out", str(out)], spark=spark) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["check"].startswith("ok")
    assert summary["split_records"] > 0  # the hot key was split after it was first seen
    assert summary["hot_keys_seen"][0][0] == "hot"
    assert len(summary["capacity"]["parallel_speedups"]) == summary["epochs"]
    assert summary["ceiling"] > 0
    assert (out / "summary.md").read_text().startswith("hot key share")
