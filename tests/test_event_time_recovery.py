"""Event-time operators survive crashes: a chain of a window and an aggregate, and a
left-outer join, each migrating, killed at the phases of migrating epochs (and between the
chain's stages), resumed, give epoch by epoch exactly the outputs of the plain-Python
references (so exactly those of a run without crash), and count late records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.helpers.event_time_driver import (
    EPOCH0,
    EPOCHS,
    SECOND,
    WINDOW_US,
    WITHIN_US,
    join_records,
    window_records,
)
from tests.helpers.operator_reference import join_reference, window_reference
from tests.test_recovery import wait_for_service_exit

ROOT = Path(__file__).resolve().parents[1]
# Pipeline kills at phases of migrating epochs (the plans run at epochs 2-6) and a kill between
# the chain's stages, in one chain: each restart resumes the last crash, then a resume runs to
# the end. The resume loses its store service in the middle of an epoch (its job runs again:
# workers that committed replay, and must report the same largest event time, or the next
# watermark and the outputs would differ).
CRASHES = ["export:2", "apply:3", "commit:4", "between:5"]
STORE_KILL = "apply:6:store"


def run_driver(root: Path, out: Path, crash: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEGAPHONE_LOCAL_DIR": str(root / "local")}
    env.pop("MEGAPHONE_CRASH_AT", None)
    args = [sys.executable, "-m", "tests.helpers.event_time_driver", str(root / "state"),
            str(out)]
    if crash is not None and crash.startswith("between:"):
        args.append(crash.split(":")[1])
    elif crash is not None:
        env["MEGAPHONE_CRASH_AT"] = crash
    return subprocess.run(args, cwd=ROOT, env=env, start_new_session=True,
                          capture_output=True, text=True, timeout=300)


def expected() -> tuple[dict, dict]:
    """What the chain (max of window sums per closed window) and the join must output at each
    epoch: the references run on the epochs up to each one, and what a prefix adds to the one
    before is that epoch's output (a window closes, a pair or an unmatched left row is
    emitted, at the first epoch whose watermark allows it)."""
    t0 = int(EPOCH0.timestamp()) * SECOND
    epochs = [[(k, t0 + s * SECOND, v) for k, s, v in window_records(e)]
              for e in range(EPOCHS)]
    joins = [[(k, s * SECOND, side, x) for k, s, side, x in join_records(e)]
             for e in range(EPOCHS)]
    best: dict[str, list] = {}
    pairs: dict[str, list] = {}
    closed_before: set = set()
    pairs_before: Counter = Counter()
    running: dict[int, int] = {}  # the max pipeline's state: the best sum per window end
    for e in range(EPOCHS):
        sums, closed, _ = window_reference(epochs[:e + 1], WINDOW_US, WINDOW_US,
                                                     "sum", 0)
        ends = set()
        for key, end in closed - closed_before:
            running[end] = max(running.get(end, sums[(key, end)]), sums[(key, end)])
            ends.add(end)
        closed_before = closed
        best[str(e)] = sorted([end, running[end]] for end in ends)
        emitted, _ = join_reference(joins[:e + 1], "left", within=WITHIN_US)
        pairs[str(e)] = sorted((list(p) for p in (emitted - pairs_before).elements()), key=repr)
        pairs_before = emitted
    return best, pairs


def crash_and_resume(root: Path) -> dict:
    """Kill the driver at each of :data:`CRASHES` in turn, then resume it to the end."""
    for crash in CRASHES:
        result = run_driver(root, root / "out.json", crash)
        assert result.returncode == -9, (crash, result.stderr[-3000:])
        wait_for_service_exit(root / "state")
    result = run_driver(root, root / "out.json", STORE_KILL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((root / "local").glob("crashed-*")), "the store service was not killed"
    return json.loads((root / "out.json").read_text())


def test_crashes_then_resume_equal_the_reference_epoch_by_epoch(tmp_path):
    got = crash_and_resume(tmp_path)
    best, pairs = expected()
    assert got["best"] == best
    assert got["join"] == pairs
    assert got["workers"] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert got["late"] > 0  # the late records were counted, not silently dropped
