"""A worker store inside a group of epochs (docs/groups.md): the group's earlier epochs keep
their undo records and outputs, so a crash after the driver committed some of them rolls the
rest back newest first, and a retried group task replays the epochs it committed."""

from __future__ import annotations

import msgpack
import pytest

from megaphone.state_backends.remote import RemoteStore
from megaphone.state_backends.worker_store import StoreVersionError, WorkerStore
from tests.test_store_service import BINS, counts, raw


def add(store, epoch: int, keys, group_start: int | None, run: str = "r") -> None:
    """Add one to ``keys`` and commit ``epoch`` of the group starting at ``group_start``."""
    rk = raw(keys)
    old = store.read(rk)
    new = [msgpack.packb((msgpack.unpackb(v) if v else 0) + 1) for v in old]
    store.commit(epoch, rk, new, old, f"out{epoch}".encode(), [], run, group_start)


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_a_group_rolls_back_epoch_by_epoch_to_any_commit(tmp_path, kind):
    with WorkerStore.open(kind, tmp_path / "w", "int64", BINS) as store:
        add(store, 0, [1], None)  # a plain epoch, then the group 1..3
        for epoch, keys in ((1, [1, 2]), (2, [2, 3]), (3, [3])):
            add(store, epoch, keys, 1)
        assert store.epoch == 3 and counts(store, [1, 2, 3]) == [2, 2, 2]
        assert [store.stored_outputs(e) for e in (1, 2, 3)] == [b"out1", b"out2", b"out3"]
        assert not store.check_can_apply(2, group_start=1)  # a retried group task replays 2
        with pytest.raises(StoreVersionError, match="ahead of epoch 2"):
            store.check_can_apply(2)  # ... but only as part of its group
        assert store.can_roll_back_to(0) and not store.can_roll_back_to(-1)
        store.rollback_to(1)  # the driver committed epoch 1 of the group, then crashed
        assert store.epoch == 1 and counts(store, [1, 2, 3]) == [2, 1, None]
        assert store.stored_outputs() == b"out1"
        add(store, 2, [9], 2)  # the rerun's group starts after the commit
        assert counts(store, [2, 3, 9]) == [1, None, 1]
        # A new group keeps undo records back to its own start only (the driver's commit).
        with pytest.raises(StoreVersionError, match="cannot be rolled back to epoch 0"):
            store.rollback_to(0)
        store.rollback_to(1)
        assert store.epoch == 1 and counts(store, [1, 2, 3, 9]) == [2, 1, None, None]


def test_the_service_replays_a_retried_group_and_rolls_back_another_runs(tmp_path, local):
    store = RemoteStore(local, str(tmp_path / "w"), "rocksdb", "int64", BINS, 0)
    assert store.begin(0, None, "a") == (True, b"")
    add(store, 0, [1], None, "a")
    for epoch in (1, 2):  # a group of two in run "a"
        assert store.begin(epoch, epoch - 1, "a", group_start=1) == (True, b"")
        add(store, epoch, [1], 1, "a")
    # A task retry of the group in the same run replays both epochs' outputs.
    assert store.begin(1, 0, "a", group_start=1) == (False, b"out1")
    assert store.begin(2, 1, "a", group_start=1) == (False, b"out2")
    # Another run (the driver committed only epoch 0) rolls the group back and applies again.
    assert store.begin(1, 0, "b", group_start=1) == (True, b"")
    assert counts(store, [1]) == [1]


def test_a_group_task_applies_each_epoch_in_order_and_a_retry_replays(tmp_path):
    """A worker's group task (no Spark): each epoch's records applied and committed in order,
    outputs tagged with their epoch; a retry of the same run replays; another run (the driver
    committed only the epoch before the group) rolls the group back and applies it again."""
    import dataclasses

    import pyarrow as pa

    from megaphone.migrator.epoch.spark_job import split_group_results
    from megaphone.migrator.task import columns as C
    from megaphone.migrator.task.spec import with_labels
    from megaphone.migrator.task.state_operator import apply_worker
    from tests.test_worker import SCHEMA, records, spec

    labelled = with_labels(SCHEMA)

    def batch(keys, label):
        rows = records(keys, 0)
        return pa.RecordBatch.from_arrays(
            [*rows.columns, pa.array([label] * rows.num_rows, pa.int64())], schema=labelled)

    group = dataclasses.replace(spec(tmp_path, 0, "rocksdb", live=frozenset({0})),
                                labels=(10, 11, 12), shuffle_schema=labelled, run_id="a")
    inputs = [batch([1, 2], 10), batch([2], 11), batch([1, 1, 3], 12)]

    def run(s):
        table = pa.Table.from_batches(list(apply_worker(s, 0, iter(inputs))))
        results = split_group_results(table, range(3))
        outs = [{r["k"]: r["count"] for r in e.outputs.to_pylist()} for e in results]
        return outs, [e.reports[0].metrics.replayed for e in results]

    expected = [{1: 1, 2: 1}, {2: 2}, {1: 3, 3: 1}]
    assert run(group) == (expected, [False, False, False])
    assert run(group) == (expected, [True, True, True])  # a task retry: replayed
    assert C.OUT_EPOCH not in split_group_results(
        pa.Table.from_batches(list(apply_worker(group, 0, iter(inputs)))), range(3))[0] \
        .outputs.column_names
    other = dataclasses.replace(group, run_id="b")  # the driver never committed the group
    assert run(other) == (expected, [False, False, False])
