"""The planner CLI end to end on a small real state directory: inspect, plan, migrate, errors."""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from megaphone import migrate_cmd, rescale
from megaphone.cli import main
from megaphone.migrator.pipeline.facade import Pipeline
from megaphone.migrator.statedir.commit import StreamPosition
from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.statedir.registry import running_pipeline
from megaphone.plans.plan import MigrationPlan, PlanError, PlanStep
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move
from megaphone.state_backends import open_backend

REPO = Path(__file__).resolve().parents[1]
BATCHES = [[f"k{i % 600}" for i in range(1500)], [f"k{i % 900}" for i in range(700)]]


def open_pipeline(spark, state_dir: Path) -> Pipeline:
    return Pipeline(spark, str(state_dir), key="k", update="count", workers=2, num_bins=64)


def feed(spark, pipe: Pipeline, keys: list[str]) -> None:
    pipe.process(spark.createDataFrame([(k,) for k in keys], "k string"))


@pytest.fixture(scope="module")
def state_dir(spark, tmp_path_factory) -> Path:
    """A stopped two-worker word count over 64 bins with two epochs of state."""
    path = tmp_path_factory.mktemp("cli") / "state"
    pipe = open_pipeline(spark, path)
    for keys in BATCHES:
        feed(spark, pipe, keys)
    pipeline_id = pipe.fingerprint.pipeline_id
    del pipe
    gc.collect()
    assert running_pipeline(pipeline_id) is None, "the pipeline must be stopped"
    return path


def read_state(path: Path) -> dict[str, int]:
    """Every key's state, read straight from each worker's backend over the bins it owns."""
    state = StateDir.open(path)
    routing = state.load_routing()
    out: dict[str, int] = {}
    for w in routing.workers():
        backend = open_backend(state.manifest["backend"], state.paths.worker(w), "str", 64,
                               read_only=True)
        try:
            for _, key, value in backend.items(routing.bins_of(w).tolist()):
                assert key not in out, f"key {key} is owned twice"
                out[key] = value
        finally:
            backend.close()
    return out


def digest(path: Path) -> dict[str, str]:
    """SHA-256 of every file under ``path``, by relative path."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = Path(root) / name
            out[str(full.relative_to(path))] = hashlib.sha256(full.read_bytes()).hexdigest()
    return out


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``megaphone ARGV`` in-process; return (exit code, stdout, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_plan_migrate_inspect(spark, state_dir, tmp_path, capsys):
    expected = Counter(k for keys in BATCHES for k in keys)
    assert read_state(state_dir) == expected

    code, out, _ = cli(capsys, "inspect", "--state-dir", state_dir)
    assert code == 0
    assert "workers     2: 0, 1" in out and "update count, backend rocksdb" in out
    assert "committed   epoch 1" in out and "in flight   no plan" in out
    code, out, _ = cli(capsys, "inspect", "--state-dir", state_dir, "--json")
    info = json.loads(out)
    assert info["workers"] == [0, 1] and info["keys"] == len(expected)
    assert sum(d["bins"] for d in info["per_worker"].values()) == 64

    plan_path = tmp_path / "plan.json"
    code, out, err = cli(capsys, "plan", "--state-dir", state_dir, "--workers", 4,
                         "--strategy", "batched", "-o", plan_path)
    assert code == 0, err
    print(out, file=sys.__stdout__)  # the sample summary for the README, visible with -s
    assert "2 -> 4 workers, balanced by keys, batched (1 bin per worker per step)" in out
    assert "default rate: no epoch has moved state yet" in out
    plan = MigrationPlan.load(plan_path)
    assert plan.strategy == "batched" and plan.meta["workers_after"] == [0, 1, 2, 3]
    assert f"moves       {len(plan.moves)} of 64 bins" in out
    for step in plan.steps:
        assert len({m.src for m in step.moves}) == len(step.moves)
        assert len({m.dst for m in step.moves}) == len(step.moves)

    code, out, err = cli(capsys, "migrate", plan_path, "--state-dir", state_dir)
    assert code == 0, err
    assert f"migrated {len(plan.moves)} bins" in out and "routing version 0 ->" in out
    assert "error" not in err  # stderr holds at most the progress bar

    result = subprocess.run(
        [sys.executable, "-m", "megaphone", "inspect", "--state-dir", str(state_dir), "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["workers"] == [0, 1, 2, 3]
    assert info["routing"]["version"] == plan.end_version
    assert info["state_version"] == plan.end_version and info["plans_in_flight"] == []
    keys = [d["keys"] for d in info["per_worker"].values()]
    assert max(keys) <= 1.1 * len(expected) / 4
    assert read_state(state_dir) == expected, "every key's state is unchanged"

    # A pipeline open in this process gets the plan submitted instead and runs it live.
    pipe = open_pipeline(spark, state_dir)
    try:
        live_plan = tmp_path / "live.json"
        code, out, err = cli(capsys, "plan", "--state-dir", state_dir, "--workers", 3,
                             "--strategy", "all-at-once", "-o", live_plan)
        assert code == 0, err
        code, out, err = cli(capsys, "migrate", live_plan, "--state-dir", state_dir)
        assert code == 0, err
        assert "running in this process" in out
        extra = [f"k{i}" for i in range(850, 1000)]
        feed(spark, pipe, extra)
        assert pipe.routing.workers() == [0, 1, 2]
    finally:
        pipeline_id = pipe.fingerprint.pipeline_id
        del pipe
        gc.collect()
    assert running_pipeline(pipeline_id) is None
    code, out, _ = cli(capsys, "inspect", "--state-dir", state_dir)
    assert "workers     3: 0, 1, 2" in out
    assert read_state(state_dir) == expected + Counter(extra)


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_errors_exit_2_with_one_line_and_change_nothing(state_dir, tmp_path, capsys):
    state = StateDir.open(state_dir)
    table = state.load_routing()
    fp = state.fingerprint
    owner = int(table.owner(0))
    good_move = Move(0, owner, (owner + 1) % 5)
    stale = MigrationPlan(fp, table.version + 1, (PlanStep(0, (good_move,)),))
    other = MigrationPlan(Fingerprint("someone-else", 64, "str"), table.version,
                          (PlanStep(0, (good_move,)),))
    not_owner = next(w for w in table.workers() if w != owner)
    bad_move = MigrationPlan(fp, table.version, (PlanStep(0, (Move(0, not_owner, owner),)),))
    stale.save(tmp_path / "stale.json")
    other.save(tmp_path / "other.json")
    bad_move.save(tmp_path / "bad_move.json")
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "plain").mkdir()
    missing_bins = write_json(tmp_path / "target.json", {"3": 1, "64": 0, "100": 1})
    out_plan = tmp_path / "never.json"
    sd = str(state_dir)

    cases = [
        (["inspect", "--state-dir", tmp_path / "nope"], "does not exist"),
        (["plan", "--state-dir", tmp_path / "plain", "--workers", 2, "--strategy", "fluid",
          "-o", out_plan], "has no megaphone.json"),
        (["plan", "--state-dir", sd, "--target", missing_bins, "--strategy", "fluid",
          "-o", out_plan], "target names bins that do not exist: 64, 100 (bins are 0..63)"),
        (["plan", "--state-dir", sd, "--target", tmp_path / "absent.json", "--strategy",
          "fluid", "-o", out_plan], "target file not found"),
        (["plan", "--state-dir", sd, "--workers", 4, "--strategy", "fluid", "--per-worker", 2,
          "-o", out_plan], "--per-worker applies only to --strategy batched"),
        (["plan", "--state-dir", sd, "--workers", 9999, "--strategy", "fluid", "-o", out_plan],
         "workers must be in 1..4096"),
        (["migrate", tmp_path / "other.json", "--state-dir", sd],
         "belongs to another pipeline: pipeline_id is 'someone-else'"),
        (["migrate", tmp_path / "stale.json", "--state-dir", sd], "stale plan"),
        (["migrate", tmp_path / "bad_move.json", "--state-dir", sd],
         "is not the owner at that point"),
        (["migrate", tmp_path / "garbage.json", "--state-dir", sd], "plan is not valid JSON"),
        (["migrate", tmp_path / "absent.json", "--state-dir", sd], "cannot read plan"),
    ]
    before = digest(state_dir)
    for argv, message in cases:
        code, out, err = cli(capsys, *argv)
        assert code == 2, (argv, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith(f"megaphone {argv[0]}: error: ") and message in lines[0], err
        assert digest(state_dir) == before, f"{argv} changed the state directory"
    assert not out_plan.exists()

    usage = [
        ["plan", "--state-dir", sd, "--strategy", "fluid"],  # neither --workers nor --target
        ["plan", "--state-dir", sd, "--workers", 2, "--target", missing_bins,
         "--strategy", "fluid"],
        ["plan", "--state-dir", sd, "--workers", 0, "--strategy", "fluid"],
        ["plan", "--state-dir", sd, "--workers", 2, "--strategy", "sideways"],
        ["plan", "--state-dir", sd, "--workers", 2, "--strategy", "fluid", "--gap", -1],
        ["migrate", "--state-dir", sd],
    ]
    for argv in usage:
        code, _, err = cli(capsys, *argv)
        assert code == 2 and "usage: megaphone" in err, (argv, err)
    assert digest(state_dir) == before


def test_versions_past_the_commit_are_planned_around(state_dir, tmp_path, capsys):
    """A crash can leave routing versions past the commit; plans start from the committed one."""
    copy = tmp_path / "crashed"
    shutil.copytree(state_dir, copy, ignore=shutil.ignore_patterns(".lock"))
    state = StateDir.open(copy)
    commit = state.read_commit()
    committed = commit.state_version
    table = state.load_routing()
    owner = table.owner(5)
    next_epoch = max(table.latest_epoch, commit.epoch + 1)  # the epoch that never committed
    table.apply_step([Move(5, owner, owner + 1)], next_epoch)
    table.save(state.paths.routing)  # as if the process died before the epoch committed

    code, out, _ = cli(capsys, "inspect", "--state-dir", copy)
    assert code == 0 and "1 routing version past the last commit" in out
    workers = len(StateDir.open(state_dir).load_routing().workers()) + 1
    plan = rescale(copy, workers=workers, strategy="batched")
    assert plan.base_version == committed
    plan.save(tmp_path / "p.json")
    expected = read_state(state_dir)
    code, out, err = cli(capsys, "migrate", tmp_path / "p.json", "--state-dir", copy,
                         "--no-progress")
    assert code == 0, err
    assert StateDir.open(copy).load_routing().workers() == list(range(workers))
    assert read_state(copy) == expected


def test_deadline_plan_is_adaptive_and_runs_offline_at_once(state_dir, tmp_path, capsys):
    copy = tmp_path / "state"
    shutil.copytree(state_dir, copy)
    before = read_state(copy)
    plan_path = tmp_path / "deadline.json"
    code, out, err = cli(capsys, "plan", "--state-dir", copy, "--workers", 3, "--strategy",
                         "deadline", "--target-latency", 1.5, "-o", plan_path)
    assert code == 0, err
    assert "deadline (target latency 1.5 s)" in out and "decided live" in out
    plan = MigrationPlan.load(plan_path)
    assert plan.adaptive and plan.policy["target_latency_s"] == 1.5
    code, out, err = cli(capsys, "migrate", plan_path, "--state-dir", copy)
    assert code == 0, err
    assert read_state(copy) == before

    for argv in (["--strategy", "fluid", "--target-latency", "2"], ["--strategy", "deadline"]):
        code, _, err = cli(capsys, "plan", "--state-dir", copy, "--workers", 2, *argv)
        assert code == 2 and "--target-latency is needed by, and only used by" in err


def test_offline_scale_in_runs_epochs_that_release_the_idle_workers(state_dir, tmp_path, capsys):
    """Offline steps are epochs without records: each commits, the old owners drop what left
    them, and workers left without bins give their storage back."""
    copy = tmp_path / "state"
    shutil.copytree(state_dir, copy, ignore=shutil.ignore_patterns(".lock"))
    before = read_state(copy)
    state = StateDir.open(copy)
    commit = state.read_commit()
    epoch = commit.epoch
    commit.stream = StreamPosition("/elsewhere", 7)  # as if a stream ran last
    state.write_commit(commit)
    plan = rescale(copy, workers=1, strategy="batched")
    plan.save(tmp_path / "in.json")
    code, _, err = cli(capsys, "migrate", tmp_path / "in.json", "--state-dir", copy,
                         "--no-progress")
    assert code == 0, err
    state = StateDir.open(copy)
    commit = state.read_commit()
    workers = state.load_routing().workers()
    assert len(workers) == 1 and state.worker_ids() == workers
    assert commit.pending_drops == [] and commit.state_version == plan.end_version
    assert commit.epoch == epoch + len(plan.steps) + 1  # one epoch per step, then the drops
    # the stream's last batch still maps to the epoch that ran it, for its replay
    assert commit.stream == StreamPosition("/elsewhere", 7, epoch)
    assert state.output_epochs() == StateDir.open(state_dir).output_epochs()  # none written
    assert read_state(copy) == before


def test_a_plan_at_the_current_layout_moves_nothing_and_exits_0(state_dir, tmp_path, capsys):
    """`megaphone plan` to the layout in place writes an empty plan; `migrate` accepts it,
    says so and changes nothing (a script doing `plan && migrate` must not fail)."""
    copy = tmp_path / "state"
    shutil.copytree(state_dir, copy, ignore=shutil.ignore_patterns(".lock"))
    (copy / ".lock").touch()  # as any migrate leaves it (it takes the lock, then releases it)
    owners = StateDir.open(copy).load_routing().owners().tolist()
    target = write_json(tmp_path / "same.json", owners)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text("an old plan, overwritten")
    before = digest(copy)
    code, out, err = cli(capsys, "plan", "--state-dir", copy, "--target", target,
                         "--strategy", "fluid", "-o", plan_path)
    assert code == 0, err
    assert "moves       nothing: the layout already matches" in out
    assert f"nothing to move: wrote {plan_path}" in out
    plan = MigrationPlan.load(plan_path)
    assert plan.empty and plan.steps == ()
    code, out, err = cli(capsys, "migrate", plan_path, "--state-dir", copy)
    assert code == 0, err
    assert "nothing to move: the plan moves no bin" in out and err == ""
    assert digest(copy) == before, "the state directory is untouched"
    # A step without moves is as empty; a stale empty plan is still an error.
    (tmp_path / "steps.json").write_text(
        MigrationPlan(plan.fingerprint, plan.base_version, (PlanStep(0, ()),)).to_json())
    code, out, _ = cli(capsys, "migrate", tmp_path / "steps.json", "--state-dir", copy)
    assert code == 0 and "nothing to move" in out
    stale = MigrationPlan(plan.fingerprint, plan.base_version + 1, ())
    stale.save(tmp_path / "stale.json")
    code, _, err = cli(capsys, "migrate", tmp_path / "stale.json", "--state-dir", copy)
    assert code == 2 and "stale plan" in err
    # A pipeline running in another process is not even asked: nothing is posted to its inbox.
    args = argparse.Namespace(timeout=0.1, no_wait=False, no_progress=True)
    assert migrate_cmd._remote(StateDir.open(copy), plan, args) == 0
    with pytest.raises(PlanError, match="stale plan"):
        migrate_cmd._remote(StateDir.open(copy), stale, args)
    assert digest(copy) == before


def test_plan_at_the_current_worker_count_of_a_new_pipeline_moves_nothing(spark, tmp_path,
                                                                           capsys):
    path = tmp_path / "fresh"
    pipe = Pipeline(spark, str(path), key="k", update="count", workers=3, num_bins=64,
                    key_type="str")
    pipe.close()
    code, out, err = cli(capsys, "plan", "--state-dir", path, "--workers", 3, "--strategy",
                         "batched", "-o", tmp_path / "p.json")
    assert code == 0, err
    assert "3 -> 3 workers" in out and "nothing to move" in out
    assert MigrationPlan.load(tmp_path / "p.json").empty
    code, out, err = cli(capsys, "migrate", tmp_path / "p.json", "--state-dir", path)
    assert code == 0 and "nothing to move" in out, err
