"""Durable epochs: SIGKILL at every phase of a migrating epoch loses and repeats nothing.

Two kinds of kill: the whole pipeline (driver, JVM, Python workers; a restart resumes it) and
the store service that holds the workers' state (the pipeline lives on: the epoch's job runs
again against a new service). Each kind hits every phase of :data:`PHASES`, with a hot key split
across workers (dual mode) all along.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from megaphone.migrator.epoch.run import PHASES
from megaphone.state_backends.remote import service_pids
from megaphone.state_backends.service import IDLE_EXIT_S
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
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEGAPHONE_LOCAL_DIR": local_dir(state_dir)}
    env.pop("MEGAPHONE_CRASH_AT", None)
    if crash_at:
        env["MEGAPHONE_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.crash_driver", str(state_dir), strategy, str(out)],
        cwd=ROOT, env=env, start_new_session=True, capture_output=True, text=True, timeout=300,
    )


def local_dir(state_dir: Path) -> str:
    """The store service's directory of one chain (each chain has its own service)."""
    return str(state_dir.parent / "local")


# A crash at each phase of a migrating epoch, chained: every restart resumes the previous
# crash and then dies at the next phase. all-at-once moves every bin at epoch 2, as rows; fluid
# moves one bin per epoch at epochs 2-5, as files, so its crashes hit successive migration
# steps and every phase of a file's transfer (written and shipped, received in part,
# ingested). Together the two chains cover every phase; the transfer's phases (export,
# install) are killed in both, as rows and as files, the others once, split so the chains
# (side by side) take about as long: each restart costs a JVM start.
CHAINS = {
    "all-at-once": ["admit:2", "submit:2", "export:2", "install:2", "collect:2", "commit:2"],
    "fluid": ["export:2", "receive:2", "layout:3", "install:3", "apply:4", "cleanup:4",
              "commit:5"],
}
# Kills of the store service, all in one run of the driver (each fires once): the epoch's job
# fails, runs again, and the result must still equal a run without them. At most two kills
# fall inside one epoch's job, so its retries are not used up.
STORE_KILLS = {
    "all-at-once": ["admit:1", "export:2", "install:2", "layout:3", "apply:3", "submit:4",
                    "collect:4", "commit:5", "cleanup:5"],
    "fluid": ["export:2", "receive:2", "layout:2", "install:3", "admit:3", "apply:4",
              "collect:4", "submit:5", "commit:5", "cleanup:1"],
}


def test_the_crash_chains_cover_every_phase():
    assert {p.split(":")[0] for points in CHAINS.values() for p in points} == set(PHASES)
    for strategy, points in STORE_KILLS.items():  # all-at-once (rows) kills mid-export
        assert {p.split(":")[0] for p in points} >= set(PHASES) - {"receive"}, strategy
    assert "receive" in {p.split(":")[0] for p in STORE_KILLS["fluid"]}


def wait_for_service_exit(state_dir: Path, timeout: float = IDLE_EXIT_S + 15) -> None:
    """The store services of a crashed pipeline must end by themselves: at once when the
    executor they served is gone, at the latest after IDLE_EXIT_S without a store or a
    connection (a service the crash left without ever opening a store)."""
    deadline = time.monotonic() + timeout
    while service_pids(local_dir(state_dir)):
        assert time.monotonic() < deadline, "the store service outlived its crashed pipeline"
        time.sleep(0.2)


def crash_and_resume(tmp_path: Path, strategy: str) -> dict:
    """Run the chain of crashes for ``strategy``, then a clean resume; return its results."""
    state_dir, out = tmp_path / strategy / "state", tmp_path / strategy / "out.json"
    state_dir.parent.mkdir()
    for crash_at in CHAINS[strategy]:
        result = run_driver(state_dir, strategy, out, crash_at)
        assert result.returncode == -9, (crash_at, result.stderr[-3000:])  # it did crash there
        assert not out.exists()
        wait_for_service_exit(state_dir)
    result = run_driver(state_dir, strategy, out, None)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def kill_stores(tmp_path: Path, strategy: str) -> dict:
    """One run of the driver whose store service is killed at every phase."""
    state_dir, out = tmp_path / f"{strategy}-store" / "state", \
        tmp_path / f"{strategy}-store" / "out.json"
    state_dir.parent.mkdir()
    kills = ",".join(f"{p}:store" for p in STORE_KILLS[strategy])
    result = run_driver(state_dir, strategy, out, kills)
    assert result.returncode == 0, result.stderr[-3000:]
    fired = sorted(p.name for p in Path(local_dir(state_dir)).glob("crashed-*"))
    assert len(fired) == len(STORE_KILLS[strategy]), fired  # every kill happened
    return json.loads(out.read_text())


def test_crash_at_every_phase_then_resume_equals_a_run_without_crash(tmp_path):
    # The chains run side by side: each restart is mostly JVM start-up, not CPU.
    jobs = [(crash_and_resume, s) for s in sorted(CHAINS)] + \
        [(kill_stores, s) for s in sorted(STORE_KILLS)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        runs = {(f.__name__, s): pool.submit(f, tmp_path, s) for f, s in jobs}
        results = {key: run.result() for key, run in runs.items()}
    expected_outputs, expected_state = reference()
    for (kind, strategy), got in results.items():
        strategy = f"{kind} {strategy}"
        assert got["outputs"] == expected_outputs, strategy
        assert got["state"] == expected_state, strategy
        assert got["workers"] == [0, 1, 2, 3], strategy
        assert (got["files_in"] > 0) == strategy.endswith("fluid"), strategy  # files or rows
        assert got["split_records"] > 0, strategy  # the hot key was split (dual mode)
        if kind == "crash_and_resume":
            # The last crash hit the commit write: every worker had applied the epoch, so the
            # resume rolled all of them back to the last commit before running it again.
            assert got["rolled_back"] == [0, 1, 2, 3], strategy
        else:  # the driver never died: nothing to roll back, the epochs were rerun instead
            assert got["rolled_back"] == [] and got["job_attempts"] > EPOCHS, strategy
