"""Durable epochs: SIGKILL at every phase of a migrating epoch loses and repeats nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


def crash_and_resume(tmp_path: Path, strategy: str) -> dict:
    """Run the chain of crashes for ``strategy``, then a clean resume; return its results."""
    state_dir, out = tmp_path / strategy / "state", tmp_path / strategy / "out.json"
    state_dir.parent.mkdir()
    for crash_at in CHAINS[strategy]:
        result = run_driver(state_dir, strategy, out, crash_at)
        assert result.returncode == -9, (crash_at, result.stderr[-3000:])  # it did crash there
        assert not out.exists()
    result = run_driver(state_dir, strategy, out, None)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_crash_at_every_phase_then_resume_equals_a_run_without_crash(tmp_path):
    # The two chains run side by side: each restart is mostly JVM start-up, not CPU.
    with ThreadPoolExecutor(len(CHAINS)) as pool:
        runs = {s: pool.submit(crash_and_resume, tmp_path, s) for s in sorted(CHAINS)}
        results = {s: run.result() for s, run in runs.items()}
    expected_outputs, expected_state = reference()
    for strategy, got in results.items():
        assert got["outputs"] == expected_outputs, strategy
        assert got["state"] == expected_state, strategy
        assert got["workers"] == [0, 1, 2, 3], strategy
        # The last crash hit the commit write: every worker had applied the epoch, so the
        # resume rolled all of them back to the last commit before running it again.
        assert got["rolled_back"] == [0, 1, 2, 3], strategy
