"""Pipeline on Spark: streaming with a live plan, retried batches, scale in, bad plans, metrics."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import megaphone
import megaphone.cli
from megaphone import MigrationPlan, Move, Pipeline, PlanError


def counts(pipe: Pipeline) -> dict:
    return {row[0]: row[1] for row in pipe.state().collect()}


def make(spark, tmp_path, **kw) -> Pipeline:
    kw.setdefault("key_type", "int64")
    return Pipeline(spark, str(tmp_path / "state"), key="k", update="count", num_bins=16,
                    pipeline_id=uuid.uuid4().hex, **kw)


def test_streaming_query_keeps_completing_epochs_while_a_plan_runs(spark, tmp_path):
    pipe = make(spark, tmp_path, workers=2)
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 400).load()
              .select((F.col("value") % 97).alias("k")))
    seen: list[dict] = []
    query = pipe.start(stream, lambda df, epoch: seen.append(pipe.metrics(last=1)[0]),
                       trigger={"processingTime": "300 milliseconds"})
    try:
        deadline = time.time() + 120
        while len(seen) < 2 and time.time() < deadline:
            time.sleep(0.2)
        moves = [Move(b, b // 8, 2 + b % 2) for b in range(0, 16, 4)] + \
            [Move(b, b // 8, 2 + b % 2) for b in range(1, 16, 4)]
        plan = MigrationPlan.from_moves(pipe.routing, [[m] for m in moves], strategy="fluid")
        handles = []
        submitter = threading.Thread(target=lambda: handles.append(megaphone.migrate(plan)))
        submitter.start()
        submitter.join()
        assert handles[0].wait(timeout=240)
        stop_after = len(seen) + 1
        while len(seen) < stop_after and time.time() < deadline + 120:
            time.sleep(0.2)
    finally:
        query.stop()
    assert query.exception() is None
    epochs = [m["epoch"] for m in seen]
    assert epochs == list(range(epochs[0], epochs[0] + len(epochs)))  # committed in order
    moving = [m for m in seen if m["bins_moved"]]
    assert sum(m["bins_moved"] for m in moving) == len(moves)
    assert all(m["records_in"] > 0 for m in moving)  # every migration epoch did real work
    assert pipe.routing.workers() == [0, 1, 2, 3]
    assert sum(counts(pipe).values()) == sum(m["records_in"] for m in pipe.metrics())


def test_a_retried_batch_id_applies_nothing_and_returns_the_same_outputs(spark, tmp_path):
    pipe = make(spark, tmp_path)
    batch = spark.createDataFrame([(1,), (2,), (1,)], "k long")
    plan = MigrationPlan.from_moves(pipe.routing, [[Move(11, 1, 0)]])
    handle = pipe.migrate(plan)
    first, epoch = pipe._runner.run_batch(batch, 7, "ckpt")
    again, epoch_again = pipe._runner.run_batch(batch, 7, "ckpt")
    assert epoch == epoch_again == 0
    assert sorted(again.collect()) == sorted(first.collect())
    assert counts(pipe) == {1: 2, 2: 1}
    assert len(pipe.metrics()) == 1 and handle.done and handle.progress.steps_done == 1
    assert pipe.routing.version == 1  # the move was not applied twice


def test_scale_in_releases_the_storage_of_workers_left_without_bins(spark, tmp_path):
    pipe = make(spark, tmp_path, workers=3)
    batch = spark.createDataFrame([(k,) for k in range(100)], "k long")
    pipe.process(batch)
    assert pipe.state_dir.paths.worker(2).exists()
    plan = MigrationPlan.from_moves(
        pipe.routing, [[Move(int(b), 2, int(b) % 2) for b in pipe.routing.bins_of(2)]]
    )
    handle = pipe.migrate(plan)
    for _ in range(3):
        pipe.process(batch)
    assert handle.done
    assert pipe.routing.workers() == [0, 1]
    assert not pipe.state_dir.paths.worker(2).exists()
    assert counts(pipe) == {k: 4 for k in range(100)}


def test_bad_and_stale_plans_are_rejected_and_change_nothing(spark, tmp_path):
    pipe = make(spark, tmp_path)
    pipe.process(spark.createDataFrame([(1,)], "k long"))
    first = MigrationPlan.from_moves(pipe.routing, [[Move(0, 0, 1)], [Move(2, 0, 1)]])
    bad = MigrationPlan.from_moves(pipe.routing, [[Move(0, 1, 0)]])
    with pytest.raises(PlanError, match="source worker 1 is not the owner"):
        pipe.migrate(bad)
    pipe.migrate(first)
    with pytest.raises(PlanError, match="plans in flight end at version 2"):
        pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[Move(4, 0, 1)]]))
    queued = MigrationPlan(pipe.fingerprint, first.end_version,
                           MigrationPlan.from_moves(pipe.routing, [[Move(0, 1, 0)]]).steps)
    handle = pipe.migrate(queued)  # starts where the running plan ends: queued
    for _ in range(4):
        pipe.process(spark.createDataFrame([(1,)], "k long"))
    assert handle.done and pipe.routing.owner(0) == 0 and pipe.routing.owner(2) == 1
    assert counts(pipe) == {1: 5}


def test_metrics_are_recorded_per_worker_and_on_disk(spark, tmp_path):
    pipe = make(spark, tmp_path, workers=2)
    pipe.process(spark.createDataFrame([(k,) for k in range(50)], "k long"))
    (m,) = pipe.metrics()
    assert m["records_in"] == 50 and m["records_out"] == 50
    assert set(m["per_worker"]) == {"0", "1"}
    assert all(w["useful_s"] > 0 for w in m["per_worker"].values())
    assert pipe.state_dir.read_metrics() == [m]


def test_a_null_key_is_a_key_of_its_own(spark, tmp_path):
    """Like Spark's groupBy: the null key has a bin (0), state and an output row."""
    pipe = make(spark, tmp_path, workers=2)
    keys = [1, None, 2, 1, None, None]
    out = pipe.process(spark.createDataFrame([(k,) for k in keys], "k long"))
    assert sorted(map(tuple, out.collect()), key=repr) == [(1, 2), (2, 1), (None, 3)]
    (m,) = pipe.metrics()
    assert m["null_keys"] == 3 and m["records_in"] == 6 and m["records_out"] == 3
    assert counts(pipe) == {1: 2, 2: 1, None: 3}
    pipe.process(spark.createDataFrame([(None,)], "k long"))
    assert counts(pipe)[None] == 4


def test_the_issue_example_null_and_a_key_into_sum(spark, tmp_path):
    """Issue #16: ``[(None, 1), ("a", 2)]`` into sum gives two outputs, as groupBy would."""
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", value="v", update="sum",
                    num_bins=16, workers=2, key_type="str", pipeline_id=uuid.uuid4().hex)
    batch = spark.createDataFrame([(None, 1), ("a", 2)], "k string, v long")
    expected = {tuple(r) for r in batch.groupBy("k").agg(F.sum("v")).collect()}
    out = {tuple(r) for r in pipe.process(batch).collect()}
    assert out == expected == {(None, 1), ("a", 2)}
    (m,) = pipe.metrics()
    assert m["records_in"] == 2 and m["records_out"] == 2 and m["null_keys"] == 1
    assert {r[0]: r[1] for r in pipe.state().collect()} == {None: 1, "a": 2}


def _spark_agg(spark, rows: list[tuple], schema: str, update: str) -> dict:
    """Spark's ``groupBy("k").agg(update("v"))`` of ``rows``, as a dict."""
    agg = getattr(F, update)("v")
    return {r[0]: r[1] for r in spark.createDataFrame(rows, schema).groupBy("k").agg(agg).collect()}


@pytest.mark.parametrize("update", ["sum", "min", "max"])
@pytest.mark.parametrize(("key_type", "value_type"), [("int64", "long"), ("str", "double")])
def test_null_values_give_the_rows_and_aggregates_sparks_groupby_does(spark, tmp_path, update,
                                                                     key_type, value_type):
    """Nulls are skipped; a key whose values are all null still has a row (null, or its stored
    aggregate) and keeps its state (none if it had none), as Spark's running aggregate."""
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", value="v", update=update,
                    num_bins=16, workers=2, key_type=key_type, pipeline_id=uuid.uuid4().hex)
    schema = f"k {'long' if key_type == 'int64' else 'string'}, v {value_type}"
    a, b, c, d = (1, 2, 3, 4) if key_type == "int64" else ("a", "b", "c", "")
    cast = float if value_type == "double" else int
    first = [(a, None), (a, None), (b, None), (b, cast(5)), (b, cast(-2)), (None, None),
             (c, cast(7))]
    second = [(a, cast(3)), (a, None), (b, None), (None, None), (d, None), (c, None)]
    seen: list[tuple] = []
    for batch in (first, second):
        seen += batch
        touched = {k for k, _ in batch}
        running = _spark_agg(spark, seen, schema, update)  # update mode: the running aggregate
        expected = {k: v for k, v in running.items() if k in touched}
        out = pipe.process(spark.createDataFrame(batch, schema)).collect()
        assert {r[0]: r[1] for r in out} == expected and len(out) == len(expected)
        # the state: Spark's aggregate of every key that has a non-null one
        assert counts(pipe) == {k: v for k, v in running.items() if v is not None}
    assert counts(pipe) == {a: cast(3), b: {"sum": 3, "min": -2, "max": 5}[update], c: 7}
    assert pipe.metrics(last=1)[0]["records_out"] == 5


def _nan_as_text(value):
    """NaN != NaN; compare it as the text "NaN"."""
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


@pytest.mark.parametrize("update", ["sum", "min", "max"])
def test_nan_values_aggregate_as_sparks_groupby_does(spark, tmp_path, update):
    """Spark orders NaN above every number: a key that saw one has NaN as its max, and as its
    min only if every value was NaN; a sum with a NaN is NaN. Within an epoch and across."""
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", value="v", update=update,
                    num_bins=16, workers=2, key_type="int64", pipeline_id=uuid.uuid4().hex)
    nan = float("nan")
    first = [(1, 1.0), (1, nan), (2, nan), (3, 2.0), (4, nan), (4, nan), (6, nan), (6, None)]
    second = [(1, 0.5), (2, 3.0), (3, nan), (4, nan), (5, None), (6, -1.0)]
    seen: list[tuple] = []
    for batch in (first, second):
        seen += batch
        running = {k: _nan_as_text(v)
                   for k, v in _spark_agg(spark, seen, "k long, v double", update).items()}
        out = pipe.process(spark.createDataFrame(batch, "k long, v double")).collect()
        assert {r[0]: _nan_as_text(r[1]) for r in out} == \
            {k: v for k, v in running.items() if k in {k for k, _ in batch}}
        assert {k: _nan_as_text(v) for k, v in counts(pipe).items()} == \
            {k: v for k, v in running.items() if v is not None}


def test_count_counts_records_null_values_included_as_sparks_count_star(spark, tmp_path):
    """``count`` counts a key's records whatever its value (Spark's ``count("*")``, not
    ``count("v")``), the null key's too."""
    pipe = make(spark, tmp_path, workers=2, value="v")
    rows = [(1, None), (1, 4), (2, None), (None, None)]
    batch = spark.createDataFrame(rows, "k long, v long")
    expected = {r[0]: r[1] for r in batch.groupBy("k").agg(F.count("*")).collect()}
    assert {r[0]: r[1] for r in pipe.process(batch).collect()} == expected == \
        {1: 2, 2: 1, None: 1}
    assert counts(pipe) == expected


@pytest.mark.parametrize("key_type", ["int64", "str"])
def test_a_null_keys_state_moves_with_bin_zero(spark, tmp_path, key_type):
    pipe = make(spark, tmp_path, workers=2, key_type=key_type)
    schema = f"k {'long' if key_type == 'int64' else 'string'}"
    real = 7 if key_type == "int64" else ""  # "" encodes to zero bytes: must not collide
    pipe.process(spark.createDataFrame([(None,), (None,), (real,)], schema))
    src = pipe.routing.owner(0)
    handle = pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[Move(0, src, 1 - src)]]))
    out = pipe.process(spark.createDataFrame([(None,)], schema)).collect()
    assert handle.done and pipe.routing.owner(0) == 1 - src
    assert [tuple(r) for r in out] == [(None, 3)]
    assert pipe.metrics(last=1)[0]["bins_moved"] == 1
    assert counts(pipe) == {None: 3, real: 1}


def test_an_epoch_failing_after_workers_applied_it_is_rolled_back_then_rerun(spark, tmp_path,
                                                                           monkeypatch):
    pipe = make(spark, tmp_path, workers=2)
    batch = spark.createDataFrame([(k,) for k in (1, 2, 2)], "k long")
    pipe.process(batch)
    real = type(pipe.state_dir).write_outputs

    def fail(self, epoch, outputs):
        raise OSError("disk full")

    monkeypatch.setattr(type(pipe.state_dir), "write_outputs", fail)
    with pytest.raises(OSError, match="disk full"):  # the workers committed epoch 1, the driver not
        pipe.process(batch)
    assert pipe.epoch == 0 and counts(pipe) == {1: 1, 2: 2}  # the state is the commit's
    monkeypatch.setattr(type(pipe.state_dir), "write_outputs", real)
    out = pipe.process(batch)  # epoch 1 again, applied once
    assert sorted(map(tuple, out.collect())) == [(1, 2), (2, 4)]
    assert pipe.epoch == 1 and counts(pipe) == {1: 2, 2: 4}


def test_an_epoch_that_failed_is_applied_afresh_to_a_different_batch(spark, tmp_path,
                                                                      monkeypatch):
    pipe = make(spark, tmp_path, workers=2)
    pipe.process(spark.createDataFrame([(k,) for k in (1, 2, 2)], "k long"))
    monkeypatch.setattr(type(pipe.state_dir), "write_outputs",
                        lambda self, epoch, outputs: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):  # workers applied epoch 1, the driver not
        pipe.process(spark.createDataFrame([(k,) for k in (1, 1, 1)], "k long"))
    monkeypatch.undo()
    out = pipe.process(spark.createDataFrame([(k,) for k in (5, 2)], "k long"))  # epoch 1
    assert sorted(map(tuple, out.collect())) == [(2, 3), (5, 1)]  # not the failed try's
    assert pipe.epoch == 1 and counts(pipe) == {1: 1, 2: 3, 5: 1}


def test_process_arrow_returns_the_outputs_process_would_as_a_table(spark, tmp_path):
    pipe = make(spark, tmp_path, workers=2)
    batch = spark.createDataFrame([(k,) for k in (1, 2, 2, 7)], "k long")
    table = pipe.process_arrow(batch)
    assert isinstance(table, pa.Table) and table.schema.names == ["k", "count"]
    assert sorted(table.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "count": 1}, {"k": 2, "count": 2}, {"k": 7, "count": 1}]
    assert pipe.state_dir.read_outputs(0).sort_by("k").equals(table.sort_by("k"))  # kept alike
    frame = pipe.process(batch)  # epoch 1: the same pipeline, a DataFrame this time
    assert frame.schema.names == table.schema.names
    assert sorted(map(tuple, frame.collect())) == [(1, 2), (2, 4), (7, 2)]
    assert pipe.epoch == 1 and counts(pipe) == {1: 2, 2: 4, 7: 2}


def test_a_commit_record_that_cannot_be_written_commits_nothing(spark, tmp_path, monkeypatch):
    pipe = make(spark, tmp_path, workers=2)
    batch = spark.createDataFrame([(k,) for k in (1, 2, 2)], "k long")
    pipe.process(batch)

    def fail(self, commit, after=None):
        raise OSError("disk full")

    monkeypatch.setattr(type(pipe.state_dir), "write_commit", fail)
    with pytest.raises(OSError, match="disk full"):
        pipe.process_arrow(batch)
    monkeypatch.undo()
    assert pipe.epoch == 0 and counts(pipe) == {1: 1, 2: 2}  # rolled back to the commit
    assert pipe.process_arrow(batch).sort_by("k").to_pylist() == [
        {"k": 1, "count": 2}, {"k": 2, "count": 4}]


def test_reopening_a_state_dir_resumes_and_checks_settings(spark, tmp_path):
    pipe = make(spark, tmp_path)
    pipe.process(spark.createDataFrame([(1,), (2,)], "k long"))
    pid = pipe.fingerprint.pipeline_id
    del pipe
    again = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", num_bins=16)
    assert again.fingerprint.pipeline_id == pid and again.epoch == 0
    again.process(spark.createDataFrame([(1,)], "k long"))
    assert counts(again) == {1: 2, 2: 1}
    with pytest.raises(ValueError, match="num_bins 32 != 16"):
        Pipeline(spark, str(tmp_path / "state"), key="k", update="count", num_bins=32)


def test_a_plan_posted_to_the_inbox_is_taken_between_epochs(spark, tmp_path):
    from megaphone.migrator.statedir.inbox import PlanInbox, dir_committed

    pipe = make(spark, tmp_path)
    inbox = PlanInbox.of_state_dir(pipe.state_dir)

    def committed():
        return dir_committed(pipe.state_dir)

    good = inbox.post(MigrationPlan.from_moves(pipe.routing, [[Move(9, 1, 2)]]), committed)
    late = inbox.post(MigrationPlan.from_moves(pipe.routing, [[Move(9, 1, 3)]]), committed)
    pipe.process(spark.createDataFrame([(1,)], "k long"))
    assert good.wait(5) and good.progress.epochs == [0]
    with pytest.raises(PlanError, match="version"):  # the first plan took bin 9 meanwhile
        late.wait(5)
    assert pipe.routing.owner(9) == 2 and pipe.state_dir.read_commit().state_version == 1
    assert os.listdir(pipe.state_dir.paths.inbox) == []  # taken, answered and read
    unread = inbox.post(MigrationPlan.from_moves(pipe.routing, [[Move(2, 0, 3)]]), committed)
    with pytest.raises(PlanError, match="did not take the plan"):  # no epoch ran to take it
        unread.answered(0.3)
    pipe.process(spark.createDataFrame([(1,)], "k long"))
    assert pipe.routing.owner(2) == 0 and pipe.in_flight == []  # withdrawn: never submitted


def test_cli_migrate_hands_a_plan_to_a_pipeline_running_in_another_process(spark, tmp_path):
    pipe = make(spark, tmp_path)
    plan = MigrationPlan.from_moves(pipe.routing, [[Move(9, 1, 2)], [Move(2, 0, 3)]])
    plan.save(tmp_path / "plan.json")
    cli = subprocess.Popen(
        [sys.executable, "-m", "megaphone", "migrate", str(tmp_path / "plan.json"),
         "--state-dir", str(pipe.state_dir.path), "--no-progress", "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 180
    while cli.poll() is None and time.time() < deadline:
        pipe.process(spark.createDataFrame([(1,)], "k long"))
    out, err = cli.communicate(timeout=60)
    assert cli.returncode == 0, err
    assert "(another process)" in out and "routing version 0 -> 2" in out
    assert pipe.routing.owner(9) == 2 and pipe.routing.owner(2) == 3



def test_deadline_plan_moves_nothing_while_behind_and_resumes_from_its_json(spark, tmp_path,
                                                                          capsys):
    pipe = make(spark, tmp_path, workers=2)
    batch = spark.range(0, 400).select((F.col("id") % 101).alias("k"))
    for _ in range(2):
        pipe.process(batch, input_end=time.time())
    assert pipe.metrics(last=1)[0]["latency_s"] is not None
    plan = megaphone.rescale(pipe, workers=4, strategy="deadline", target_latency=0.001)
    handle = pipe.migrate(plan)
    for _ in range(2):
        pipe.process(batch, input_end=time.time())
    assert {d.action for d in handle.policy.decisions} == {"behind"}
    assert handle.progress.bins_done == 0 and pipe.routing.version == 0
    pipe.close()
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", num_bins=16)
    (handle,) = pipe.in_flight
    assert handle.plan.policy["target_latency_s"] == 0.001 and not handle.done
    pipe.process(batch, input_end=time.time() - 5)  # 5 s late: still behind
    assert handle.policy.decisions[-1].action == "behind"
    assert pipe.routing.version == 0
    pipe.close()
    assert megaphone.cli.main(["inspect", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert f"deadline plan from version 0: {len(plan.moves)} bins (0 started in 0 steps its " \
        "policy chose so far)" in out


def test_deadline_plan_probes_then_moves_what_fits(spark, tmp_path):
    pipe = make(spark, tmp_path, workers=2)
    batch = spark.range(0, 400).select((F.col("id") % 101).alias("k"))
    epochs = 0
    for _ in range(2):
        pipe.process(batch, input_end=time.time())
        epochs += 1
    plan = megaphone.rescale(pipe, workers=4, strategy="deadline", target_latency=60)
    handle = pipe.migrate(plan)
    policy = handle.policy
    while not handle.done and epochs < 10:
        pipe.process(batch, input_end=time.time())
        epochs += 1
    assert handle.done, handle
    # An epoch for the stores to write bins ahead (these are too small: none pending after
    # it), one bin alone, twice (the first probe's epoch is not learned from), then all that
    # fits, at most twice the most bins an epoch moved before.
    sizes = [d.bins for d in policy.decisions]
    assert [d.action for d in policy.decisions] == \
        ["prepare", "probe", "probe"] + ["fit"] * (len(sizes) - 3)
    assert sizes == [0, 1, 1, 2, len(plan.moves) - 4] and 4 < len(plan.moves) <= 8  # 6 moves
    assert handle.progress.steps_done == 4 and handle.progress.bins_done == len(plan.moves)
    assert sorted(set(pipe.routing.owners().tolist())) == [0, 1, 2, 3]
    assert counts(pipe) == {k: epochs * (4 if k < 97 else 3) for k in range(101)}
    pipe.close()


def test_bin_load_is_the_smoothed_records_per_bin(spark, tmp_path):
    from megaphone.migrator.epoch.run import LOAD_SMOOTHING
    from megaphone.routing.bins import bin_of

    pipe = make(spark, tmp_path, workers=2)
    keys = np.arange(500, dtype=np.int64) % 37
    batch = spark.createDataFrame([(int(k),) for k in keys], "k long")
    for _ in range(2):
        pipe.process(batch)
    per_bin = np.bincount(bin_of(keys, 16), minlength=16)
    expected = LOAD_SMOOTHING * per_bin * (1 + (1 - LOAD_SMOOTHING))
    assert np.allclose(pipe.bin_load(), expected) and pipe.bin_load().sum() > 0
    pipe.close()


def test_a_pipeline_turns_off_row_by_row_projection_of_local_data_keeping_other_exclusions(
        spark, tmp_path):
    # Spark's ConvertToLocalRelation would compute the routing projection of a DataFrame made
    # from local data row by row, unfolded (bench/local_input.py); a rule the user excluded stays.
    from megaphone.spark import LOCAL_RELATION_RULE

    other = "org.apache.spark.sql.catalyst.optimizer.PushFoldableIntoBranches"
    key = "spark.sql.optimizer.excludedRules"
    before = spark.conf.get(key, None)
    spark.conf.set(key, other)
    try:
        pipe = make(spark, tmp_path, workers=2)
        assert spark.conf.get(key).split(",") == [other, LOCAL_RELATION_RULE]
        make(spark, tmp_path / "again", workers=2).close()  # added once, not twice
        assert spark.conf.get(key).split(",") == [other, LOCAL_RELATION_RULE]
        pipe.process(spark.createDataFrame([(k,) for k in (1, 2, 2)], "k long"))
        assert counts(pipe) == {1: 1, 2: 2}
        pipe.close()
    finally:
        spark.conf.set(key, before or LOCAL_RELATION_RULE)


def test_bin_sizes_are_read_once_per_committed_epoch(spark, tmp_path, monkeypatch):
    """A plan made between two epochs and its policy's first decision share one read of the
    workers' bin statistics (each read opens every store); a commit makes the next one read."""
    from megaphone.migrator.epoch import state_holder

    reads = []
    real = state_holder.worker_bin_stats
    monkeypatch.setattr(state_holder, "worker_bin_stats",
                        lambda state: reads.append(1) or real(state))
    pipe = make(spark, tmp_path, workers=2)
    pipe.process(spark.createDataFrame([(k,) for k in range(20)], "k long"))
    assert pipe.bin_sizes().keys.sum() == 20 and pipe.bin_sizes().keys.sum() == 20
    assert len(reads) == 1
    pipe.process(spark.createDataFrame([(k,) for k in range(20, 30)], "k long"))
    assert pipe.bin_sizes().keys.sum() == 30 and len(reads) == 2
    pipe.close()


def test_an_empty_local_batch_still_runs_the_epoch_at_every_worker(spark, tmp_path):
    # Spark proves a filtered local table (or limit(0)) empty and would drop the shuffle and
    # the workers' tasks after it: the workers would not run the epoch, and fall behind.
    pipe = make(spark, tmp_path, workers=2)
    local = spark.createDataFrame([(1,)], "k long")
    for batch in (local.where(F.lit(False)), local.limit(0), local):
        pipe.process(batch)
        assert sorted(pipe.metric_records(1)[0].per_worker) == [0, 1]
    assert pipe.epoch == 2 and counts(pipe) == {1: 1}
    pipe.close()


def test_adaptive_execution_is_off_for_the_epoch_jobs_only_and_restored(spark):
    from megaphone.spark import ADAPTIVE, adaptive_off

    seen: list[str] = []
    before = spark.conf.get(ADAPTIVE)
    entered, release = threading.Event(), threading.Event()

    def job() -> None:  # a second epoch job, on another thread, ending after the first
        with adaptive_off(spark):
            entered.set()
            release.wait(10)
            seen.append(spark.conf.get(ADAPTIVE))

    other = threading.Thread(target=job)
    with adaptive_off(spark):
        other.start()
        entered.wait(10)
        seen.append(spark.conf.get(ADAPTIVE))
    seen.append(spark.conf.get(ADAPTIVE))  # the other job is still running
    release.set()
    other.join(10)
    assert seen == ["false", "false", "false"] and spark.conf.get(ADAPTIVE) == before
    with pytest.raises(RuntimeError), adaptive_off(spark):
        raise RuntimeError("a failed job")
    assert spark.conf.get(ADAPTIVE) == before
