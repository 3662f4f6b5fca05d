"""A general update function that fails on a key: the caller gets an ``UpdateError`` naming the
key and the epoch, nothing of that epoch is committed, and the pipeline goes on as if the bad
batch had never been sent (a migration step due in the failed epoch included).

The session is ``local[2]``: a failed task fails its job at once (local mode makes one attempt;
with retries, each attempt would fail alike and only take longer)."""

from __future__ import annotations

import sys
import time
import uuid

import msgpack
import pyarrow as pa
import pytest
from pyspark import cloudpickle

from megaphone import MigrationPlan, Move, Pipeline, UpdateError, bin_of
from megaphone.errors import MegaphoneError
from megaphone.migrator.task import columns as C
from megaphone.migrator.task.updates import apply_custom, custom_outputs, make_update
from megaphone.state_backends.encoding import unpack_value

# Python workers cannot import this test module: ship the update function by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

BAD_RAISES, BAD_SET, BAD_OBJECT, BAD_OUTPUT, BAD_RETURN = -1, -2, -3, -4, -5


def summing(key, values, state):
    """A sum per key whose special values fail it in each of the ways a user's ``f`` can."""
    if BAD_RAISES in values:
        raise ValueError(f"no negative values for {key}")
    if BAD_RETURN in values:
        return state
    total = (state or 0) + sum(values)
    if BAD_SET in values:
        return {total}, []
    if BAD_OBJECT in values:
        return object(), []
    if BAD_OUTPUT in values:
        return total, [{"total": total}]
    return total, [str(total)]


def make(spark, tmp_path, **kw) -> Pipeline:
    kw.setdefault("workers", 2)
    return Pipeline(spark, str(tmp_path / "state"), key="k", value="v", update=summing,
                    num_bins=16, key_type="int64", pipeline_id=uuid.uuid4().hex, **kw)


def batch(spark, rows):
    return spark.createDataFrame(rows, "k long, v long")


def state(pipe: Pipeline) -> dict:
    return {row[0]: unpack_value(row[1]) for row in pipe.state().collect()}


def outputs(frame) -> list:
    return sorted(map(tuple, frame.collect()))


GOOD = [[(1, 1), (2, 2), (3, 3), (4, 4)], [(1, 10), (2, 20), (5, 50)], [(3, 7), (6, 6)]]


# -- the worker's side, without Spark ---------------------------------------------------------


def records(keys, values) -> pa.Table:
    return pa.table({C.KEY: pa.array(keys, pa.int64()), C.BIN: pa.array([0] * len(keys),
                                                                        pa.int32()),
                     "values": pa.array(values, pa.list_(pa.int64()))})


@pytest.mark.parametrize(("values", "message"), [
    ([BAD_RAISES], r"it raised: ValueError: no negative values for 7 \(at .*test_update_errors"),
    ([BAD_RETURN], r"it must return \(new_state, an iterable of outputs\): TypeError"),
    ([BAD_SET], r"msgpack cannot encode its new state \(a set\): TypeError"),
    ([BAD_OBJECT], r"msgpack cannot encode its new state \(a object\): TypeError"),
])
def test_apply_custom_names_the_key_epoch_and_worker(values, message):
    update = make_update(summing, None)
    with pytest.raises(UpdateError, match=r"^update function failed on key 7 at epoch 3 on "
                                          r"worker 1: " + message) as info:
        apply_custom(update, records([5, 7], [[1], values]), [None, None], 3, 1)
    assert (info.value.key, info.value.epoch, info.value.worker) == (7, 3, 1)
    assert info.value.__cause__ is not None and "\n" not in str(info.value)


def by_value(key, values, state):
    """A state keyed by int: msgpack map keys that are not strings."""
    state = state or {}
    for v in values:
        state[v] = state.get(v, 0) + 1
    return state, [len(state)]


def test_a_state_with_int_map_keys_comes_back_at_the_next_epoch():
    update = make_update(by_value, None)
    first, _, _ = apply_custom(update, records([5], [[1, 2, 1]]), [None], 1, 0)
    second, keys, outputs = apply_custom(update, records([5], [[2, 3]]), first, 2, 0)
    assert unpack_value(second[0]) == {1: 2, 2: 2, 3: 1}
    assert (keys, outputs) == ([5], [3])


def test_an_output_that_does_not_convert_names_its_key():
    schema = pa.schema([("k", pa.int64()), ("out", pa.string())])
    assert custom_outputs([1, 2], ["a", "b"], schema).to_pylist() == [
        {"k": 1, "out": "a"}, {"k": 2, "out": "b"}]
    with pytest.raises(UpdateError, match=r"key 2 at epoch 0 on worker 3: its output 5 does not "
                                          r"convert to the output type string"):
        custom_outputs([1, 2], ["a", 5], schema, 0, 3)


def test_the_driver_finds_the_error_in_the_text_spark_carried_it_in():
    text = ("org.apache.spark.SparkException: Job aborted ...\nTraceback (most recent call "
            "last):\n  File ...\nValueError: boom\n\nThe above exception was the direct cause"
            "\nmegaphone.migrator.task.updates.UpdateError: update function failed on key 'a b' at "
            "epoch 12 on worker 0: it raised: ValueError: boom\n\tat org.apache...")
    error = UpdateError.from_text(text)
    assert str(error) == ("update function failed on key 'a b' at epoch 12 on worker 0: it "
                          "raised: ValueError: boom")
    assert (error.key, error.epoch, error.worker) == ("a b", 12, 0)
    assert UpdateError.from_text("java.lang.OutOfMemoryError") is None
    assert isinstance(error, MegaphoneError) and isinstance(error, RuntimeError)


# -- on Spark ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory) -> tuple[list, dict]:
    """The outputs of the last batch and the final state of a pipeline fed only ``GOOD``."""
    pipe = make(spark, tmp_path_factory.mktemp("reference"))
    try:
        for rows in GOOD:
            out = outputs(pipe.process(batch(spark, rows)))
        return out, state(pipe)
    finally:
        pipe.close()


@pytest.mark.parametrize(("bad", "message"), [
    (BAD_RAISES, "it raised: ValueError: no negative values for 2"),
    (BAD_SET, r"msgpack cannot encode its new state \(a set\)"),
    (BAD_OBJECT, r"msgpack cannot encode its new state \(a object\)"),
    (BAD_OUTPUT, r"its output \{.total.: -2\} does not convert to the output type string"),
])
def test_a_failing_update_names_key_and_epoch_commits_nothing_and_the_next_batch_works(
        spark, tmp_path, reference, bad, message):
    pipe = make(spark, tmp_path)
    try:
        pipe.process(batch(spark, GOOD[0]))
        before, commit = state(pipe), pipe.state_dir.read_commit()
        with pytest.raises(UpdateError, match=r"^update function failed on key 2 at epoch 1 on "
                                              rf"worker \d: {message}") as info:
            pipe.process(batch(spark, [(1, 100), (2, bad), (9, 9)]))
        assert (info.value.key, info.value.epoch) == (2, 1)
        assert "Traceback" not in str(info.value) and info.value.__cause__ is None
        assert pipe.epoch == 0 and state(pipe) == before  # keys 1 and 9 not applied either
        assert len(pipe.metrics()) == 1 and len(pipe.state_dir.read_metrics()) == 1
        assert pipe.state_dir.read_commit().epoch == commit.epoch
        for rows in GOOD[1:]:
            out = outputs(pipe.process(batch(spark, rows)))
        assert pipe.epoch == 2 and [m["epoch"] for m in pipe.metrics()] == [0, 1, 2]
    finally:
        pipe.close()
    assert (out, state(pipe)) == reference


def test_a_move_due_in_the_failed_epoch_happens_when_that_epoch_runs_again(spark, tmp_path,
                                                                           reference):
    pipe = make(spark, tmp_path)
    try:
        pipe.process(batch(spark, GOOD[0]))
        bad_bin, other = bin_of(2, 16), bin_of(1, 16)
        owners = pipe.routing.owners()
        step0 = [Move(bad_bin, int(owners[bad_bin]), 2)]  # the failing key's bin: a new owner
        if other != bad_bin:  # and a bin whose new owner may commit the failed epoch
            step0.append(Move(other, int(owners[other]), 3))
        later = min(set(range(16)) - {bad_bin, other})
        plan = MigrationPlan.from_moves(pipe.routing, [step0, [Move(later, int(owners[later]), 2)]])
        handle = pipe.migrate(plan)
        with pytest.raises(UpdateError, match="key 2 at epoch 1 on worker 2: it raised"):
            pipe.process(batch(spark, [(1, 100), (2, BAD_RAISES)]))
        assert pipe.epoch == 0 and handle.progress.steps_done == 0 and not handle.done
        assert pipe.state_dir.read_commit().plans[0]["committed"] == 0
        assert state(pipe) == {1: 1, 2: 2, 3: 3, 4: 4}
        for rows in GOOD[1:]:
            out = outputs(pipe.process(batch(spark, rows)))
        assert handle.wait(0)
        p = handle.progress
        assert p.steps_done == len(plan.steps) and p.epochs == list(range(1, 1 + len(plan.steps)))
        assert pipe.routing.owner(bad_bin) == 2 and pipe.metrics()[1]["bins_moved"] == len(step0)
        assert pipe.epoch == 2 and pipe.state_dir.read_commit().plans == []
    finally:
        pipe.close()
    assert (out, state(pipe)) == reference


def test_a_stream_fails_with_the_error_and_leaves_the_state_intact(spark, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for i, rows in enumerate([GOOD[0], [(3, 1), (4, BAD_RAISES)]]):
        (source / f"{i}.csv").write_text("".join(f"{k},{v}\n" for k, v in rows))
        time.sleep(0.01)  # files are taken in modification order
    stream = spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1) \
        .csv(str(source))
    pipe = make(spark, tmp_path)
    try:
        seen: list[int] = []
        for _ in range(2):  # restarted on its checkpoint, the query fails alike
            query = pipe.start(stream, lambda df, epoch: seen.append(epoch),
                               trigger={"availableNow": True})
            with pytest.raises(Exception, match="update function failed on key 4 at epoch 1"):
                query.awaitTermination(120)
            assert "update function failed on key 4 at epoch 1" in str(query.exception())
            assert seen == [0] and pipe.epoch == 0
            assert state(pipe) == {1: 1, 2: 2, 3: 3, 4: 4}
            pipe.stop()
        out = outputs(pipe.process(batch(spark, GOOD[1])))  # usable once the stream is gone
        assert out == [(1, "11"), (2, "22"), (5, "50")] and pipe.epoch == 1
    finally:
        pipe.close()


def test_state_of_a_failing_key_is_the_last_committed_one(spark, tmp_path):
    """A key that failed keeps its state: the same batch fixed later applies on top of it."""
    pipe = make(spark, tmp_path)
    try:
        pipe.process(batch(spark, [(2, 5)]))
        with pytest.raises(UpdateError):
            pipe.process(batch(spark, [(2, BAD_SET)]))
        pipe.process(batch(spark, [(2, 1)]))
        assert state(pipe) == {2: 6}
        assert msgpack.unpackb(pipe.state().collect()[0][1]) == 6
    finally:
        pipe.close()


@pytest.mark.parametrize("stored, values", [
    (None, [2**62, 2**62]),          # wraps inside the epoch
    (2**62, [2**62]),                # wraps when added to the stored sum
    (-(2**62), [-(2**62), -(2**62)]),
])
def test_an_int64_sum_that_overflows_names_its_key_instead_of_wrapping(stored, values):
    from megaphone.migrator.task.updates import apply_builtin, partial_aggregates

    update = make_update("sum", "int")
    records = pa.table({C.KEY: pa.array([7] * len(values) + [8], pa.int64()),
                        C.BIN: pa.array([0] * (len(values) + 1), pa.int32()),
                        C.VALUE: pa.array([*values, 1], pa.int64())})
    grouped = partial_aggregates(update, records)
    old = [None if stored is None else msgpack.packb(stored), None]
    with pytest.raises(UpdateError, match=r"on key 7 at epoch 3 on worker 1: its int64 sum "
                                          r"overflowed: OverflowError"):
        apply_builtin(update, grouped.sort_by(C.KEY), old, 3, 1)
    fine = pa.table({C.KEY: pa.array([7, 7], pa.int64()), C.BIN: pa.array([0, 0], pa.int32()),
                     C.VALUE: pa.array([2**62, 2**62 - 1], pa.int64())})  # 2**63 - 1: fits
    raw, out = apply_builtin(update, partial_aggregates(update, fine), [None])
    assert out.to_pylist() == [2**63 - 1] and msgpack.unpackb(raw[0]) == 2**63 - 1


def test_an_overflowing_sum_fails_its_epoch_and_the_pipeline_goes_on(spark, tmp_path):
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", value="v", update="sum",
                    workers=2, num_bins=16, key_type="int64", pipeline_id=uuid.uuid4().hex)
    try:
        pipe.process(batch(spark, [(1, 2**62), (2, 5)]))
        with pytest.raises(UpdateError, match=r"on key 1 at epoch 1 .*int64 sum overflowed"):
            pipe.process(batch(spark, [(1, 2**62), (2, 1)]))
        assert pipe.epoch == 0
        pipe.process(batch(spark, [(1, -1), (2, 1)]))
        assert {r[0]: r[1] for r in pipe.state().collect()} == {1: 2**62 - 1, 2: 6}
    finally:
        pipe.close()
