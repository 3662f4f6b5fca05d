"""Crashes in the middle of a group of epochs (docs/groups.md) lose and repeat nothing.

A chain of SIGKILLs of the whole pipeline, each restart resuming the last: after the driver
wrote the commit records of 2 of a group's 4 epochs (``commit:2``: the workers are 2 epochs
past it), in a worker's task between two epochs of a group (``apply:5``), and after every
worker committed a whole group but before the driver's first commit record (``collect:4``).
And in one run that never dies, kills of the store service in the middle of groups: the
group's job runs again and replays the epochs the workers committed. Both end equal to a run
without crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.helpers.crash_driver import batch_keys
from tests.helpers.group_crash_driver import EPOCHS
from tests.test_recovery import wait_for_service_exit

ROOT = Path(__file__).resolve().parents[1]
CHAIN = ["commit:2", "apply:5", "collect:4"]
STORE_KILLS = ["apply:1:store", "install:4:store", "apply:6:store"]


def run_driver(state_dir: Path, out: Path, crash_at: str | None):
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "MEGAPHONE_LOCAL_DIR": str(state_dir.parent / "local")}
    env.pop("MEGAPHONE_CRASH_AT", None)
    if crash_at:
        env["MEGAPHONE_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.group_crash_driver", str(state_dir), str(out)],
        cwd=ROOT, env=env, start_new_session=True, capture_output=True, text=True, timeout=300)


def crash_chain(tmp_path: Path) -> dict:
    state_dir, out = tmp_path / "chain" / "state", tmp_path / "chain" / "out.json"
    state_dir.parent.mkdir()
    for crash_at in CHAIN:
        result = run_driver(state_dir, out, crash_at)
        assert result.returncode == -9, (crash_at, result.stderr[-3000:])
        assert not out.exists()
        wait_for_service_exit(state_dir)
    result = run_driver(state_dir, out, None)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def store_kills(tmp_path: Path) -> dict:
    state_dir, out = tmp_path / "kills" / "state", tmp_path / "kills" / "out.json"
    state_dir.parent.mkdir()
    result = run_driver(state_dir, out, ",".join(f"{p}" for p in STORE_KILLS))
    assert result.returncode == 0, result.stderr[-3000:]
    fired = sorted(p.name for p in (state_dir.parent / "local").glob("crashed-*"))
    assert len(fired) == len(STORE_KILLS), fired
    return json.loads(out.read_text())


def test_crashes_in_the_middle_of_groups_equal_a_run_without_crash(tmp_path):
    with ThreadPoolExecutor(2) as pool:
        chain, kills = pool.submit(crash_chain, tmp_path), pool.submit(store_kills, tmp_path)
        results = {"chain": chain.result(), "kills": kills.result()}
    counts: Counter = Counter()
    expected = {}
    for epoch in range(EPOCHS):
        counts.update(batch_keys(epoch))
        expected[str(epoch)] = {str(k): counts[k] for k in set(batch_keys(epoch))}
    for name, got in results.items():
        assert got["outputs"] == expected, name
        assert got["state"] == {str(k): v for k, v in counts.items()}, name
        assert got["workers"] == [0, 1, 2, 3], name
    # The last crash came after every worker committed the group 4..7: the resume rolled
    # each back 4 epochs (the group's undo records) to the driver's commit, epoch 3.
    assert sorted(results["chain"]["rolled_back"]) == [0, 1, 2, 3]
    assert results["kills"]["rolled_back"] == [] and results["kills"]["job_attempts"] > 2
    # The runs did run groups: the plan's step at epoch 4 started the second one.
    assert results["kills"]["groups"] == {str(e): 0 if e < 4 else 4 for e in range(EPOCHS)}
