"""Epoch traces from real pipeline runs, their retention, and ``megaphone explain`` on them:
the table, JSON, the plot, bad input, and a deliberately slowed worker ranked first."""

from __future__ import annotations

import json
import sys
import time
import uuid

import pytest
from pyspark import cloudpickle

from megaphone.cli import main
from megaphone.migrator import trace as trace_mod
from megaphone.migrator.pipeline import Pipeline
from megaphone.migrator.statedir import directory
from megaphone.migrator.statedir.directory import StateDir
from megaphone.plans.plan import MigrationPlan, Move
from megaphone.routing.bins import bin_of
from megaphone.routing.fingerprint import Fingerprint
from megaphone.snailtrail import EpochTrace

cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORKER_KINDS = {"schedule", "begin", "install", "apply", "commit", "output"}
DRIVER_KINDS = {"admit", "layout", "submit", "wait", "commit", "cleanup"}


def make(spark, tmp_path, **kw) -> Pipeline:
    kw.setdefault("update", "count")
    return Pipeline(spark, str(tmp_path / "state"), key="k", num_bins=16, key_type="int64",
                    pipeline_id=uuid.uuid4().hex, **kw)


@pytest.fixture(scope="module")
def migrated(spark, tmp_path_factory):
    """A pipeline of 2 workers that moved one bin each way in epoch 1, then ran epoch 2."""
    tmp_path = tmp_path_factory.mktemp("explain")
    pipe = make(spark, tmp_path)
    batch = spark.createDataFrame([(k,) for k in range(40)], "k long")
    pipe.process(batch)
    owners = pipe.routing.owners()
    moved = {b: (int(owners[b]), 1 - int(owners[b])) for b in (0, 1)}
    pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[Move(b, s, d)
                                                          for b, (s, d) in moved.items()]]))
    pipe.process(batch)
    pipe.process(batch)
    return pipe, moved


def test_each_epoch_has_a_valid_trace_with_the_expected_activities(migrated):
    pipe, moved = migrated
    traces = pipe.state_dir.read_traces()
    assert [t.epoch for t in traces] == [0, 1, 2]
    for t in traces:
        assert EpochTrace.from_json(t.to_json()) == t  # valid, through every check
        lines = t.timelines()
        assert {a.kind for a in lines[(None, 0)]} == DRIVER_KINDS
        for w in (0, 1):
            assert {a.kind for a in lines[(w, 0)]} >= WORKER_KINDS
        deps = {d.kind for d in t.dependencies}
        assert {"schedule", "comm"} <= deps
    moving = traces[1]
    by_id = {a.id: a for a in moving.activities}
    exports = [a for a in moving.activities if a.kind == "export"]
    assert sorted((a.bin, a.worker, a.lane) for a in exports) == sorted(
        (b, s, 1) for b, (s, _) in moved.items())
    shuffles = [(by_id[d.src], by_id[d.dst]) for d in moving.dependencies if d.kind == "shuffle"]
    assert sorted((src.bin, dst.worker, dst.kind) for src, dst in shuffles) == sorted(
        (b, d, "install") for b, (_, d) in moved.items())
    assert not any(a.kind == "export" for t in (traces[0], traces[2]) for a in t.activities)
    # The marks feed the trace and are not stored with the metrics.
    for record in pipe.metrics():
        for m in record["per_worker"].values():
            assert "marks" not in m and "export_spans" not in m


def test_traces_are_kept_in_two_chunks_at_most(tmp_path, monkeypatch):
    monkeypatch.setattr(directory, "TRACE_CHUNK", 3)
    state = StateDir.create(tmp_path / "state", Fingerprint("traces", 4, "int64"), 1,
                            {"backend": "memory"})
    for epoch in [*range(8), 7, 8, 9]:  # epoch 7 again: rolled back and run again
        state.append_trace(trace_mod.epoch_trace(epoch, {"admit": (epoch, epoch + 0.5)}, {}, {},
                                                 {}))
    assert [t.epoch for t in state.read_traces()] == [6, 7, 8, 9]
    with open(state.paths.traces, "a") as fh:
        fh.write('{"torn')  # a torn last line is skipped
    assert [t.epoch for t in state.read_traces()] == [6, 7, 8, 9]


def test_tracing_can_be_switched_off(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAPHONE_TRACE", "0")
    pipe = make(spark, tmp_path)
    pipe.process(spark.createDataFrame([(1,)], "k long"))
    assert pipe.state_dir.read_traces() == []
    assert main(["explain", "--state-dir", str(pipe.state_dir.path)]) == 2


def test_explain_prints_a_table_json_and_a_plot(migrated, tmp_path, capsys):
    pipe, moved = migrated
    state = str(pipe.state_dir.path)
    assert main(["explain", "--state-dir", state]) == 0
    text = capsys.readouterr().out
    assert "activity" in text and "CP" in text and "by kind:" in text and "by worker:" in text
    assert main(["explain", "--state-dir", state, "--epochs", "1:1", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["epochs"] == [1, 1]
    assert abs(sum(info["by_kind"].values()) - 1) < 1e-6
    assert {"export", "install", "apply"} <= set(info["by_kind"])
    assert set(info["by_bin"]) >= {str(b) for b in moved}
    out = tmp_path / "timeline.png"
    assert main(["explain", "--state-dir", state, "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--state-dir", "/nonexistent/megaphone"], "not a megaphone state directory"),
    (["--state-dir", "/"], "has no megaphone.json"),
    (["--epochs", "5:2"], "0 <= A <= B"),
    (["--epochs", "x"], "A:B"),
    (["--epochs", "100:"], "no traced epoch"),
])
def test_bad_input_is_one_line_and_exit_2(migrated, capsys, args, message):
    pipe, _ = migrated
    argv = ["explain", "--state-dir", str(pipe.state_dir.path), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_explain_ranks_a_slowed_workers_apply_first(spark, tmp_path, capsys):
    slow: set[int] = set()  # keys of worker 1, filled once the routing exists

    def f(key, values, state):
        if key in slow:
            time.sleep(0.25)
        return (state or 0) + len(values), [len(values)]

    pipe = make(spark, tmp_path, update=f, output_type="long")
    keys = list(range(40))
    batch = spark.createDataFrame([(k,) for k in keys], "k long")
    pipe.process(batch)  # epoch 0: no slow key yet
    owners = pipe.routing.owners()
    slow.update(k for k, b in zip(keys, bin_of(keys, 16), strict=True) if owners[b] == 1)
    slow.intersection_update(sorted(slow)[:10])
    assert len(slow) == 10
    pipe.process(batch)  # epoch 1: worker 1 sleeps 2.5 s in apply
    assert main(["explain", "--state-dir", str(pipe.state_dir.path), "--epochs", "1:1",
                 "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    first = info["top"][0]
    assert (first["kind"], first["worker"], first["role"]) == ("apply", 1, "recorded")
    assert next(iter(info["by_worker"])) == "1"
    assert next(iter(info["by_activity"])) == "apply w1"


def test_idle_time_between_epochs_is_reported_apart(spark, tmp_path, capsys):
    """A driver that waits for input between epochs is idle, not an epoch's bottleneck: the
    ranking leaves that wait out and the report gives its share on its own line."""
    pipe = make(spark, tmp_path)
    batch = spark.createDataFrame([(k,) for k in range(20)], "k long")
    for i in range(3):
        if i:
            time.sleep(1.5)  # longer than an epoch here: the wait would top the ranking
        pipe.process(batch)
    state = str(pipe.state_dir.path)
    assert main(["explain", "--state-dir", state, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["idle"] > 0.3
    assert info["by_kind"]["idle"] == pytest.approx(info["idle"])
    assert info["top"] and not any(i["role"] == "gap" and i["worker"] is None
                                   for i in info["top"])
    assert main(["explain", "--state-dir", state]) == 0
    out = capsys.readouterr().out
    assert f"idle: {100 * info['idle']:.1f}% of the window" in out
    assert "wait (gap)  driver" not in out
