"""Property: with any plans, outputs and final state equal a plain Python run without migration.

Random batches of random keys (int and str, the null key among them: a key of its own, as in
Spark's ``groupBy``, living in bin 0) and values (int and float, null among them for the
built-in aggregations: skipped as Spark skips them), random plans (random bins and epochs, chained
plans queued behind each other, scale out and in, moves back and forth), every update kind,
both backends and bins shipped as rows or as files, checked epoch by epoch against a reference
that knows nothing of workers. The last plan may be adaptive: a random policy (any subset of
the remaining moves at any epoch, including none) or the deadline policy decides at each epoch
which moves start.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import uuid

import msgpack
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

from megaphone import MigrationPlan, Move, Pipeline, PlanStep
from megaphone.plans.deadline import DeadlinePolicy
from megaphone.plans.policy import EpochView

NUM_BINS = 16

# Python workers cannot import this test module: ship custom_update by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def custom_update(key, values, state):
    """An order-insensitive general f: running count and sum of squares, emits the count."""
    count, squares = state if state is not None else (0, 0)
    count += len(values)
    squares += sum(v * v for v in values)
    return [count, squares], [count * 1000 + squares % 1000]


def random_policy(seed: int):
    """A policy that starts a random subset of the remaining moves (maybe none) each epoch."""
    rng = random.Random(seed)

    def policy(view: EpochView) -> list[Move]:
        if view.idle_epochs >= 2:
            return list(view.remaining)
        return [m for m in view.remaining if rng.random() < 0.4]

    return policy


AGGREGATE = {"sum": sum, "min": min, "max": max}


def reference(update: str, batches: list[list[tuple]]) -> tuple[list[dict], dict]:
    """Per-epoch outputs and the final state of a single-process run without migration.

    ``None`` is a key like any (one group, one state, one output), as in Spark's ``groupBy``.
    As Spark's ``sum``/``min``/``max``, a built-in aggregation skips null values and a key
    whose values so far were all null has a null aggregate (an output of ``None``, and no
    state); ``count`` counts records, null values included (Spark's ``count("*")``).
    """
    state: dict = {}
    outputs = []
    for batch in batches:
        grouped: dict = {}
        for key, value in batch:
            grouped.setdefault(key, []).append(value)
        out = {}
        for key, values in grouped.items():
            old = state.get(key)
            if update == "count":
                new = (old or 0) + len(values)
            elif update in AGGREGATE:
                known = [v for v in values if v is not None] + ([] if old is None else [old])
                new = AGGREGATE[update](known) if known else None
            else:
                new, emitted = custom_update(key, values, old)
                out[key] = emitted[0]
                state[key] = new
                continue
            out[key] = new
            if new is not None:
                state[key] = new
        outputs.append(out)
    return outputs, state


@st.composite
def scenarios(draw):
    """Batches, and before each batch maybe a plan (or two chained) of valid random moves."""
    key_type = draw(st.sampled_from(["int64", "str"]))
    raw_keys = st.none() | (  # None: the null key, in bin 0
        st.integers(-(2**63), 2**63 - 1) if key_type == "int64" else st.text(max_size=6))
    keyspace = draw(st.lists(raw_keys, min_size=1, max_size=12, unique=True))
    workers = draw(st.integers(1, 3))
    owners = [b * workers // NUM_BINS for b in range(NUM_BINS)]  # contiguous ranges
    update = draw(st.sampled_from(["count", "sum", "min", "max", "custom"]))
    value_kind = "int" if update == "custom" else draw(st.sampled_from(["int", "float"]))
    values = st.integers(-50, 50)  # floats hold whole numbers: sums are exact in any order
    if value_kind == "float":
        values = values.map(float)
    if update != "custom":  # null values: skipped by the aggregations, counted by count
        values = st.none() | values
    epochs = draw(st.integers(2, 3))
    batches, plans = [], []
    for _ in range(epochs):
        batch = draw(st.lists(st.tuples(st.sampled_from(keyspace), values), max_size=25))
        batches.append(batch)
        submitted = []
        for _ in range(draw(st.integers(0, 2))):
            steps, offset = [], 0
            for _ in range(draw(st.integers(1, 2))):
                # bin 0 (the null key's) is drawn often, so its state moves often
                bins = draw(st.lists(st.just(0) | st.integers(0, NUM_BINS - 1), min_size=1,
                                     max_size=4, unique=True))
                moves = []
                for b in bins:
                    dst = draw(st.sampled_from([w for w in range(5) if w != owners[b]]))
                    moves.append((b, owners[b], dst))
                    owners[b] = dst
                steps.append((offset, moves))
                offset += 1 + draw(st.integers(0, 1))
            submitted.append(steps)
        plans.append(submitted)
    return {
        "key_type": key_type,
        "workers": workers,
        "backend": draw(st.sampled_from(["memory", "rocksdb"])),
        "transfer": draw(st.sampled_from(["auto", "rows", "files"])),
        "update": update,
        "value_kind": value_kind,
        # count reads no value, or one (then its nulls are counted as any record)
        "count_value": draw(st.booleans()),
        "batches": batches,
        "plans": plans,
        "adaptive": draw(st.sampled_from([None, "random", "deadline"])),
        "policy_seed": draw(st.integers(0, 2**16)),
    }


# Shrinking re-runs Spark jobs for minutes; opt in with MEGAPHONE_HYPOTHESIS_SHRINK=1.
SPARK_PHASES = [p for p in Phase if p != Phase.shrink or os.environ.get(
    "MEGAPHONE_HYPOTHESIS_SHRINK")]


# Each example runs a pipeline on Spark for a few seconds; every CI run draws new ones, so
# coverage grows from run to run (MEGAPHONE_SPARK_EXAMPLES=500 for a long run). The explicit
# examples below run in every run besides them.
SPARK_EXAMPLES = int(os.environ.get("MEGAPHONE_SPARK_EXAMPLES", "14"))

#: Scenarios every run checks, between them: each key type with the null key, a custom, a
#: built-in and a count update (null values skipped or counted), both backends, bins shipped
#: as files, rows and either, one to three workers scaled out to five and back, chained plans
#: queued in one epoch, and each kind of last plan (fixed, a random policy, the deadline's).
EXPLICIT = [
    {"key_type": "str", "workers": 3, "backend": "rocksdb", "transfer": "files",
     "update": "custom", "value_kind": "int", "count_value": False,
     "batches": [[("a", 1), (None, 2), ("b", 3), ("a", -4)], [("b", 5), ("", 6), (None, -1)],
                 [("a", 7), ("zz", 0)]],
     "plans": [[[(0, [(0, 0, 3), (6, 1, 4)]), (1, [(0, 3, 1)])]],
               [[(0, [(11, 2, 0), (7, 1, 4)])]], []],
     "adaptive": "deadline", "policy_seed": 0},
    {"key_type": "int64", "workers": 2, "backend": "memory", "transfer": "rows",
     "update": "sum", "value_kind": "float", "count_value": False,
     "batches": [[(2**63 - 1, 1.0), (None, None), (-(2**63), -3.0), (5, None)],
                 [(5, 2.0), (None, 4.0)], [(2**63 - 1, None), (7, 0.0)]],
     "plans": [[[(0, [(0, 0, 2), (11, 1, 0)]), (2, [(9, 1, 3)])]], [], [[(0, [(0, 2, 1)])]]],
     "adaptive": "random", "policy_seed": 7},
    {"key_type": "int64", "workers": 1, "backend": "rocksdb", "transfer": "auto",
     "update": "count", "value_kind": "int", "count_value": True,
     "batches": [[(1, None), (1, 2), (None, 3)], [(2, 1), (None, None)], []],
     "plans": [[[(0, [(0, 0, 1), (1, 0, 2)])], [(0, [(2, 0, 3)]), (1, [(0, 1, 4)])]],
               [[(0, [(1, 2, 0)])]], []],
     "adaptive": None, "policy_seed": 0},
]


@settings(phases=SPARK_PHASES, max_examples=SPARK_EXAMPLES)
@given(scenarios())
@example(EXPLICIT[0])
@example(EXPLICIT[1])
@example(EXPLICIT[2])
def test_outputs_and_state_equal_a_run_without_migration(spark, scenario):
    run_scenario(spark, scenario)


def run_scenario(spark, scenario, custom=custom_update, prepare=None):
    """Run ``scenario`` and check every epoch's outputs and the final state against
    :func:`reference`; ``custom`` is the update run for ``"custom"`` (one that behaves as
    :func:`custom_update`), ``prepare(pipe)`` is called before the first epoch."""
    update = scenario["update"]
    key_type = scenario["key_type"]
    value_type = "double" if scenario["value_kind"] == "float" else "long"
    schema = f"k {'long' if key_type == 'int64' else 'string'}, v {value_type}"
    with tempfile.TemporaryDirectory() as state_dir:
        pipe = Pipeline(
            spark, state_dir, key="k",
            value=None if update == "count" and not scenario["count_value"] else "v",
            update=custom if update == "custom" else update, workers=scenario["workers"],
            num_bins=NUM_BINS, backend=scenario["backend"], key_type=key_type,
            pipeline_id=uuid.uuid4().hex, output_type="bigint", transfer=scenario["transfer"],
        )
        if prepare is not None:
            prepare(pipe)
        expected_outputs, expected_state = reference(update, scenario["batches"])
        handles = []
        last = sum(len(submitted) for submitted in scenario["plans"])
        for batch, submitted, expected in zip(
            scenario["batches"], scenario["plans"], expected_outputs, strict=True
        ):
            base = pipe._holder.plans.end_version()
            for steps in submitted:
                plan = MigrationPlan(
                    pipe.fingerprint, base,
                    tuple(PlanStep(e, tuple(Move(*m) for m in ms)) for e, ms in steps),
                )
                bins = [m.bin for m in plan.moves]
                policy = None
                if len(handles) == last - 1 and len(set(bins)) == len(bins):
                    if scenario["adaptive"] == "random":
                        policy = random_policy(scenario["policy_seed"])
                    elif scenario["adaptive"] == "deadline":
                        policy = DeadlinePolicy(target_latency_s=600.0, min_history=1)
                handles.append(pipe.migrate(plan, policy))
                base = plan.end_version
            out = pipe.process(spark.createDataFrame(batch, schema)).collect()
            assert {row[0]: row[1] for row in out} == expected
            assert len(out) == len(expected)  # one output per touched key, none twice
        # Run empty epochs until every plan has finished, then compare the final state.
        for _ in range(20):
            if all(h.done for h in handles):
                break
            assert pipe.process(spark.createDataFrame([], schema)).count() == 0
        assert all(h.done for h in handles)
        rows = pipe.state().collect()
        state = {row[0]: row[1] for row in rows}
        if update == "custom":
            state = {k: msgpack.unpackb(v) for k, v in state.items()}
        assert state == expected_state
        assert len(rows) == len(state)  # no key held by two workers
