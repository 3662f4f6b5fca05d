"""Durable epochs: SIGKILL at every phase of a migrating epoch loses and repeats nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.crash_driver import EPOCHS, batch_keys

ROOT = Path(__file__).resolve().parents[1]


def reference() -> tuple[dict, dict]:
    counts: Counter = Counter()
    outputs = {}
    for epoch in range(EPOCHS):
        keys = batch_keys(epoch)
        counts.update(keys)
        outputs[str(epoch)] = {str(k): counts[k] for k in set(keys)}
    return outputs, {str(k): v for k, v in counts.items()}


def run_driver(state_dir: Path, strategy: str, out: Path, crash_at: str | None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MEGAPHONE_CRASH_AT", None)
    if crash_at:
        env["MEGAPHONE_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.crash_driver", str(state_dir), strategy, str(out)],
        cwd=ROOT, env=env, start_new_session=True, capture_output=True, text=True, timeout=300,
    )


# A crash at each phase of a migrating epoch, chained: every restart resumes the previous
# crash and then dies at the next phase. all-at-once moves every bin at epoch 2; fluid moves one
# bin per epoch at epochs 2-5, so its crashes hit successive migration steps.
CHAINS = {
    "all-at-once": ["export:2", "exported:2", "installed:2", "applied:2", "commit:2"],
    "fluid": ["export:2", "exported:3", "installed:3", "applied:4", "commit:5"],
}


@pytest.mark.parametrize("strategy", sorted(CHAINS))
def test_crash_at_every_phase_then_resume_equals_a_run_without_crash(tmp_path, strategy):
    state_dir, out = tmp_path / "state", tmp_path / "out.json"
    for crash_at in CHAINS[strategy]:
        result = run_driver(state_dir, strategy, out, crash_at)
        assert result.returncode == -9, (crash_at, result.stderr[-3000:])  # it did crash there
        assert not out.exists()
    result = run_driver(state_dir, strategy, out, None)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(out.read_text())
    expected_outputs, expected_state = reference()
    assert got["outputs"] == expected_outputs
    assert got["state"] == expected_state
    assert got["workers"] == [0, 1, 2, 3]
