"""``bench/window_fold.py`` runs a few small epochs of each query and writes its medians."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("query", ["q5", "q7"])
def test_a_small_run_prints_and_writes_each_parts_median(tmp_path: Path, query: str) -> None:
    out = tmp_path / "fold.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "window_fold.py"), "--query",
                           query, "--rate", "3000", "--epochs", "3", "--warmup", "6", "--json",
                           str(out)], capture_output=True, text=True, timeout=120, check=True)
    assert "median ms per epoch" in done.stdout
    medians = json.loads(out.read_text())["median_ms"]
    assert set(medians) == {"decode", "fold", "encode", "outputs", "epoch"}
    assert medians["epoch"] >= medians["fold"] > 0
    open_keys = re.search(r"([\d,]+) keys with open windows", done.stdout)
    assert open_keys is not None and int(open_keys.group(1).replace(",", "")) > 0
