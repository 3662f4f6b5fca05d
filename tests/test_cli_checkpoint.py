"""The planner CLI on a stopped pipeline with a checkpoint location: inspect reads the
workers' bin sizes from the durable copy, plan writes a plan, migrate applies it step by step
into the durable copy, and the reopened pipeline has the moved routing and exact state."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from megaphone.cli import main
from megaphone.migrator.pipeline.facade import Pipeline
from megaphone.migrator.statedir.registry import running_pipeline
from megaphone.plans.plan import MigrationPlan

REPO = Path(__file__).resolve().parents[1]
BATCHES = [[i % 300 for i in range(800)], [i % 450 for i in range(500)]]
EXTRA = [i % 500 for i in range(350, 700)]


def open_pipeline(spark, state_dir: Path, checkpoint: str, **kw) -> Pipeline:
    return Pipeline(spark, str(state_dir), key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", checkpoint=checkpoint, snapshot_every=2, **kw)


def feed(spark, pipe: Pipeline, keys: list[int]) -> None:
    pipe.process(spark.createDataFrame([(k,) for k in keys], "k long"))


def stop(pipe: Pipeline) -> None:
    pipeline_id = pipe.fingerprint.pipeline_id
    pipe.close()
    del pipe
    gc.collect()
    assert running_pipeline(pipeline_id) is None, "the pipeline must be stopped"


def cli(capsys, *argv) -> tuple[int, str, str]:
    """Run ``megaphone ARGV`` in-process; return (exit code, stdout, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def digest(path: Path) -> dict[str, str]:
    """SHA-256 of every file under ``path``, by relative path."""
    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in path.rglob("*") if f.is_file()}


def state_of(pipe: Pipeline) -> dict[int, int]:
    return {r["k"]: r["state"] for r in pipe.state().collect()}


def test_inspect_plan_migrate_a_checkpointed_pipeline(spark, tmp_path, capsys):
    state_dir = tmp_path / "state"
    checkpoint = (tmp_path / "checkpoint").as_uri()
    pipe = open_pipeline(spark, state_dir, checkpoint)
    for keys in BATCHES:
        feed(spark, pipe, keys)
    stop(pipe)
    expected = Counter(k for keys in BATCHES for k in keys)

    code, out, err = cli(capsys, "inspect", "--state-dir", state_dir, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["workers"] == [0, 1] and info["keys"] == len(expected)
    assert sum(d["bins"] for d in info["per_worker"].values()) == 16

    plan_path = tmp_path / "plan.json"
    code, out, err = cli(capsys, "plan", "--state-dir", state_dir, "--workers", 3,
                         "--strategy", "batched", "-o", plan_path)
    assert code == 0, err
    plan = MigrationPlan.load(plan_path)
    assert plan.meta["workers_after"] == [0, 1, 2] and len(plan.steps) > 1

    # A running pipeline holds the lock: inspect refuses, and nothing changes.
    before = digest(tmp_path / "checkpoint")
    pipe = open_pipeline(spark, state_dir, checkpoint)
    try:
        code, out, err = cli(capsys, "inspect", "--state-dir", state_dir)
        assert code == 2 and "running pipeline" in err and "Pipeline.bin_sizes" in err
    finally:
        stop(pipe)
    assert digest(tmp_path / "checkpoint") == before

    code, out, err = cli(capsys, "migrate", plan_path, "--state-dir", state_dir)
    assert code == 0, err
    assert f"migrated {len(plan.moves)} bins" in out
    code, out, err = cli(capsys, "inspect", "--state-dir", state_dir, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["workers"] == [0, 1, 2] and info["keys"] == len(expected)
    assert info["state_version"] == plan.end_version and info["plans_in_flight"] == []

    # Back to two workers: worker 2 gives away its last bins and leaves the commit (and its
    # durable copy); inspect reads the workers that remain.
    code, out, err = cli(capsys, "plan", "--state-dir", state_dir, "--workers", 2,
                         "--strategy", "fluid", "-o", plan_path)
    assert code == 0, err
    plan = MigrationPlan.load(plan_path)
    assert {m.src for m in plan.moves} == {2}
    code, out, err = cli(capsys, "migrate", plan_path, "--state-dir", state_dir)
    assert code == 0, err
    code, out, err = cli(capsys, "inspect", "--state-dir", state_dir, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["workers"] == [0, 1] and info["keys"] == len(expected)

    # Another host (no state directory, no working copies) opens it from the checkpoint alone.
    elsewhere = tmp_path / "elsewhere"
    pipe = open_pipeline(spark, elsewhere / "state", checkpoint,
                         local_dir=str(elsewhere / "host"))
    try:
        assert pipe.routing.workers() == [0, 1]
        assert pipe.routing.version == plan.end_version
        assert state_of(pipe) == expected, "every key's state is unchanged"
        feed(spark, pipe, EXTRA)
        assert state_of(pipe) == expected + Counter(EXTRA)
        assert pipe.routing.workers() == [0, 1]
    finally:
        stop(pipe)


def test_a_crash_mid_migration_leaves_what_a_crashed_epoch_leaves(spark, tmp_path, capsys):
    """``megaphone migrate`` killed in the middle of its second step's commit: the reopened
    pipeline (on another host) discards that step's leftovers and its state stays exact."""
    state_dir = tmp_path / "state"
    checkpoint = (tmp_path / "checkpoint").as_uri()
    pipe = open_pipeline(spark, state_dir, checkpoint)
    for keys in BATCHES:
        feed(spark, pipe, keys)
    committed = pipe.epoch
    stop(pipe)
    expected = Counter(k for keys in BATCHES for k in keys)
    plan_path = tmp_path / "plan.json"
    code, _, err = cli(capsys, "plan", "--state-dir", state_dir, "--workers", 3,
                       "--strategy", "fluid", "-o", plan_path)
    assert code == 0, err
    assert len(MigrationPlan.load(plan_path).steps) > 2

    result = subprocess.run(
        [sys.executable, "-m", "megaphone", "migrate", str(plan_path), "--state-dir",
         str(state_dir), "--no-progress"],
        capture_output=True, text=True, cwd=REPO, timeout=120, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO),
             "MEGAPHONE_CRASH_AT": f"commit:{committed + 2}"})
    assert result.returncode == -signal.SIGKILL, result.stderr

    elsewhere = tmp_path / "elsewhere"
    pipe = open_pipeline(spark, elsewhere / "state", checkpoint,
                         local_dir=str(elsewhere / "host"))
    try:
        assert pipe.epoch == committed + 1, "the first step committed, the second did not"
        assert state_of(pipe) == expected
        feed(spark, pipe, EXTRA)
        assert state_of(pipe) == expected + Counter(EXTRA)
    finally:
        stop(pipe)
