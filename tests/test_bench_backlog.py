"""Smoke test of the backlog benchmark (``bench/backlog.py --smoke``): both runs catch up the
same backlog with equal outputs and the results JSON is written. No timing is asserted (speed
lives in the benchmark, on a quiet machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_modules import bench_module


@pytest.fixture(scope="module")
def backlog():
    """The ``bench/backlog.py`` module (bench/ is not a package)."""
    with bench_module("backlog") as module:
        yield module


def test_smoke_run_catches_up_alike_and_writes_its_results(spark, backlog, tmp_path: Path):
    out = tmp_path / "out"
    assert backlog.main(["--smoke", "--group-size", "4", "--out", str(out), "--no-progress"],
                        spark=spark) == 0
    data = json.loads((out / "backlog.json").read_text())
    assert data["outputs_equal"]
    assert data["runs"]["per-epoch"]["jobs"] == 6
    assert data["runs"]["groups"]["group_sizes"] == [4, 2]  # 6 epochs in groups of 4
    assert {"speedup", "met"} <= set(data)
