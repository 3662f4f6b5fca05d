"""Crashes in the middle of a group of epochs (docs/groups.md) lose and repeat nothing.

Chains of SIGKILLs of the whole pipeline, each restart resuming the last: after the driver
wrote the commit records of 2 of a group's 4 epochs (``commit:2``: the workers are 2 epochs
past it), in a worker's task between two epochs of a group (``apply:5``), and after every
worker committed a whole group but before the driver's first commit record (``collect:4``).
And kills of the store service in the middle of groups, in a run that goes on to commit those
groups: the group's job runs again and replays the epochs the workers committed. Each chain
ends equal to a run without crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.crash_driver import batch_keys
from tests.helpers.group_crash_driver import EPOCHS
from tests.test_recovery import wait_for_service_exit

ROOT = Path(__file__).resolve().parents[1]
# Two chains, a test each (the suite's test processes run them side by side): the crashes of
# each, and the store kills of each of its runs (the crashes', then the resume's). The first
# chain's crash rolls the group 0..3 back to epoch 1, so its resume runs the groups 2..3 and
# 4..7 and kills the store in the middle of both (at most two kills inside one group's job).
CHAINS = {
    "commit": (["commit:2"], [[], ["apply:3:store", "install:4:store", "apply:6:store"]]),
    "collect": (["apply:5", "collect:4"], [[], [], []]),
}
CHAIN = [crash for crashes, _ in CHAINS.values() for crash in crashes]


def run_driver(state_dir: Path, out: Path, crash_at: str | None):
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "MEGAPHONE_LOCAL_DIR": str(state_dir.parent / "local")}
    env.pop("MEGAPHONE_CRASH_AT", None)
    if crash_at:
        env["MEGAPHONE_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.group_crash_driver", str(state_dir), str(out)],
        cwd=ROOT, env=env, start_new_session=True, capture_output=True, text=True, timeout=300)


def crash_chain(tmp_path: Path, chain: str) -> dict:
    state_dir, out = tmp_path / chain / "state", tmp_path / chain / "out.json"
    state_dir.parent.mkdir()
    crashes, kills = CHAINS[chain]
    for crash_at, store in zip(crashes, kills, strict=False):
        result = run_driver(state_dir, out, ",".join([crash_at, *store]))
        assert result.returncode == -9, (crash_at, result.stderr[-3000:])
        assert not out.exists()
        wait_for_service_exit(state_dir)
    result = run_driver(state_dir, out, ",".join(kills[-1]))
    assert result.returncode == 0, result.stderr[-3000:]
    fired = sorted(p.name for p in (state_dir.parent / "local").glob("crashed-*"))
    assert len(fired) == sum(map(len, kills)), fired  # every store kill happened
    return json.loads(out.read_text())


@pytest.mark.parametrize("chain", CHAINS)
def test_crashes_in_the_middle_of_groups_equal_a_run_without_crash(tmp_path, chain):
    got = crash_chain(tmp_path, chain)
    counts: Counter = Counter()
    expected = {}
    for epoch in range(EPOCHS):
        counts.update(batch_keys(epoch))
        expected[str(epoch)] = {str(k): counts[k] for k in set(batch_keys(epoch))}
    assert got["outputs"] == expected
    assert got["state"] == {str(k): v for k, v in counts.items()}
    assert got["workers"] == [0, 1, 2, 3]
    # The runs did run groups (each epoch's metrics name its group's first epoch): the plan's
    # step at epoch 4 started the last one.
    if chain == "collect":
        # The last crash came after every worker committed the group 4..7: the resume rolled
        # each back 4 epochs (the group's undo records) to the driver's commit, epoch 3.
        assert sorted(got["rolled_back"]) == [0, 1, 2, 3]
        assert got["groups"] == {str(e): 0 if e < 4 else 4 for e in range(EPOCHS)}
    else:
        # The store kills' groups ran again, each in its job's next attempt; after the crash
        # at commit:2 (0..3 left no metrics) the resume ran 2..3, then 4..7.
        assert got["job_attempts"] > EPOCHS
        assert got["groups"] == {str(e): 2 if e < 4 else 4 for e in range(2, EPOCHS)}
