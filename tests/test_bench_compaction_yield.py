"""Smoke test of the compaction benchmark (``bench/compaction_yield.py``): both variants run,
the dropped bins are gone after the compaction it waits for, and it writes its results. No
timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.bench_modules import bench_module


def test_compaction_yield_runs_both_variants_and_reports(tmp_path: Path) -> None:
    with bench_module("compaction_yield") as bench:
        assert bench.main(["--keys", "40000", "--bins", "64", "--period", "0.05",
                           "--work-rows", "20000",
                           "--runs", "1", "--out", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "compaction-yield.json").read_text())["runs"]
    assert sorted(runs) == ["equal", "yield"]
    for (result,) in runs.values():
        assert result["keys_after"] <= 40_000 * 0.6  # every other bin dropped and compacted
