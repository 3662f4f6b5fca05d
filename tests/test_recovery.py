"""Durable epochs: SIGKILL at every phase of a migrating epoch loses and repeats nothing.

Two kinds of kill: the whole pipeline (driver, JVM, Python workers; a restart resumes it) and
the store service that holds the workers' state (the pipeline lives on: the epoch's job runs
again against a new service), both in the same chains of runs. Each kind hits every phase of
:data:`PHASES` (the pipeline's ``apply``, ``collect`` and ``commit`` in
tests/test_groups_recovery.py), with a hot key split across workers (dual mode) all along.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

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


def run_driver(state_dir: Path, strategy: str, out: Path, crash_at: str | None,
               checkpoint: str | None = None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEGAPHONE_LOCAL_DIR": local_dir(state_dir)}
    env.pop("MEGAPHONE_CRASH_AT", None)
    if crash_at:
        env["MEGAPHONE_CRASH_AT"] = crash_at
    extra = [] if checkpoint is None else [checkpoint]
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.crash_driver", str(state_dir), strategy, str(out),
         *extra],
        cwd=ROOT, env=env, start_new_session=True, capture_output=True, text=True, timeout=300,
    )


def local_dir(state_dir: Path) -> str:
    """The store service's directory of one chain (each chain has its own service)."""
    return str(state_dir.parent / "local")


# A crash at each phase of a migrating epoch, chained: every restart resumes the previous
# crash and then dies at the next phase. all-at-once moves every bin at epoch 2, as rows; fluid
# moves one bin per epoch at epochs 2-5, as files, so its crashes hit successive migration
# steps and every phase of a file's transfer (written and shipped, received in part,
# ingested). Together the chains cover every phase but ``apply``, ``collect`` and ``commit``;
# the transfer's phases (export, install) are killed both as rows and as files, the others
# once. ``apply``, ``collect`` and ``commit`` are killed in tests/test_groups_recovery.py: an
# epoch runs as a group of one, so a crash there takes the group's path. Each chain is a test
# of its own (the suite's test processes run them side by side). Chain: (strategy, crashes).
CHAINS = {
    "all-at-once": ("all-at-once", ["admit:2", "submit:2", "export:2", "install:2"]),
    "fluid": ("fluid", ["export:2", "receive:2", "layout:3", "install:3", "cleanup:4"]),
}
# Kills of the store service (each fires once): the epoch's job fails, runs again, and the
# result must still equal a run without them. They ride along in the runs of the chains, each
# in a run that goes on to commit its epoch before that run's own crash (a later rollback
# would otherwise undo, and so hide, what the rerun did), and at most two fall inside one
# epoch's job, so its retries are not used up. Each strategy's kills hit every phase.
STORE_KILLS = {
    "all-at-once": ["admit:1", "export:2", "install:2", "layout:3", "apply:3", "submit:4",
                    "collect:4", "commit:5", "cleanup:5"],
    "fluid": ["cleanup:1", "export:2", "receive:2", "layout:2", "install:3", "admit:3",
              "apply:4", "collect:4", "submit:5", "commit:5"],
}


def store_kills_per_run(chain: str) -> list[list[str]]:
    """The store kills of each run of ``chain`` (its crashes, then the resume): a kill goes to
    the first run that passes its point and then commits its epoch."""
    crashes = [tuple(p.split(":")) for p in CHAINS[chain][1]]
    runs: list[list[str]] = [[] for _ in range(len(crashes) + 1)]
    done = -1  # the last epoch committed before the run
    for run, crash in enumerate([*crashes, None]):
        # a crash at cleanup comes after its epoch's commit
        last = int(crash[1]) - (crash[0] != "cleanup") if crash else float("inf")
        for kill in STORE_KILLS[chain]:
            epoch = int(kill.split(":")[1])
            if done < epoch <= last and not any(kill in r for r in runs):
                runs[run].append(kill)
        done = max(done, last) if crash else done
    return runs


def test_the_crash_chains_cover_every_phase():
    from tests.test_groups_recovery import CHAIN as GROUP_CHAIN

    killed = {p.split(":")[0] for _, points in CHAINS.values() for p in points}
    assert killed | {p.split(":")[0] for p in GROUP_CHAIN} == set(PHASES)
    for strategy in ("all-at-once", "fluid"):  # all-at-once (rows) kills mid-export
        chains = [c for c, (s, _) in CHAINS.items() if s == strategy]
        kills = {p.split(":")[0] for c in chains for p in STORE_KILLS[c]}
        assert kills >= set(PHASES) - {"receive"}, strategy
    assert "receive" in {p.split(":")[0] for p in STORE_KILLS["fluid"]}
    for chain, points in STORE_KILLS.items():
        runs = store_kills_per_run(chain)
        assert sorted(k for run in runs for k in run) == sorted(points), chain


def wait_for_service_exit(state_dir: Path, timeout: float = IDLE_EXIT_S + 15) -> None:
    """The store services of a crashed pipeline must end by themselves: at once when the
    executor that started or used them is gone (also one the crash left before its first
    connection), at the latest after IDLE_EXIT_S without a store or a connection."""
    deadline = time.monotonic() + timeout
    while service_pids(local_dir(state_dir)):
        assert time.monotonic() < deadline, "the store service outlived its crashed pipeline"
        time.sleep(0.2)


def crash_and_resume(tmp_path: Path, chain: str) -> dict:
    """Run ``chain``'s crashes, then a clean resume, the store kills riding along
    (:func:`store_kills_per_run`); return the resume's results."""
    strategy, crashes = CHAINS[chain]
    state_dir, out = tmp_path / chain / "state", tmp_path / chain / "out.json"
    state_dir.parent.mkdir()
    kills = store_kills_per_run(chain)
    for crash_at, store in zip(crashes, kills, strict=False):
        result = run_driver(state_dir, strategy, out,
                            ",".join([crash_at, *(f"{p}:store" for p in store)]))
        assert result.returncode == -9, (crash_at, result.stderr[-3000:])  # it did crash there
        assert not out.exists()
        wait_for_service_exit(state_dir)
    result = run_driver(state_dir, strategy, out, ",".join(f"{p}:store" for p in kills[-1]))
    assert result.returncode == 0, result.stderr[-3000:]
    fired = sorted(p.name for p in Path(local_dir(state_dir)).glob("crashed-*"))
    assert len(fired) == len(STORE_KILLS[chain]), fired  # every store kill happened
    return json.loads(out.read_text())


@pytest.mark.parametrize("chain", CHAINS)
def test_crash_at_every_phase_then_resume_equals_a_run_without_crash(tmp_path, chain):
    got = crash_and_resume(tmp_path, chain)
    assert (got["outputs"], got["state"]) == reference()
    assert got["workers"] == [0, 1, 2, 3]
    assert (got["files_in"] > 0) == (CHAINS[chain][0] == "fluid")  # files or rows
    assert got["split_records"] > 0  # the hot key was split (dual mode)
    # The resumes kill the store inside epochs' jobs, which ran again (a kill between jobs, at
    # a driver's phase, may just leave the next task to start a service).
    assert got["job_attempts"] > EPOCHS


def test_store_kills_while_bins_move_home_to_home_rerun_the_epoch(tmp_path):
    """A checkpointed pipeline's fluid plan moves its bins home to home (docs/placement.md,
    step 7; tests/test_handoff.py has the services' side). Every store service is killed once
    after a file was kept (``export``) and once before one was pulled (``receive``: the
    restarted service no longer keeps it): each epoch's job runs again, and the outputs and
    state equal a run without kills."""
    state_dir, out = tmp_path / "state", tmp_path / "out.json"
    result = run_driver(state_dir, "fluid", out, "export:2:store,receive:3:store",
                        checkpoint=str(tmp_path / "checkpoint"))
    assert result.returncode == 0, result.stderr[-3000:]
    fired = sorted(p.name for p in Path(local_dir(state_dir)).glob("crashed-*"))
    assert fired == ["crashed-export-2", "crashed-receive-3"]
    got = json.loads(out.read_text())
    assert (got["outputs"], got["state"]) == reference()
    assert got["h2h_bytes"] > 0 and got["job_attempts"] > EPOCHS
