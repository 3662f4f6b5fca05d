"""Smoke test of the backlog benchmark (``bench/backlog.py --smoke``): both runs catch up the
same backlog with equal outputs and the results JSON is written. No timing is asserted (speed
lives in the benchmark, on a quiet machine)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def backlog():
    """The ``bench/backlog.py`` module (bench/ is not a package)."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("backlog")
    finally:
        sys.path.remove(str(BENCH))


def test_smoke_run_catches_up_alike_and_writes_its_results(spark, backlog, tmp_path: Path):
    out = tmp_path / "out"
    assert backlog.main(["--smoke", "--group-size", "4", "--out", str(out), "--no-progress"],
                        spark=spark) == 0
    data = json.loads((out / "backlog.json").read_text())
    assert data["outputs_equal"]
    assert data["runs"]["per-epoch"]["jobs"] == 6
    assert data["runs"]["groups"]["group_sizes"] == [4, 2]  # 6 epochs in groups of 4
    assert {"speedup", "met"} <= set(data)
