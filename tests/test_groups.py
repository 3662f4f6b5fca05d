"""Group scheduling (docs/groups.md): a batch's epochs run in groups, one Spark job per group.

Properties: with any group size and random fixed plans (steps inside what would be a group end
it there), per-epoch outputs and the final state equal a plain Python run without groups or
migration (the reference of tests/test_equivalence.py); event-time windows' outputs equal those
of the same pipeline run one job per epoch (per-epoch watermarks stay exact). Bad epoch columns
are refused and change nothing.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import uuid
from collections import Counter

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone import MigrationPlan, Move, Pipeline, PlanStep, WindowAggregate
from megaphone.inspect_cmd import describe, render
from megaphone.migrator.epoch.config import check_group_size
from megaphone.migrator.epoch.groups import drizzle_group_size
from megaphone.migrator.task.state_operator import _records_table
from tests.test_equivalence import SPARK_PHASES, custom_update, reference

NUM_BINS = 16


@st.composite
def group_scenarios(draw):
    """A backlog of epochs with sparse increasing labels, maybe a chain of fixed plans."""
    epochs = draw(st.integers(2, 5))
    keys = st.integers(0, 20) | st.none()
    update = draw(st.sampled_from(["count", "sum", "custom"]))
    values = st.integers(-9, 9) if update == "custom" else st.none() | st.integers(-9, 9)
    # An epoch is a label with records: a batch without records is no epoch.
    batches = [draw(st.lists(st.tuples(keys, values), min_size=1, max_size=10))
               for _ in range(epochs)]
    gaps = draw(st.lists(st.integers(1, 3), min_size=epochs, max_size=epochs))
    labels = [sum(gaps[:i + 1]) for i in range(epochs)]
    owners = [b * 2 // NUM_BINS for b in range(NUM_BINS)]  # contiguous ranges
    steps = []
    offset = draw(st.integers(0, epochs - 1))
    for _ in range(draw(st.integers(0, 3))):
        if offset >= epochs:  # every step inside the backlog: no epochs to run after it
            break
        bins = draw(st.lists(st.integers(0, NUM_BINS - 1), min_size=1, max_size=3, unique=True))
        moves = []
        for b in bins:
            dst = draw(st.sampled_from([w for w in range(3) if w != owners[b]]))
            moves.append((b, owners[b], dst))
            owners[b] = dst
        steps.append((offset, moves))
        offset += draw(st.integers(1, 3))
    return {"batches": batches, "labels": labels, "update": update, "steps": steps,
            "group_size": draw(st.sampled_from([1, 2, 3, 64, "auto"])),
            "split": draw(st.integers(0, epochs)),
            "backend": draw(st.sampled_from(["memory", "rocksdb"]))}


@settings(phases=SPARK_PHASES, max_examples=3)
@given(group_scenarios())
def test_groups_with_plans_equal_a_run_without_groups(spark, scenario):
    update = scenario["update"]
    with tempfile.TemporaryDirectory() as state_dir:
        pipe = Pipeline(spark, state_dir, key="k", value="v",
                        update=custom_update if update == "custom" else update, workers=2,
                        num_bins=NUM_BINS, backend=scenario["backend"], key_type="int64",
                        pipeline_id=uuid.uuid4().hex, output_type="bigint",
                        group_size=scenario["group_size"])
        handle = None
        if scenario["steps"]:
            handle = pipe.migrate(MigrationPlan(pipe.fingerprint, 0, tuple(
                PlanStep(e, tuple(Move(*m) for m in ms)) for e, ms in scenario["steps"])))
        rows = [(k, v, label) for batch, label in zip(scenario["batches"], scenario["labels"],
                                                     strict=True) for k, v in batch]
        split = scenario["labels"][scenario["split"] - 1] if scenario["split"] else -1
        got: dict[int, dict] = {label: {} for label in scenario["labels"]}
        for part in ([r for r in rows if r[2] <= split], [r for r in rows if r[2] > split]):
            df = spark.createDataFrame(part, "k long, v long, e long")
            for row in pipe.process(df, epoch_column="e").collect():
                assert row[0] not in got[row[2]]  # one output per key and epoch
                got[row[2]][row[0]] = row[1]
        expected, state = reference(update, scenario["batches"])
        assert [got[label] for label in scenario["labels"]] == expected
        # Every epoch ran, in groups no plan step falls inside.
        assert [r.label for r in pipe.metric_records()] == scenario["labels"]
        assert pipe.epoch == len(scenario["labels"]) - 1
        assert pipe.label == scenario["labels"][-1]
        records = pipe.metric_records()
        if handle is not None:
            assert handle.done
            for epoch in handle.progress.epochs:  # each step ran at the first epoch of a group
                assert records[epoch].group == epoch
        final = {r[0]: r[1] for r in pipe.state().collect()}
        if update == "custom":
            final = {k: msgpack.unpackb(v) for k, v in final.items()}
        assert final == state
        pipe.close()


def test_event_time_groups_keep_each_epochs_watermark(spark):
    """Windows with lateness: a group's outputs and late records equal one job per epoch."""
    fn = WindowAggregate(size_us=4_000_000, slide_us=4_000_000, agg="count",
                         lateness_us=1_000_000)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    events = [("a", 1, 0), ("b", 3, 0), ("a", 9, 1), ("a", 2, 1), ("b", 14, 2), ("a", 6, 2),
              ("b", 5, 3), ("a", 21, 3), ("a", 30, 4), ("b", 26, 4)]
    rows = [(k, t0 + dt.timedelta(seconds=s), 1, e) for k, s, e in events]
    results = []
    for grouped in (True, False):
        with tempfile.TemporaryDirectory() as state_dir:
            pipe = Pipeline(spark, state_dir, key="k", value="v", event_time="t", update=fn,
                            num_bins=NUM_BINS, key_type="str", pipeline_id=uuid.uuid4().hex,
                            group_size=8)
            out: Counter = Counter()
            schema = "k string, t timestamp, v long, e long"
            if grouped:
                for row in pipe.process(spark.createDataFrame(rows, schema),
                                        epoch_column="e").collect():
                    out[(row.e, row.k, row.output.end, row.output.value)] += 1
                assert {r.group_size for r in pipe.metric_records()} == {5}
            else:
                for e in range(5):
                    df = spark.createDataFrame([r[:3] for r in rows if r[3] == e],
                                               "k string, t timestamp, v long")
                    for row in pipe.process(df).collect():
                        out[(e, row.k, row.output.end, row.output.value)] += 1
            late = [r.late_records for r in pipe.metric_records()]
            results.append((out, late, sorted(map(tuple, pipe.state().collect()))))
            pipe.close()
    assert results[0] == results[1]
    assert sum(results[0][1]) > 0  # the scenario has late records: watermarks mattered


def test_bad_epoch_columns_are_refused_and_change_nothing(spark, tmp_path):
    pipe = Pipeline(spark, str(tmp_path / "p"), key="k", value="v", update="sum",
                    num_bins=NUM_BINS, key_type="int64")
    good = spark.createDataFrame([(1, 2, 3), (1, 2, 5)], "k long, v long, e long")
    pipe.process(good, epoch_column="e")
    info = describe(str(tmp_path / "p"))  # `megaphone inspect` shows the group
    assert info["label"] == 5 and info["groups"] == {
        "epochs": 2, "grouped": 2, "groups": 1, "mean_size": 2.0, "max_size": 2, "last": [0, 2]}
    assert "groups      1 of the last 2 epochs' jobs ran groups" in render(info)
    before = (pipe.epoch, pipe.label, sorted(map(tuple, pipe.state().collect())))
    cases = [
        (spark.createDataFrame([(1, 2, 9)], "k long, v long, e long"), "x", ValueError,
         "not in the batch"),
        (spark.createDataFrame([(1, 2, 9.5)], "k long, v long, e double"), "e", TypeError,
         "labels are integers"),
        (spark.createDataFrame([(1, 2, 9)], "k long, v long, e long"), "k", ValueError,
         "also the pipeline's key column"),
        (spark.createDataFrame([(1, 2, None)], "k long, v long, e long"), "e", ValueError,
         "holds nulls"),
        (spark.createDataFrame([(1, 2, 5), (1, 2, 7)], "k long, v long, e long"), "e",
         ValueError, "committed label 5 already"),
        (spark.createDataFrame([(1, 2, 9)], "k long, v long, sum long"), "sum", ValueError,
         "clash with the outputs"),
    ]
    for df, column, error, message in cases:
        with pytest.raises(error, match=message):
            pipe.process(df, epoch_column=column)
        assert (pipe.epoch, pipe.label) == before[:2]
    assert sorted(map(tuple, pipe.state().collect())) == before[2]
    negative = Pipeline(spark, str(tmp_path / "q"), key="k", update="count", key_type="int64",
                        num_bins=NUM_BINS)
    with pytest.raises(ValueError, match="negative labels"):
        negative.process(spark.createDataFrame([(1, -1)], "k long, e long"), epoch_column="e")
    assert negative.epoch == -1
    negative.close()
    pipe.close()


def test_a_deadline_plan_behind_its_target_lets_a_backlog_run_in_groups(spark, tmp_path):
    """While a deadline plan runs, a group may last past its first epoch when the policy moved
    nothing there (here: a backlog behind the target, so the plan waits), bounded by the
    target; once within the target the plan moves again, each epoch that moves bins a group of
    its own. Outputs and state stay exact."""
    import time

    from megaphone.plans import make_plan

    pipe = Pipeline(spark, str(tmp_path / "p"), key="k", update="count", workers=2,
                    num_bins=NUM_BINS, key_type="int64", pipeline_id=uuid.uuid4().hex,
                    group_size=4)
    labels = list(range(16))
    keys = {label: [(label * 5 + i) % 11 for i in range(6)] for label in labels}
    frame = spark.createDataFrame([(k, label) for label in labels for k in keys[label]],
                                  "k long, e long")
    got = {label: {} for label in labels}

    def run(where: str, **kw) -> None:
        for row in pipe.process(frame.where(where), epoch_column="e", **kw).collect():
            got[row["e"]][row["k"]] = row["count"]

    run("e = 0")  # measures a group's floor and work
    moves = [Move(b, b // 8, 2) for b in range(0, NUM_BINS, 3)]
    handle = pipe.migrate(make_plan(pipe.routing, moves, "deadline", target_latency=60.0))
    # Labels 1-9: their input ended 300 s ago, behind the 60 s target: the plan waits.
    run("e between 1 and 9", input_end=time.time() - 300)
    records = pipe.metric_records()
    assert [r.group_size for r in records[1:]] == [4] * 8 + [1] and handle.progress.epochs == []
    run("e >= 10")  # within the target: the plan moves, one epoch at a time
    records = pipe.metric_records()
    assert handle.progress.epochs
    for epoch in handle.progress.epochs:
        assert records[epoch].group == epoch and records[epoch].group_size == 1
    counts: Counter = Counter()
    for label in labels:
        counts.update(keys[label])
        assert got[label] == {k: counts[k] for k in set(keys[label])}, label
    assert {r[0]: r[1] for r in pipe.state().collect()} == dict(counts)
    pipe.close()


def test_group_size_checks_and_drizzles_rule():
    assert check_group_size("auto") == "auto" and check_group_size(3) == 3
    for bad in (0, -2, 1.5, "big", True):
        with pytest.raises(ValueError, match="group_size"):
            check_group_size(bad)
    # 0.36 s floor, 24 ms work: 10% overhead needs 135 epochs; capped at the largest group.
    assert drizzle_group_size(0.36, 0.024) == 64
    assert drizzle_group_size(0.36, 0.024, most=1000) == 135
    assert drizzle_group_size(0.1, 0.1) == 9  # 0.1 / (0.1 + 9 * 0.1) = 10%
    assert drizzle_group_size(0.0, 0.1) == 1 and drizzle_group_size(0.2, 0.0) == 64


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_group_failing_after_some_commit_records_rolls_back_the_rest(spark, tmp_path,
                                                                       monkeypatch, checkpoint):
    """The driver fails after writing the commit records of 2 of a group's 4 epochs: the state
    read is the second's (workers two epochs past it are rolled back: in the state directory,
    or with a checkpoint location by the executors), and the rest run again exactly once."""
    from collections import Counter

    from pyspark.sql import functions as F

    state_dir = tmp_path / "state"
    kw = {"checkpoint": str(tmp_path / "checkpoint")} if checkpoint else {}
    pipe = Pipeline(spark, str(state_dir), key="k", update="count", num_bins=NUM_BINS,
                    key_type="int64", pipeline_id=uuid.uuid4().hex, group_size=4, **kw)
    batches = {e: [(e * 3 + i) % 7 for i in range(5)] for e in range(4)}
    df = spark.createDataFrame([(k, e) for e, ks in batches.items() for k in ks], "k long, e long")
    real = type(pipe.state_dir).write_commit
    written = []

    def failing(self, commit, after=None, **kw):
        if len(written) == 2:
            raise OSError("disk full")
        written.append(commit.epoch)
        return real(self, commit, after, **kw)

    monkeypatch.setattr(type(pipe.state_dir), "write_commit", failing)
    with pytest.raises(OSError, match="disk full"):
        pipe.process_arrow(df, epoch_column="e")
    monkeypatch.undo()
    assert (pipe.epoch, pipe.label) == (1, 1)
    counts = Counter(batches[0] + batches[1])
    assert {r[0]: r[1] for r in pipe.state().collect()} == dict(counts)
    out = pipe.process_arrow(df.where(F.col("e") > pipe.label), epoch_column="e")
    for e in (2, 3):
        counts.update(batches[e])
        got = {r["k"]: r["count"] for r in out.to_pylist() if r["e"] == e}
        assert got == {k: counts[k] for k in batches[e]}
    assert {r[0]: r[1] for r in pipe.state().collect()} == dict(counts)
    pipe.close()
    reopened = Pipeline(spark, str(state_dir), key="k", update="count", num_bins=NUM_BINS)
    assert reopened.epoch == 3 and reopened.recovery.clean
    assert {r[0]: r[1] for r in reopened.state().collect()} == dict(counts)
    reopened.close()


def test_record_batches_that_differ_only_in_nullability_make_one_table() -> None:
    """A task's records can come in batches the JVM made (nullable columns) and batches made
    by megaphone (some not nullable): one table of all their rows, as a crash-recovery run
    met (tests/test_groups_recovery.py)."""
    strict = pa.schema([pa.field("_k", pa.int8(), nullable=False), ("key", pa.int64())])
    loose = pa.schema([("_k", pa.int8()), ("key", pa.int64())])
    batches = [pa.record_batch([[1], [10]], schema=strict),
               pa.record_batch([[2], [20]], schema=loose)]
    table = _records_table(batches, loose)
    assert table.column("key").to_pylist() == [10, 20] and table.num_rows == 2
    assert _records_table([], loose).schema == loose
