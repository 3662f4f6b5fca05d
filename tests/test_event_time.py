"""Event-time operators on Spark: windows and joins through random migration plans (scale out
and in, both backends, bins as rows or files) equal the plain-Python references of
tests/helpers/operator_reference.py; chains of pipelines; bad input refused."""

from __future__ import annotations

import datetime as dt
import math
import tempfile
import uuid
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from megaphone import (
    Chain,
    Join,
    MigrationPlan,
    Move,
    Pipeline,
    PlanStep,
    WindowAggregate,
    join_input,
)
from tests.helpers.operator_reference import join_reference, window_reference
from tests.test_equivalence import SPARK_PHASES

NUM_BINS = 16
# Windows align to the Unix epoch, the reference's to T0: T0 is a multiple of every window
# size and slide drawn (2..12 s: lcm 27,720 s). Midnight alone is not one of 11 s.
EPOCH0 = dt.datetime(2026, 1, 1, 2, 6, tzinfo=dt.timezone.utc)
T0 = int(EPOCH0.timestamp() * 1e6)  # event times: seconds after T0, in microseconds
assert (T0 // 1_000_000) % math.lcm(*range(2, 13)) == 0
SECOND = 1_000_000


def ts(seconds: int) -> dt.datetime:
    return EPOCH0 + dt.timedelta(seconds=seconds)


@st.composite
def plans_for(draw, epochs: int, workers: int):
    """Before each epoch, maybe a plan of random valid moves (scale out to 4 workers and in)."""
    owners = [b * workers // NUM_BINS for b in range(NUM_BINS)]  # contiguous ranges
    plans = []
    for _ in range(epochs):
        steps = []
        for offset in range(draw(st.integers(0, 2))):
            bins = draw(st.lists(st.integers(0, NUM_BINS - 1), min_size=1, max_size=4,
                                 unique=True))
            moves = []
            for b in bins:
                dst = draw(st.sampled_from([w for w in range(4) if w != owners[b]]))
                moves.append((b, owners[b], dst))
                owners[b] = dst
            steps.append((offset, moves))
        plans.append(steps)
    return plans


def submit(pipe: Pipeline, steps: list) -> None:
    if steps:
        plan = MigrationPlan(pipe.fingerprint, pipe._holder.plans.end_version(),
                             tuple(PlanStep(e, tuple(Move(*m) for m in ms)) for e, ms in steps))
        pipe.migrate(plan)


@st.composite
def window_scenarios(draw):
    epochs = draw(st.integers(2, 4))
    keys = st.sampled_from(["a", "b", "c", "d", None])
    batches = [draw(st.lists(st.tuples(keys, st.integers(0, 40), st.integers(-5, 9)),
                             max_size=12)) for _ in range(epochs)]
    return {
        "batches": batches,
        "plans": draw(plans_for(epochs, 2)),
        "agg": draw(st.sampled_from(["count", "sum", "max", "avg"])),
        "size": draw(st.integers(2, 12)),
        "slide_div": draw(st.integers(1, 2)),
        "lateness": draw(st.integers(0, 6)),
        "backend": draw(st.sampled_from(["memory", "rocksdb"])),
        "transfer": draw(st.sampled_from(["rows", "files"])),
    }


@settings(phases=SPARK_PHASES, max_examples=8)
@given(window_scenarios())
def test_windows_with_migrations_equal_the_reference(spark, scenario):
    size = scenario["size"] * SECOND
    slide = max(SECOND, (scenario["size"] // scenario["slide_div"]) * SECOND)
    lateness = scenario["lateness"] * SECOND
    fn = WindowAggregate(size_us=size, slide_us=slide, agg=scenario["agg"], lateness_us=lateness)
    with tempfile.TemporaryDirectory() as state_dir:
        pipe = Pipeline(spark, state_dir, key="k", value="v", event_time="t", update=fn,
                        workers=2, num_bins=NUM_BINS, backend=scenario["backend"],
                        key_type="str", pipeline_id=uuid.uuid4().hex,
                        transfer=scenario["transfer"])
        got: Counter = Counter()
        late = 0
        for batch, steps in zip(scenario["batches"], scenario["plans"], strict=True):
            submit(pipe, steps)
            df = spark.createDataFrame([(k, ts(t), v) for k, t, v in batch],
                                       "k string, t timestamp, v long")
            for row in pipe.process(df).collect():
                end = int(row.output.end.timestamp() * 1e6) - T0
                got[(row.k, end, _nan(row.output.value))] += 1
            late += pipe.metrics()[-1]["late_records"]
        epochs = [[(k, t * SECOND, v) for k, t, v in b] for b in scenario["batches"]]
        expected, closed, expected_late = window_reference(
            epochs, size, slide, scenario["agg"], lateness)
        assert got == Counter((k, e, _nan(expected[(k, e)])) for k, e in closed)
        assert late == expected_late
        # every window not closed yet is in the state, at exactly one worker
        assert len(pipe.state().collect()) == len({k for k, e in expected
                                                   if (k, e) not in closed})
        pipe.close()


@st.composite
def join_scenarios(draw):
    epochs = draw(st.integers(2, 4))
    record = st.tuples(st.integers(1, 5), st.integers(0, 30), st.sampled_from(["left", "right"]),
                       st.integers(0, 3))
    return {
        "batches": [draw(st.lists(record, max_size=10)) for _ in range(epochs)],
        "plans": draw(plans_for(epochs, 2)),
        "how": draw(st.sampled_from(["inner", "left"])),
        "bound": draw(st.sampled_from(["within", "window"])),
        "span": draw(st.integers(1, 10)),
        "backend": draw(st.sampled_from(["memory", "rocksdb"])),
    }


@settings(phases=SPARK_PHASES, max_examples=8)
@given(join_scenarios())
def test_joins_with_migrations_equal_the_reference(spark, scenario):
    span = scenario["span"] * SECOND
    fn = Join(how=scenario["how"], **{f"{scenario['bound']}_us": span})
    with tempfile.TemporaryDirectory() as state_dir:
        pipe = Pipeline(spark, state_dir, key="key", value="value", event_time="time",
                        update=fn, workers=2, num_bins=NUM_BINS, backend=scenario["backend"],
                        key_type="int64", pipeline_id=uuid.uuid4().hex)
        got: Counter = Counter()
        for batch, steps in zip(scenario["batches"], scenario["plans"], strict=True):
            submit(pipe, steps)
            people = spark.createDataFrame(
                [(k, ts(t), x) for k, t, side, x in batch if side == "left"],
                "id long, at timestamp, x long")
            sales = spark.createDataFrame(
                [(k, ts(t), x) for k, t, side, x in batch if side == "right"],
                "seller long, at timestamp, y long")
            for row in pipe.process(join_input(people, sales, "id", "seller", "at")).collect():
                left = None if row.output.left is None else (row.output.left.id,
                                                             row.output.left.x)
                right = None if row.output.right is None else (row.output.right.seller,
                                                               row.output.right.y)
                got[(row.key, left, right)] += 1
        epochs = [[(k, t * SECOND, side, (k, x)) for k, t, side, x in b]
                  for b in scenario["batches"]]
        want, _ = join_reference(epochs, scenario["how"],
                                 **{scenario["bound"]: span})
        assert got == want
        pipe.close()


def test_chain_of_window_and_aggregate(spark):
    """NEXMark Q7's shape: the highest value per tumbling window, as a window max per key
    chained into a max per window; the second stage migrates on its own."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        windows = Pipeline(spark, a, key="k", value="v", event_time="t", num_bins=NUM_BINS,
                           update=WindowAggregate(size_us=10 * SECOND, agg="max"))
        best = Pipeline(spark, b, key="end", value="v", update="max", num_bins=NUM_BINS)
        chain = Chain([windows, best], [lambda out: out.select(
            F.unix_micros(out.output.end).alias("end"), out.output.value.alias("v"))])
        rows = [[("a", 1, 5), ("b", 2, 7), ("a", 12, 1)], [("c", 15, 4), ("a", 25, 2)],
                [("b", 31, 3)]]
        outputs = []
        for i, batch in enumerate(rows):
            if i == 1:
                best.migrate(MigrationPlan.from_moves(best.routing, [[
                    Move(b, best.routing.owner(b), 2) for b in range(0, NUM_BINS, 3)]]))
            df = spark.createDataFrame([(k, ts(t), v) for k, t, v in batch],
                                       "k string, t timestamp, v long")
            outputs += [(r.end - T0, r.max) for r in chain.process(df).collect()]
        assert sorted(outputs) == [(10 * SECOND, 7), (20 * SECOND, 4)]
        assert chain.epoch == 2
        chain.close()


def test_chain_refuses_stages_out_of_step(spark):
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        first = Pipeline(spark, a, key="k", update="count", key_type="str", num_bins=NUM_BINS)
        second = Pipeline(spark, b, key="k", update="count", key_type="str", num_bins=NUM_BINS)
        df = spark.createDataFrame([("x",)], "k string")
        first.process(df)
        first.process(df)
        with pytest.raises(ValueError, match="epochs"):
            Chain([first, second])
        first.close()
        second.close()


def test_event_time_operator_needs_an_event_time_column(spark, tmp_path):
    with pytest.raises(ValueError, match="event_time"):
        Pipeline(spark, str(tmp_path / "s"), key="k", update=WindowAggregate(size_us=10))


def test_join_needs_a_join_input(spark, tmp_path):
    pipe = Pipeline(spark, str(tmp_path / "s"), key="k", value="v", event_time="t",
                    update=Join(), num_bins=NUM_BINS)
    with pytest.raises(TypeError, match="struct<left, right>"):
        pipe.process(spark.createDataFrame([("x", ts(1), 1)], "k string, t timestamp, v long"))
    pipe.close()


def _nan(v):
    return "nan" if isinstance(v, float) and math.isnan(v) else v


def test_reopening_with_another_window_is_refused(spark, tmp_path):
    state_dir = str(tmp_path / "s")
    pipe = Pipeline(spark, state_dir, key="k", event_time="t", key_type="str",
                    update=WindowAggregate(size_us=10 * SECOND), num_bins=NUM_BINS)
    pipe.close()
    with pytest.raises(ValueError, match="another pipeline configuration"):
        Pipeline(spark, state_dir, key="k", event_time="t", num_bins=NUM_BINS,
                 update=WindowAggregate(size_us=20 * SECOND))
    reopened = Pipeline(spark, state_dir, key="k", event_time="t", num_bins=NUM_BINS,
                        update=WindowAggregate(size_us=10 * SECOND))
    reopened.close()
