"""Event-time operators survive crashes: a chain of a window and an aggregate, and a
left-outer join, each migrating, killed at the phases of migrating epochs (and between the
chain's stages), resumed, give exactly the outputs of a run without crashes, and those equal
the plain-Python references."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
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
# Pipeline kills at phases of migrating epochs (the plans run at epochs 2-6), then a kill
# between the chain's stages; the resume then loses its store service in the middle of an
# epoch (its job runs again: workers that committed replay, and must report the same largest
# event time, or the next watermark and the outputs would differ).
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


def expected() -> tuple[dict, Counter]:
    """What the chain (max of window sums per closed window) and the join must output."""
    t0 = int(EPOCH0.timestamp()) * SECOND
    epochs = [[(k, t0 + s * SECOND, v) for k, s, v in window_records(e)]
              for e in range(EPOCHS)]
    sums, closed, _ = window_reference(epochs, WINDOW_US, WINDOW_US, "sum", 0)
    best: dict[int, int] = {}
    for key, end in closed:
        best[end] = max(best.get(end, sums[(key, end)]), sums[(key, end)])
    joins = [[(k, s * SECOND, side, x) for k, s, side, x in join_records(e)]
             for e in range(EPOCHS)]
    pairs, _ = join_reference(joins, "left", within=WITHIN_US)
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


def test_crashes_then_resume_equal_a_run_without_crash_and_the_reference(tmp_path):
    # The crashed chain and the clean run go side by side: restarts are mostly JVM start-up.
    with ThreadPoolExecutor(1) as pool:
        crashed = pool.submit(crash_and_resume, tmp_path / "crashed")
        clean = tmp_path / "clean"
        result = run_driver(clean, clean / "out.json", None)
        assert result.returncode == 0, result.stderr[-3000:]
        want = json.loads((clean / "out.json").read_text())
        got = crashed.result()
    best, pairs = expected()
    got_best = {end: v for rows in want["best"].values() for end, v in rows}
    assert got_best == best
    got_pairs = Counter((k, x, y) for rows in want["join"].values() for k, x, y in rows)
    assert got_pairs == pairs
    assert want["workers"] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert want["late"] > 0  # the late records were counted, not silently dropped
    assert got["best"] == want["best"] and got["join"] == want["join"]
