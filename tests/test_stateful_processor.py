"""Spark's ``StatefulProcessor`` as a megaphone update: processors written as Spark's docs
write them (a running count with ValueState, session windows with event-time timers, a top two
with MapState; a running count over pandas frames) give in megaphone, with bins moving out to 4
workers and back to 2, exactly what they give in Spark's own ``transformWithState`` (or
``transformWithStateInPandas``) over the same batches; their state and
timers move with their bins; a driver killed mid-run resumes to the same outputs; and what
megaphone cannot honour is refused when the pipeline is built."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import StructType

from megaphone import MigrationPlan, Move, Pipeline, PlanStep, bin_of
from megaphone.state_backends import open_backend
from tests.helpers.spark_processors import (
    COUNT_OUT,
    DELAY,
    PANDAS_OUT,
    SESSION_OUT,
    TOP_OUT,
    Alarm,
    Expiring,
    PandasCount,
    RunningCount,
    Sessions,
    TopTwo,
    batches,
    no_rows,
    write_batches,
)

ROOT = Path(__file__).resolve().parents[1]
NUM_BINS = 16
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PANDAS = "transformWithStateInPandas"
#: Per case: the processor, its output, time mode and the Spark API it is written for.
CASES = {
    "count": (RunningCount, COUNT_OUT, "None", "transformWithState"),
    "sessions": (Sessions, SESSION_OUT, "EventTime", "transformWithState"),
    "top": (TopTwo, TOP_OUT, "None", "transformWithState"),
    "pandas_count": (PandasCount, PANDAS_OUT, "None", PANDAS),
}


#: Spark's outputs per processor, run once per session (the batches are always the same).
_SPARK_OUTPUTS: dict[str, Counter] = {}


def in_spark(spark, files: Path, tmp: Path, name: str) -> Counter:
    """The processor's outputs in Spark's ``transformWithState`` (or
    ``transformWithStateInPandas``) over the file stream (one file per batch), as a multiset
    of tuples."""
    if name not in _SPARK_OUTPUTS:
        _SPARK_OUTPUTS[name] = _run_spark(spark, files, tmp, name)
    return _SPARK_OUTPUTS[name]


def _run_spark(spark, files: Path, tmp: Path, name: str) -> Counter:
    cls, out, mode, api = CASES[name]
    saved = spark.conf.get(PROVIDER, None)
    spark.conf.set(PROVIDER, ROCKSDB)
    rows: list[Row] = []
    try:
        stream = spark.readStream.schema(spark.read.parquet(str(files)).schema) \
            .option("maxFilesPerTrigger", 1).parquet(str(files))
        if mode == "EventTime":
            stream = stream.withWatermark("time", DELAY)
        grouped = stream.groupBy("id")
        run = grouped.transformWithStateInPandas if api == PANDAS else \
            grouped.transformWithState
        result = run(cls(), out, "Update", mode)
        query = result.writeStream.foreachBatch(lambda df, _: rows.extend(df.collect())) \
            .option("checkpointLocation", str(tmp / f"cp-{name}")).trigger(availableNow=True) \
            .start()
        query.awaitTermination()
    finally:
        if saved is None:
            spark.conf.unset(PROVIDER)
        else:
            spark.conf.set(PROVIDER, saved)
    return Counter(tuple(r) for r in rows)


def scale_plans(pipe: Pipeline, rng: random.Random) -> dict[int, list]:
    """Before epoch 1, a random half of the bins (two of the keys' bins among the first step's)
    move out to workers 2 and 3 (two steps);
    before epoch 3 every bin there moves back to workers 0 and 1."""
    owners = pipe.routing.owners(max(pipe.epoch, 0)).tolist()
    used = sorted({int(b) for b in bin_of([f"k{i}" for i in range(5)], NUM_BINS)})
    rest = [b for b in range(NUM_BINS) if b not in used]
    out_bins = [*rng.sample(used, 2), *rng.sample(rest, NUM_BINS // 2 - 2)]
    first = [(b, owners[b], 2 + i % 2) for i, b in enumerate(out_bins)]
    back = [(b, 2 + i % 2, rng.choice([0, 1])) for i, b in enumerate(out_bins)]
    half = len(first) // 2
    return {1: [(0, first[:half]), (1, first[half:])], 3: [(0, back)]}


def submit(pipe: Pipeline, steps: list) -> None:
    plan = MigrationPlan(pipe.fingerprint, pipe._holder.plans.end_version(),
                         tuple(PlanStep(e, tuple(Move(*m) for m in ms)) for e, ms in steps))
    pipe.migrate(plan)


def in_megaphone(spark, paths: list[Path], tmp: Path, name: str, seed: int) -> Counter:
    """The processor's outputs in a megaphone pipeline fed the same batches (plus one empty
    batch, where Spark runs its no-data batch), with bins moving out and back."""
    cls, out, mode, api = CASES[name]
    event = {"event_time": "time", "watermark_delay": DELAY} if mode == "EventTime" else {}
    pipe = Pipeline(spark, str(tmp / f"mp-{name}"), key="id", update=cls(), output_type=out,
                    time_mode=mode, workers=2, num_bins=NUM_BINS, key_type="str",
                    processor_api=api, **event)
    plans = scale_plans(pipe, random.Random(seed))
    got: list[tuple] = []
    batch_frames = [spark.read.parquet(str(p)) for p in paths]
    batch_frames.append(no_rows(batch_frames[0]))
    for epoch, frame in enumerate(batch_frames):
        if epoch in plans:
            submit(pipe, plans[epoch])
        got += [tuple(r.output) for r in pipe.process(frame).collect()]
        if epoch == 2:
            check_state_moved(pipe, plans[1], name)
    assert set(pipe.routing.owners(pipe.epoch).tolist()) <= {0, 1}  # scaled back in
    pipe.close()
    return Counter(got)


def bins_at(pipe: Pipeline) -> dict[int, set[int]]:
    """The bins each worker's store holds keys of (state or timers), read read-only."""
    state = pipe.state_dir
    fp = state.fingerprint
    out = {}
    for w in state.worker_ids():
        backend = open_backend("rocksdb", state.paths.worker(w), fp.key_type, fp.num_bins,
                               read_only=True)
        try:
            out[w] = {b for b, s in backend.bin_stats().items() if s.keys}
        finally:
            backend.close()
    return out


def check_state_moved(pipe: Pipeline, steps: list, name: str) -> None:
    """After the first step's epoch and one more: its bins' keys are at their new owners and
    gone from the old ones; a session key's state holds its timer."""
    held = bins_at(pipe)
    moved = [(b, src, dst) for b, src, dst in steps[0][1]]
    assert any(b in held[dst] for b, _, dst in moved)  # some moved bin holds state
    for b, src, _ in moved:
        assert b not in held[src]
    states = {r[0]: msgpack.unpackb(r[1]) for r in pipe.state().collect()}
    assert states
    if name == "sessions":
        assert all(s.get("t") for s in states.values())  # every open session has its timer


@pytest.mark.parametrize("name", sorted(CASES))
def test_processor_equals_spark_transform_with_state(spark, tmp_path, name):
    rows = batches()
    paths = write_batches(tmp_path / "in", rows)
    expected = in_spark(spark, tmp_path / "in", tmp_path, name)
    assert expected  # the processor emits something
    seed = random.randrange(1 << 30)
    got = in_megaphone(spark, paths, tmp_path, name, seed)
    assert got == expected, f"seed {seed}"


class _WithTtl(RunningCount):
    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long", ttlDurationMs=0)


class _WithInitialState(RunningCount):
    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        self.count.update((initialState.n,))


class _TimerInInit(RunningCount):
    def init(self, handle: Any) -> None:
        handle.registerTimer(1)


@pytest.mark.parametrize("update, kwargs, message", [
    (RunningCount(), {"time_mode": "Event"}, "time_mode must be one of"),
    (RunningCount(), {}, "needs time_mode"),
    (RunningCount(), {"time_mode": "EventTime"}, "needs the event_time column"),
    (RunningCount(), {"time_mode": "None", "event_time": "time"}, "uses no event time"),
    (_WithTtl(), {"time_mode": "None"}, "ttlDurationMs must be a positive"),
    (_WithInitialState(), {"time_mode": "None"}, "initial state is not supported"),
    (_TimerInInit(), {"time_mode": "EventTime", "event_time": "time"}, "not in init"),
    ("count", {"time_mode": "None"}, "are for a Spark StatefulProcessor"),
    ("count", {"processor_api": PANDAS}, "are for a Spark StatefulProcessor"),
    (PandasCount(), {"time_mode": "None", "processor_api": "pandas"},
     "processor_api must be one of"),
])
def test_unsupported_features_are_refused_at_construction(spark, tmp_path, update, kwargs,
                                                          message):
    with pytest.raises((ValueError, TypeError), match=message):
        Pipeline(spark, str(tmp_path / "s"), key="id", update=update, output_type=COUNT_OUT,
                 **kwargs)
    assert not (tmp_path / "s").exists()


def test_a_timer_in_time_mode_none_fails_the_epoch_as_in_spark(spark, tmp_path):
    class TimerNoTime(RunningCount):
        def handleInputRows(self, key, rows, timerValues):
            self.handle_.registerTimer(5)
            return iter([])

        def init(self, handle):
            self.handle_ = handle

    assert isinstance(TimerNoTime(), StatefulProcessor)
    pipe = Pipeline(spark, str(tmp_path / "s"), key="id", update=TimerNoTime(),
                    output_type=COUNT_OUT, time_mode="None", num_bins=NUM_BINS)
    from megaphone import UpdateError
    with pytest.raises(UpdateError, match="timers need time_mode 'EventTime'"):
        pipe.process(spark.createDataFrame([("a",)], "id string"))
    assert pipe.epoch == -1
    pipe.close()


@pytest.mark.slow
def test_a_driver_crash_changes_nothing(spark, tmp_path):
    """The session processor, killed at the commit of a migrating epoch, resumed: the same
    outputs as Spark's."""
    paths = write_batches(tmp_path / "in", batches())
    expected = in_spark(spark, tmp_path / "in", tmp_path, "sessions")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEGAPHONE_LOCAL_DIR": str(tmp_path / "local")}
    args = [sys.executable, "-m", "tests.helpers.processor_driver", str(tmp_path / "state"),
            str(tmp_path / "out.json"), *map(str, paths)]
    crashed = subprocess.run(args, cwd=ROOT, env={**env, "MEGAPHONE_CRASH_AT": "commit:2"},
                             start_new_session=True, capture_output=True, text=True,
                             timeout=300)
    assert crashed.returncode != 0 and not (tmp_path / "out.json").exists(), crashed.stderr
    resumed = subprocess.run(args, cwd=ROOT, env=env, start_new_session=True,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = Counter(tuple(r) for r in json.loads((tmp_path / "out.json").read_text()))
    assert got == expected


def test_the_readme_example_runs(spark, capsys):
    """The README's example, run as it stands (its spark_session() finds the test session)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Already have a `transformWithState` processor?")[1]
    code = section.split("```python\n")[1].split("```")[0]
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    assert capsys.readouterr().out.strip().endswith("[('a', 2), ('b', 1)]")


class _Recent(StatefulProcessor):
    """Keeps the key's last two scores in a ListState and emits them as a pandas frame; a
    timer 1 s after each row; close is counted."""

    closed = 0

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.recent = handle.getListState("recent", "score long")

    def handleInputRows(self, key, rows, timerValues):
        import pandas as pd

        for row in rows:
            self.recent.appendValue((row.score,))
            self.handle.registerTimer(int(row.time.timestamp() * 1000) + 1000)
        self.recent.put(list(self.recent.get())[-2:])
        yield pd.DataFrame({"id": [key[0]] * 2, "score": [s for (s,) in self.recent.get()]
                            + [None] * (2 - len(list(self.recent.get())))})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield Row(id=key[0], score=-expiredTimerInfo.getExpiryTimeInMs())

    def close(self) -> None:
        type(self).closed += 1


def test_list_state_pandas_outputs_timer_order_and_close_without_spark():
    """Per key: rows first, then the timers that expired (time < watermark, in ms), each once,
    then deleted; the state value holds the list and the timers; close once per epoch."""

    import pyarrow as pa

    from megaphone.operators.process import Context, run_keys
    from megaphone.operators.stateful_processor import TransformWithState

    fn = TransformWithState(_Recent(), _struct(), "EventTime", 0)
    fn.output_type(pa.struct([("id", pa.string()), ("time", pa.timestamp("us", tz="UTC")),
                              ("score", pa.int64())]))
    _Recent.closed = 0
    t0 = 1_000_000_000  # us
    rows = [[(t0 + i * 1000, {"id": "a", "time": t0 + i * 1000, "score": i}) for i in range(3)]]
    ctx = Context(0, None)
    first = run_keys(fn, ["a"], [[]], rows, [None], ctx)
    assert [v["score"] for v in first.out_values] == [1, 2]
    state = first.states[0]
    assert state["l"]["recent"] == [[1], [2]] and state["t"] == [1001000 + i for i in (0, 1, 2)]
    assert first.set[0] == {(t + 1) * 1000 for t in state["t"]}
    # Watermark 1,001,002 ms: timers ...000 and ...001 expired (strictly before it), ...002
    # not yet; one megaphone wake-up fires both, in time order.
    ctx = Context(1, 1_001_002_000)
    second = run_keys(fn, ["a"], [[1_001_001_000]], [[]], [state], ctx)
    assert [v["score"] for v in second.out_values] == [-1_001_000, -1_001_001]
    assert second.states[0]["t"] == [1_001_002] and _Recent.closed == 2


def _struct() -> StructType:
    from pyspark.sql.types import LongType, StringType, StructField

    return StructType([StructField("id", StringType()), StructField("score", LongType())])


def test_a_state_directory_is_not_reopened_with_another_processor(spark, tmp_path):
    pipe = Pipeline(spark, str(tmp_path / "s"), key="id", update=RunningCount(),
                    output_type=COUNT_OUT, time_mode="None", num_bins=NUM_BINS)
    pipe.process(spark.createDataFrame([("a",)], "id string"))
    pipe.close()
    with pytest.raises(ValueError, match=r"another pipeline configuration.*TopTwo"):
        Pipeline(spark, str(tmp_path / "s"), key="id", update=TopTwo(), output_type=TOP_OUT,
                 time_mode="None", num_bins=NUM_BINS)
    with pytest.raises(ValueError, match=r"another pipeline configuration.*InPandas"):
        Pipeline(spark, str(tmp_path / "s"), key="id", update=RunningCount(),
                 output_type=COUNT_OUT, time_mode="None", num_bins=NUM_BINS,
                 processor_api=PANDAS)
    again = Pipeline(spark, str(tmp_path / "s"), key="id", update=RunningCount(),
                     output_type=COUNT_OUT, time_mode="None", num_bins=NUM_BINS)
    assert again.epoch == 0
    again.close()


def test_a_pandas_processor_gets_one_frame_per_key_and_must_yield_frames():
    """In pandas mode the key's rows come as one frame (Spark's columns, dtypes and index);
    a Row yielded is refused, as Spark refuses it."""
    import pandas as pd
    import pyarrow as pa

    from megaphone.operators.process import Context, run_keys
    from megaphone.operators.stateful_processor import TransformWithState

    seen: list[pd.DataFrame] = []

    class Rows(RunningCount):
        def handleInputRows(self, key, rows, timerValues):
            seen.extend(rows)
            yield Row(id=key[0], count=1)

    fn = TransformWithState(Rows(), _struct(), "None", 0, PANDAS, "Asia/Tokyo")
    fn.output_type(pa.struct([("id", pa.string()), ("time", pa.timestamp("us", tz="UTC")),
                              ("my score", pa.int64())]))
    rows = [[(0, {"id": "a", "time": 0, "my score": 3}),
             (0, {"id": "a", "time": 1_000_000, "my score": None})]]
    with pytest.raises(ValueError, match="must yield pandas DataFrames, got a Row"):
        run_keys(fn, ["a"], [[]], rows, [None], Context(0, None))
    (frame,) = seen
    assert list(frame.columns) == ["id", "time", "_2"]  # Spark's itertuples names
    assert [str(t) for t in frame.dtypes] == ["object", "datetime64[ns]", "float64"]
    assert frame["time"].tolist() == [pd.Timestamp("1970-01-01 09:00:00"),
                                      pd.Timestamp("1970-01-01 09:00:01")]  # session zone
    assert isinstance(frame.index, pd.RangeIndex) and len(frame) == 2


def _at(pipe: Pipeline, spark, clock: list[float], seconds: float, ids: list[str]
        ) -> list[tuple]:
    """One epoch at processing time ``seconds`` over rows of ``ids``: its outputs."""
    clock[0] = seconds
    out = pipe.process(spark.createDataFrame([(i,) for i in ids], "id string"))
    return sorted(tuple(r.output) for r in out.collect())


def test_processing_time_timers_fire_in_the_first_epoch_past_their_expiry(
        spark, tmp_path, monkeypatch):
    """getCurrentProcessingTimeInMs is the driver's clock at the epoch; a timer fires, for a
    key without rows, in the first epoch whose processing time is > its expiry (Spark's
    ``expiry < batch timestamp``), once."""
    from megaphone.migrator.epoch import run

    clock = [1000.0]
    monkeypatch.setattr(run, "processing_clock", lambda: clock[0])
    pipe = Pipeline(spark, str(tmp_path / "s"), key="id", update=Alarm(),
                    output_type=COUNT_OUT, time_mode="ProcessingTime", num_bins=NUM_BINS)
    assert _at(pipe, spark, clock, 1000.0, ["a"]) == [("a", 1_000_000)]
    assert _at(pipe, spark, clock, 1005.0, ["b"]) == [("b", 1_005_000)]  # not < 1,005,000
    assert _at(pipe, spark, clock, 1005.001, ["c"]) == [("a", -1_005_000), ("c", 1_005_001)]
    assert _at(pipe, spark, clock, 1010.001, ["c"]) == [("b", -1_010_000), ("c", 1_010_001)]
    pipe.close()


def test_state_ttl_expires_each_value_list_element_and_map_entry_on_its_own(
        spark, tmp_path, monkeypatch):
    """Spark's TTL: written at processing time t with TTL d, an entry is gone once the
    processing time is >= t + d; each list element and map entry has its own expiry, an
    update restarts it; in time mode None the processor still sees -1 as the time."""
    from megaphone.migrator.epoch import run

    clock = [0.0]
    monkeypatch.setattr(run, "processing_clock", lambda: clock[0])
    pipe = Pipeline(spark, str(tmp_path / "s"), key="id", update=Expiring(),
                    output_type=COUNT_OUT, time_mode="None", num_bins=NUM_BINS)

    def seen(seconds: float, n: int) -> dict[str, int]:
        clock[0] = seconds
        out = pipe.process(spark.createDataFrame([("a", n)], "id string, n long"))
        return {r.output.id: r.output["count"] for r in out.collect()}

    assert seen(100.0, 2) == {"value": -1, "list": 0, "map": 0, "now": -1}
    assert seen(100.5, 4) == {"value": 2, "list": 2, "map": 2, "now": -1}
    # 2 written at 100.0 expires at 101.0; 4 (written at 100.5) lives until 101.5.
    assert seen(101.0, 1) == {"value": 4, "list": 4, "map": 4, "now": -1}
    assert seen(101.499, 1) == {"value": 4, "list": 4, "map": 4, "now": -1}
    assert pipe.state().count() == 1
    assert seen(101.5, 1) == {"value": -1, "list": 0, "map": 0, "now": -1}
    assert pipe.state().count() == 0  # all expired: the key's state is deleted
    pipe.close()


def test_ttl_expiries_are_stored_beside_values_and_dropped_on_read():
    """The key's value keeps each entry's expiry; decoding at a later processing time drops
    the expired ones, and a key left with nothing is deleted."""
    from megaphone.operators.processor_handle import KeyState

    ks = KeyState({"v": {"v": [1]}, "ve": {"v": 10},
                   "l": {"l": [[1], [2], [3]]}, "le": {"l": [10, None, 20]},
                   "m": {"m": [[[1], [1]], [[2], [2]]]}, "me": {"m": [20, 10]}})
    assert ks.values == {"v": (1,)} and ks.lists["l"] == [(1,), (2,), (3,)]
    ks = KeyState(KeyState(ks.encode()).encode(), now_ms=10)
    assert ks.values == {} and ks.lists["l"] == [(2,), (3,)] and ks.maps["m"] == {(1,): (1,)}
    assert ks.encode() == {"l": {"l": [[2], [3]]}, "le": {"l": [None, 20]},
                           "m": {"m": [[[1], [1]]]}, "me": {"m": [20]}}
    assert KeyState({"v": {"v": [1]}, "ve": {"v": 10}}, now_ms=10).encode() is None
