"""Crashes in the middle of a group of epochs (docs/groups.md) lose and repeat nothing.

One chain of SIGKILLs of the whole pipeline, each restart resuming the last: after the driver
wrote the commit records of 2 of a group's 4 epochs (``commit:2``: the workers are 2 epochs
past it), in a worker's task between two epochs of a group (``apply:5``), and after every
worker committed a whole group but before the driver's first commit record (``collect:4``).
And kills of the store service in the middle of groups, in runs that go on to commit those
groups: the group's job runs again and replays the epochs the workers committed. The chain
ends equal to a run without crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.helpers.crash_driver import batch_keys
from tests.helpers.group_crash_driver import EPOCHS
from tests.test_recovery import wait_for_service_exit

ROOT = Path(__file__).resolve().parents[1]
# The crashes, and the store kills of each run (the crashes', then the resume's). The run
# after ``commit:2`` (rolled back to epoch 1) runs the group 2..3, with a store kill, and dies
# in the group 4..7; the run after ``collect:4`` rolls every worker back to epoch 3 and runs
# 4..7 again with two store kills (at most two inside one group's job).
CHAIN = ["commit:2", "apply:5", "collect:4"]
STORE_KILLS = [[], ["apply:3:store"], [], ["install:4:store", "apply:6:store"]]


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
    state_dir, out = tmp_path / "state", tmp_path / "out.json"
    for crash_at, store in zip(CHAIN, STORE_KILLS, strict=False):
        result = run_driver(state_dir, out, ",".join([crash_at, *store]))
        assert result.returncode == -9, (crash_at, result.stderr[-3000:])
        assert not out.exists()
        wait_for_service_exit(state_dir)
    result = run_driver(state_dir, out, ",".join(STORE_KILLS[-1]))
    assert result.returncode == 0, result.stderr[-3000:]
    fired = sorted(p.name for p in (state_dir.parent / "local").glob("crashed-*"))
    assert len(fired) == sum(map(len, STORE_KILLS)), fired  # every store kill happened
    return json.loads(out.read_text())


def test_crashes_in_the_middle_of_groups_equal_a_run_without_crash(tmp_path):
    got = crash_chain(tmp_path)
    counts: Counter = Counter()
    expected = {}
    for epoch in range(EPOCHS):
        counts.update(batch_keys(epoch))
        expected[str(epoch)] = {str(k): counts[k] for k in set(batch_keys(epoch))}
    assert got["outputs"] == expected
    assert got["state"] == {str(k): v for k, v in counts.items()}
    assert got["workers"] == [0, 1, 2, 3]
    # The last crash came after every worker committed the group 4..7: the resume rolled each
    # back 4 epochs (the group's undo records) to the driver's commit, epoch 3.
    assert sorted(got["rolled_back"]) == [0, 1, 2, 3]
    # The store kills' groups ran again, each in its job's next attempt.
    assert got["job_attempts"] > EPOCHS
    # The runs did run groups (each epoch's metrics name its group's first epoch): after the
    # crash at commit:2 (0..3 left no metrics) the next run ran 2..3, and the plan's step at
    # epoch 4 started the last group.
    assert got["groups"] == {str(e): 2 if e < 4 else 4 for e in range(2, EPOCHS)}
