"""The state operator without Spark: install-before-apply, task retries, exporter read-only."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pytest

from megaphone.migrator.epoch.spark_job import split_results
from megaphone.migrator.statedir.directory import MANIFEST_FORMAT
from megaphone.migrator.task import columns as C
from megaphone.migrator.task.spec import EpochSpec, shuffle_schema
from megaphone.migrator.task.state_operator import apply_worker, export_worker
from megaphone.migrator.task.transfer import rows
from megaphone.migrator.task.updates import make_update
from megaphone.paths import StateDirPaths
from megaphone.routing.bins import bin_of
from megaphone.state_backends import open_backend

BINS = 8
SCHEMA = shuffle_schema(pa.int64(), None, False)
OUT = pa.schema([("k", pa.int64()), ("count", pa.int64())])


def spec(tmp_path, epoch, backend, **kw) -> EpochSpec:
    return EpochSpec(epoch=epoch, state_dir=str(tmp_path), backend=backend, key_type="int64",
                     num_bins=BINS, update=make_update("count", None), output_schema=OUT,
                     chunk_bytes=64, shuffle_schema=SCHEMA, **kw)


def records(keys, worker) -> pa.RecordBatch:
    """Records of ``keys`` (None: the null key) routed to ``worker``."""
    keys = pa.array([None if k is None else int(k) for k in keys], pa.int64())
    n = len(keys)
    return rows(SCHEMA, n, {C.WORKER: pa.array([worker] * n, pa.int32()),
                            C.BIN: pa.array(bin_of(keys, BINS), pa.int32()), C.KEY: keys},
                C.RowKind.RECORD)


def run(s: EpochSpec, worker: int, batches) -> tuple[dict, dict]:
    results = split_results(pa.Table.from_batches(apply_worker(s, worker, iter(batches))))
    metrics = results.reports[0].metrics.to_dict()
    return {r["k"]: r["count"] for r in results.outputs.to_pylist()}, metrics


def state_of(tmp_path, backend, worker) -> dict:
    b = open_backend(backend, StateDirPaths(tmp_path).worker(worker), "int64", BINS,
                     read_only=True)
    try:
        return {k: v for _, k, v in b.items()}
    finally:
        b.close()


@pytest.mark.parametrize(("backend", "transfer"),
                         [("memory", "rows"), ("rocksdb", "rows"), ("rocksdb", "files")])
def test_state_arriving_after_records_is_installed_first_and_retries_replay(tmp_path, backend,
                                                                           transfer):
    keys = np.arange(200)
    bins = bin_of(keys, BINS)
    moving = int(bins[0])
    # Epoch 0: worker 0 owns everything.
    s0 = spec(tmp_path, 0, backend, live=frozenset({0}))
    out, _ = run(s0, 0, [records(keys, 0)])
    assert out == {int(k): 1 for k in keys}
    # Epoch 1: bin `moving` goes 0 -> 1; its state is exported and shipped after the records.
    s1 = spec(tmp_path, 1, backend, live=frozenset({0, 1}), incoming={1: (moving,)},
              outgoing={0: ((moving, 1),)}, transfer=transfer)
    shipped = list(export_worker(s1, 0))
    assert len(shipped) > 1  # many bounded chunks (rows, or parts of its file) for one bin
    assert all(len(b.column("_sv").drop_null()) == 0 or
               sum(len(v) for v in b.column("_sv").drop_null().to_pylist()) <= 64 * b.num_rows
               for b in shipped)
    if transfer == "files":  # parts of a file may arrive in any order
        assert all(b.column("_sk").null_count == b.num_rows for b in shipped)
        shipped = shipped[::-1]
    moved_keys = [int(k) for k in keys[bins == moving]]
    to_1 = records(moved_keys, 1)
    out1, m1 = run(s1, 1, [to_1, *shipped])  # records first, state after: still correct
    assert out1 == {k: 2 for k in moved_keys}
    assert m1["keys_in"] == len(moved_keys) and m1["records_in"] == len(moved_keys)
    assert m1["install_method"] == ("files" if transfer == "files" else "chunk")
    # The exporter's metrics ride the shuffle to the receiver, which returns them beside its own.
    results = split_results(pa.Table.from_batches(apply_worker(s1, 1, iter(shipped))))
    exported = results.reports[1:]
    assert [(e.worker, e.metrics.keys_out) for e in exported] == [(0, len(moved_keys))]
    before = state_of(tmp_path, backend, 1)
    out_retry, m_retry = run(s1, 1, [to_1, *shipped])  # a Spark task retry
    assert out_retry == out1 and m_retry["replayed"]
    assert state_of(tmp_path, backend, 1) == before
    # The exporter never changed the old owner; the next epoch drops the moved bin there.
    assert all(state_of(tmp_path, backend, 0)[k] == 1 for k in moved_keys)
    s2 = spec(tmp_path, 2, backend, live=frozenset({0, 1}), drops={0: (moving,)})
    run(s2, 0, [])
    left = state_of(tmp_path, backend, 0)
    assert not set(moved_keys) & set(left) and len(left) == len(keys) - len(moved_keys)


def test_a_worker_state_ahead_of_the_epoch_is_an_error(tmp_path):
    run(spec(tmp_path, 3, "memory", live=frozenset({0})), 0, [records([1], 0)])
    with pytest.raises(RuntimeError, match="epoch 3, past the last commit"):
        run(spec(tmp_path, 2, "memory", live=frozenset({0})), 0, [records([1], 0)])


def test_a_state_dir_this_host_cannot_see_or_of_another_pipeline_is_an_error(tmp_path):
    # An executor that does not see the driver's state directory must not make its own.
    s = spec(tmp_path, 0, "memory", live=frozenset({0}), pipeline_id="p1")
    with pytest.raises(RuntimeError, match="not readable on host"):
        run(s, 0, [records([1], 0)])
    with pytest.raises(RuntimeError, match="not readable on host"):
        list(export_worker(s, 0))
    assert not StateDirPaths(tmp_path).workers.exists()
    def manifest(pipeline_id: str) -> str:
        fp = {"pipeline_id": pipeline_id, "num_bins": BINS, "key_type": "int64"}
        return json.dumps({"format": MANIFEST_FORMAT, "fingerprint": fp})

    (tmp_path / "megaphone.json").write_text(manifest("p2"))
    with pytest.raises(RuntimeError, match="belongs to pipeline 'p2', not 'p1'"):
        run(s, 0, [records([1], 0)])
    (tmp_path / "megaphone.json").write_text(manifest("p1"))
    assert run(s, 0, [records([1], 0)])[0] == {1: 1}


@pytest.mark.parametrize(("backend", "transfer"),
                         [("memory", "rows"), ("rocksdb", "rows"), ("rocksdb", "files")])
def test_the_null_key_is_applied_and_its_state_moves_with_bin_zero(tmp_path, backend, transfer):
    assert bin_of(None, BINS) == 0
    s0 = spec(tmp_path, 0, backend, live=frozenset({0}))
    out, m = run(s0, 0, [records([None, 1, None], 0)])
    assert out == {None: 2, 1: 1}
    assert m["null_keys"] == 2 and m["records_in"] == 3 and m["records_out"] == 2
    assert state_of(tmp_path, backend, 0)[None] == 2
    s1 = spec(tmp_path, 1, backend, live=frozenset({0, 1}), incoming={1: (0,)},
              outgoing={0: ((0, 1),)}, transfer=transfer)
    shipped = list(export_worker(s1, 0))
    out1, m1 = run(s1, 1, [records([None], 1), *shipped])
    assert out1 == {None: 3} and m1["null_keys"] == 1
    assert state_of(tmp_path, backend, 1) == {None: 3}


def test_a_general_f_gets_key_none_for_the_null_key(tmp_path):
    out_schema = pa.schema([("k", pa.int64()), ("output", pa.int64())])
    update = make_update(lambda key, values, state: ((state or 0) + len(values),
                                                     [-1 if key is None else key]),
                         None, pa.int64())
    s = dataclasses.replace(spec(tmp_path, 0, "memory", live=frozenset({0})), update=update,
                            output_schema=out_schema)
    results = split_results(pa.Table.from_batches(
        apply_worker(s, 0, iter([records([None, 5, None], 0)]))))
    assert sorted(map(tuple, (r.values() for r in results.outputs.to_pylist())),
                  key=repr) == [(5, 5), (None, -1)]
    assert state_of(tmp_path, "memory", 0) == {None: 2, 5: 1}
