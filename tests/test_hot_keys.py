"""Hot keys without Spark: the heavy-hitter summary's bounds, the split policy and its checks,
the Combiner protocol, and dual mode at the worker (lessees' partials consolidated at the
owner give the outputs, state and metrics of the unsplit records)."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone.migrator.epoch.hot_keys import HotKeys
from megaphone.migrator.epoch.spark_job import split_results
from megaphone.migrator.task import columns as C
from megaphone.migrator.task.hot_split import fold_partials, pass_and_fold, take_partials
from megaphone.migrator.task.spec import EpochSpec, shuffle_schema
from megaphone.migrator.task.state_operator import apply_worker
from megaphone.migrator.task.transfer import rows
from megaphone.migrator.task.updates import UpdateError, make_update
from megaphone.operators.combiner import Combiner
from megaphone.paths import StateDirPaths
from megaphone.plans.hot_keys import HeavyHitters, HotKeyView, HotSplit, ShareThreshold
from megaphone.routing.bins import bin_of
from megaphone.state_backends import open_backend

BINS = 8

counts_per_worker = st.lists(st.dictionaries(st.integers(0, 30), st.integers(1, 100),
                                             max_size=12), min_size=1, max_size=4)


def _check_bounds(summary: HeavyHitters, truth: dict) -> None:
    listed = {k for k, _, _ in summary.counters}
    for key, count, error in summary.counters:
        assert count - error - 1e-9 <= truth.get(key, 0) <= count + 1e-9
    assert all(n <= summary.floor + 1e-9 for k, n in truth.items() if k not in listed)
    assert len(summary.counters) <= summary.capacity


@settings(max_examples=100)
@given(counts_per_worker, counts_per_worker, st.integers(1, 5))
def test_merged_and_smoothed_summaries_bound_every_key(first, second, capacity):
    """Per epoch: workers' summaries merged bound each key's true count; across epochs the
    smoothed summary bounds each key's smoothed count."""
    def epoch(parts):
        truth: dict = {}
        for part in parts:
            for k, n in part.items():
                truth[k] = truth.get(k, 0) + n
        sketches = [HeavyHitters.from_counts(list(p), list(p.values()), sum(p.values()),
                                             capacity) for p in parts]
        merged = HeavyHitters.merge(sketches)
        _check_bounds(merged, truth)
        assert merged.total == sum(truth.values())
        return merged, truth

    s1, t1 = epoch(first)
    s2, t2 = epoch(second)
    smoothed = s1.smoothed(s2, 0.3)
    _check_bounds(smoothed, {k: 0.7 * t1.get(k, 0) + 0.3 * t2.get(k, 0)
                             for k in {*t1, *t2}})
    assert HeavyHitters.from_json(smoothed.to_json()) == smoothed


def test_split_checks_and_the_share_threshold_policy():
    assert HotSplit((3, 1, 3), 2).checked("int64") == HotSplit((1, 3), 2)
    for bad, kind in [(HotSplit((None,)), "int64"), (HotSplit(("a",)), "int64"),
                      (HotSplit((True,)), "int64"), (HotSplit((1,)), "str"),
                      (HotSplit((1,), 0), "int64"), (HotSplit(tuple(range(65))), "int64")]:
        with pytest.raises(ValueError):
            bad.checked(kind)
    hot = HeavyHitters.from_counts(["a", "b", "c"], [6000, 2500, 1500], 10_000)
    policy = ShareThreshold(share=0.2, min_records=1000, lessees=3)
    assert policy(HotKeyView(1, hot, workers=2)) == HotSplit(("a", "b"), 3)
    assert policy(HotKeyView(1, hot, workers=1)) == HotSplit()  # no peer to share with
    assert policy(HotKeyView(1, hot, workers=2, splittable=False)) == HotSplit()
    with pytest.raises(ValueError):
        ShareThreshold(share=0)


class Stats(Combiner):
    """Count, sum and max of a key's values as a tuple (arrives as a list): emits all three."""

    def fold(self, key, values):
        return (len(values), sum(values), max(values))

    def combine(self, a, b):
        return [a[0] + b[0], a[1] + b[1], max(a[2], b[2])]

    def outputs(self, key, state):
        return [f"{key}:{state[0]}:{state[1]}:{state[2]}"]


def test_a_combiner_sees_the_same_objects_split_or_not():
    stats = Stats()
    whole, out = stats(1, [1, 5, 2], None)
    assert whole == [3, 8, 5] and out == ["1:3:8:5"]  # the tuple made the msgpack round trip
    split = stats.merge(whole, [msgpack.unpackb(msgpack.packb(stats.fold(1, v)))
                                for v in ([4], [0, 9])])
    assert split == stats(1, [4, 0, 9], whole)[0] == [6, 21, 9]


SCHEMA = shuffle_schema(pa.int64(), pa.int64(), False)


def _spec(tmp_path, update, out_type, **kw) -> EpochSpec:
    out = pa.schema([("k", pa.int64()), ("o", out_type)])
    return EpochSpec(epoch=0, state_dir=str(tmp_path), backend="memory", key_type="int64",
                     num_bins=BINS, update=update, output_schema=out, chunk_bytes=1 << 16,
                     shuffle_schema=SCHEMA, live=frozenset({0}), sketch_capacity=2, **kw)


def _records(pairs) -> pa.RecordBatch:
    keys = pa.array([k for k, _ in pairs], pa.int64())
    return rows(SCHEMA, len(pairs), {
        C.WORKER: pa.array([0] * len(pairs), pa.int32()),
        C.BIN: pa.array(bin_of(keys, BINS), pa.int32()), C.KEY: keys,
        C.VALUE: pa.array([v for _, v in pairs], pa.int64())}, C.RowKind.RECORD)


def _apply(spec, batches):
    results = split_results(pa.Table.from_batches(list(apply_worker(spec, 0, iter(batches)))))
    backend = open_backend("memory", StateDirPaths(spec.state_dir).worker(0), "int64", BINS,
                           read_only=True)
    try:
        state = {k: v for _, k, v in backend.items()}
    finally:
        backend.close()
    outputs = sorted(results.outputs.to_pylist(), key=lambda r: r["k"])
    load = dict(zip(results.load_bins.tolist(), results.load_counts.tolist(), strict=True))
    return outputs, state, results.reports[0].metrics, load


@pytest.mark.parametrize(("kind", "out_type"), [
    ("count", pa.int64()), ("sum", pa.int64()), ("min", pa.int64()), ("max", pa.int64()),
    ("stats", pa.string())])
def test_partials_from_lessees_consolidate_to_the_unsplit_result(tmp_path, kind, out_type):
    update = make_update(Stats(), None, pa.string()) if kind == "stats" else \
        make_update(kind, "int")
    hot = [(7, v) for v in range(-20, 40)]
    cold = [(k, k * 3) for k in range(20, 32)]
    if kind != "stats":
        hot += [(7, None)] * 3  # nulls: counted by count, skipped by the others
        cold += [(100, None)]  # a key with only nulls, unsplit
    lessees = [hot[::2], hot[1::2]]
    plain = _apply(_spec(tmp_path / "plain", update, out_type), [_records(hot + cold)])
    spec = _spec(tmp_path / "split", update, out_type, split_keys=(7,))
    partials = [b for part in lessees for b in fold_partials(spec, iter([_records(part)]))]
    assert sum(b.num_rows for b in partials) == 2  # one partial row per key and lessee
    split = _apply(spec, [_records(cold), *partials])
    assert split[:2] == plain[:2]  # outputs and state
    assert split[2].records_in == plain[2].records_in == len(hot) + len(cold)
    assert split[2].split_records == len(hot) and split[2].split_keys == 1
    assert split[3] == plain[3]  # records per bin
    assert split[2].hot == plain[2].hot
    assert split[2].hot["counters"][0][:2] == [7, len(hot)]


def test_a_map_task_that_is_its_own_lessee_passes_other_keys_and_folds_split_ones(tmp_path):
    """The one-pass lessee (no extra stage): records of other keys (the null key among them)
    pass unchanged, and the split key's records of every batch make one partial row."""
    spec = _spec(tmp_path, make_update("sum", "int"), pa.int64(), split_keys=(7, 9))
    batches = [_records([(7, 1), (1, 2), (7, 3)]), _records([(2, 5), (7, 4)]),
               rows(SCHEMA, 1, {C.WORKER: pa.array([0], pa.int32()),
                                C.BIN: pa.array([0], pa.int32())}, C.RowKind.RECORD)]  # null key
    out = pa.Table.from_batches(list(pass_and_fold(spec, iter(batches))))
    records, partials = take_partials(out)
    assert records.column(C.KEY).to_pylist() == [1, 2, None]
    assert records.column(C.VALUE).to_pylist() == [2, 5, None]
    assert (partials.keys, partials.records, partials.partials) == ([7], [3], [8])


def test_a_record_of_a_split_key_beside_its_partials_fails_loudly(tmp_path):
    spec = _spec(tmp_path, make_update("count", None), pa.int64(), split_keys=(7,))
    partials = list(fold_partials(spec, iter([_records([(7, 1)])])))
    with pytest.raises(RuntimeError, match="split key 7 reached its owner unfolded"):
        _apply(spec, [_records([(7, 2)]), *partials])


def test_a_lessee_partial_that_overflows_int64_fails_naming_the_key(tmp_path):
    spec = _spec(tmp_path, make_update("sum", "int"), pa.int64(), split_keys=(7,))
    big = 2**62
    with pytest.raises(UpdateError, match=r"key 7 .*int64 sum overflowed"):
        list(fold_partials(spec, iter([_records([(7, big)] * 3)])))


def test_float_partials_keep_nan_and_null_semantics(tmp_path):
    schema = shuffle_schema(pa.int64(), pa.float64(), False)
    update = make_update("max", "float")
    out = pa.schema([("k", pa.int64()), ("o", pa.float64())])
    spec = EpochSpec(epoch=0, state_dir=str(tmp_path), backend="memory", key_type="int64",
                     num_bins=BINS, update=update, output_schema=out, chunk_bytes=1 << 16,
                     shuffle_schema=schema, live=frozenset({0}), split_keys=(7,))

    def batch(values):
        keys = pa.array([7] * len(values), pa.int64())
        return rows(schema, len(values), {
            C.WORKER: pa.array([0] * len(values), pa.int32()),
            C.BIN: pa.array(bin_of(keys, BINS), pa.int32()), C.KEY: keys,
            C.VALUE: pa.array(values, pa.float64())}, C.RowKind.RECORD)

    partials = [b for vs in ([1.0, None], [math.nan], [None]) for b in
                fold_partials(spec, iter([batch(vs)]))]
    results = split_results(pa.Table.from_batches(list(apply_worker(spec, 0, iter(partials)))))
    assert np.isnan(results.outputs.column("o")[0].as_py())  # NaN orders above every number


@pytest.mark.parametrize("capacity", [0, -3, True, 2.5, "8"])
def test_a_bad_sketch_capacity_is_refused_before_anything_is_watched(capacity):
    hot = HotKeys(None, None)  # type: ignore[arg-type] -- the capacity is checked first
    with pytest.raises(ValueError, match="capacity must be a positive int, got"):
        hot.watch_hot_keys(capacity)
    assert hot._hot_setting is None
