"""Dual mode with Spark: splitting hot keys changes where the work runs, never the results.

Property: with random plans (migrations, adaptive policies), every update kind that can be
split, and a split policy that picks random keys (one of them made hot) and a random number of
lessees at every epoch, outputs and final state equal the plain Python reference of
:mod:`tests.test_equivalence`. An epoch that fails after some workers committed it runs again
under another split with the same results; updates that cannot be split are refused.
"""

from __future__ import annotations

import random
import sys
import tempfile
import uuid
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

from megaphone import Combiner, HotSplit, Pipeline, UpdateError
from megaphone.inspect_cmd import describe, render
from megaphone.plans.hot_keys import HotKeyView
from tests.test_equivalence import SPARK_PHASES, reference, run_scenario, scenarios

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Squares(Combiner):
    """Running count and sum of squares, emits the count: ``custom_update`` as a combiner."""

    def fold(self, key, values):
        return [len(values), sum(v * v for v in values)]

    def combine(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]

    def outputs(self, key, state):
        return [state[0] * 1000 + state[1] % 1000]


def random_split(keys: list, seed: int):
    """A split policy choosing a random subset of ``keys`` and of lessees at each epoch."""
    rng = random.Random(seed)

    def policy(view: HotKeyView) -> HotSplit:
        assert view.splittable
        chosen = tuple(k for k in keys if rng.random() < 0.6)
        return HotSplit(chosen, rng.choice([None, 1, 2, 3]))

    return policy


def with_hot_key(scenario: dict, seed: int) -> dict:
    """The scenario with one key made hot: as many extra records of it as each batch has."""
    rng = random.Random(seed)
    keys = sorted({k for b in scenario["batches"] for k, _ in b if k is not None}, key=repr)
    values = [v for b in scenario["batches"] for _, v in b]
    if not keys or not values:
        return scenario
    hot = rng.choice(keys)
    batches = []
    for batch in scenario["batches"]:
        batch = batch + [(hot, rng.choice(values)) for _ in range(len(batch) + 4)]
        rng.shuffle(batch)
        batches.append(batch)
    return {**scenario, "batches": batches}


@settings(max_examples=3, phases=SPARK_PHASES)
@given(scenarios(), st.integers(0, 2**16))
def test_split_outputs_and_state_equal_a_run_without_migration(spark, scenario, seed):
    scenario = with_hot_key(scenario, seed)
    keys = sorted({k for b in scenario["batches"] for k, _ in b if k is not None}, key=repr)
    run_scenario(spark, scenario, custom=Squares(),
                 prepare=lambda pipe: pipe.split_hot_keys(random_split(keys, seed)))


class FailsOnce(Squares):
    """Squares whose ``outputs`` raises once for key 7 past 30 records (in epoch 1; a marker
    file remembers it did)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def outputs(self, key, state):
        if key == 7 and state[0] > 30 and not Path(self.marker).exists():
            Path(self.marker).touch()
            raise RuntimeError("injected failure")
        return super().outputs(key, state)


def test_an_epoch_that_failed_midway_reruns_under_another_split_alike(spark, tmp_path):
    """Epoch 1 fails at key 7's owner after the other worker may have committed it; its rerun
    splits other keys, and outputs and state are still the reference's."""
    batches = [[(k % 5, k) for k in range(40)] + [(7, 1)] * 30,
               [(7, k) for k in range(50)] + [(k, k) for k in range(10)],
               [(3, 2)] * 20 + [(7, 3)]]
    expected, state = reference("custom", batches)
    splits = iter([(7,), (7, 3), (3,), (3,)])

    def policy(view: HotKeyView) -> HotSplit:
        return HotSplit(next(splits, ()), 2)

    pipe = Pipeline(spark, str(tmp_path / "p"), key="k", value="v",
                    update=FailsOnce(str(tmp_path / "failed")), workers=2, num_bins=16,
                    backend="memory", key_type="int64", pipeline_id=uuid.uuid4().hex,
                    output_type="bigint")
    pipe.split_hot_keys(policy)
    frame = "k long, v long"
    out = pipe.process(spark.createDataFrame(batches[0], frame)).collect()
    assert dict(map(tuple, out)) == expected[0]
    with pytest.raises(UpdateError, match="injected failure"):
        pipe.process(spark.createDataFrame(batches[1], frame))
    assert pipe.epoch == 0
    for batch, want in zip(batches[1:], expected[1:], strict=True):
        out = pipe.process(spark.createDataFrame(batch, frame)).collect()
        assert dict(map(tuple, out)) == want
    assert {r[0]: msgpack.unpackb(r[1]) for r in pipe.state().collect()} == state
    last = pipe.metrics()[-1]
    assert last["split_records"] == 20  # key 3's records were folded by lessees
    assert pipe.hot_keys().counters[0][0] in (3, 7)
    pipe.close()
    info = describe(str(tmp_path / "p"))  # megaphone inspect shows the committed summary
    assert [h["key"] for h in info["hot_keys"]][:2] == [k for k, _, _ in
                                                         pipe.hot_keys().counters[:2]]
    assert "hot key" in render(info)


def test_updates_that_may_depend_on_order_are_refused(spark):
    def f(key, values, state):
        return state, []

    with tempfile.TemporaryDirectory() as d:
        pipe = Pipeline(spark, d, key="k", value="v", update=f, workers=2, num_bins=16,
                        backend="memory", key_type="int64")
        with pytest.raises(ValueError, match="cannot split the hot keys"):
            pipe.split_hot_keys()
        pipe.watch_hot_keys(capacity=4)  # detection only: sequential mode
        pipe.process(spark.createDataFrame([(1, 1)] * 5 + [(2, 2)], "k long, v long"))
        assert pipe.metrics()[-1]["hot_keys"][0][:2] == [1, 5.0]
        assert pipe.metrics()[-1]["split_records"] == 0
        pipe.close()
    with tempfile.TemporaryDirectory() as d:
        pipe = Pipeline(spark, d, key="k", update="count", workers=2, num_bins=16,
                        backend="memory", key_type="int64")
        pipe.split_hot_keys(lambda view: HotSplit(("a",)))  # a str key for int64 keys
        with pytest.raises(ValueError, match="must be a int"):
            pipe.process(spark.createDataFrame([(1,)], "k long"))
        assert pipe.epoch == -1  # nothing ran
        pipe.close()


@pytest.mark.parametrize("lessees", [None, 2])
def test_a_group_splits_its_epochs_hot_keys_with_the_same_results(spark, tmp_path, lessees):
    """An epoch is a group of one: a group of epochs splits hot keys too, each epoch's
    partials carrying its label, and its outputs and state are those of a run without split."""
    batches = [[(1, 1)] * 6 + [(2, 2), (3, None)], [(1, 2)] * 5 + [(4, 1)], [(2, 5), (1, 1)]]
    labels = [10, 11, 13]
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", value="v", update="sum",
                    workers=2, num_bins=16, key_type="int64", group_size=3)
    pipe.split_hot_keys(lambda view: HotSplit((1,), lessees))
    rows = [(k, v, label) for batch, label in zip(batches, labels, strict=True)
            for k, v in batch]
    got: dict[int, dict] = {label: {} for label in labels}
    frame = spark.createDataFrame(rows, "k long, v long, e long")
    for row in pipe.process(frame, epoch_column="e").collect():
        got[row[2]][row[0]] = row[1]
    expected, state = reference("sum", batches)
    assert [got[label] for label in labels] == expected
    records = pipe.metric_records()
    assert [r.group for r in records] == [0, 0, 0]
    assert [sum(m.split_records or 0 for m in r.per_worker.values()) for r in records] == \
        [6, 5, 1]
    assert {r[0]: r[1] for r in pipe.state().collect()} == state
    pipe.close()


class ValueCounts(Combiner):
    """Counts per value: a state keyed by int, which msgpack carries as a map with int keys."""

    def fold(self, key, values):
        out: dict = {}
        for v in values:
            out[v] = out.get(v, 0) + 1
        return out

    def combine(self, a, b):
        return {v: a.get(v, 0) + b.get(v, 0) for v in a.keys() | b.keys()}

    def outputs(self, key, state):
        return [len(state)]


def test_states_and_partials_with_int_map_keys_merge_split_or_not():
    from megaphone.migrator.task.hot_split import Partials, combine_partials
    from megaphone.migrator.task.updates import make_update
    from megaphone.state_backends.encoding import unpack_value

    counts = ValueCounts()
    state, outputs = counts(5, [1, 2, 1], None)
    assert (state, outputs) == ({1: 2, 2: 1}, [2])
    partials = Partials([5, 5], [0, 0], [2, 1], [{2: 1, 3: 1}, {3: 1}])
    new_raw, keys, outs = combine_partials(make_update(counts, None), partials,
                                           [msgpack.packb(state)], 2, 0)
    assert unpack_value(new_raw[0]) == {1: 2, 2: 2, 3: 2} and (keys, outs) == ([5], [3])
