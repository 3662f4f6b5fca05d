"""A pipeline with a checkpoint location: working copies that are lost or left behind are
restored from the durable copy, and outputs and state equal a run where nothing was lost."""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

import megaphone
from megaphone import MigrationPlan, Move, Pipeline
from megaphone.migrator.statedir.driver_copy import DriverCopy
from megaphone.paths import (
    COMMIT,
    COMMIT_RECORD_SUFFIX,
    COMMITS,
    ROUTING,
    StateDirPaths,
    local_stores_path,
    seq_name,
)
from megaphone.state_backends.durable import claim_checkpoint
from megaphone.state_backends.remote import release_stores, service_pids
from tests.helpers.servers import s3_endpoint

EPOCHS = 7


def batch_keys(epoch: int) -> list[int]:
    return [(epoch * 5 + i * 3) % 23 for i in range(12)]


@pytest.fixture(params=["local", "s3"])
def checkpoint(request, tmp_path) -> Iterator[str]:
    """A checkpoint location: a local directory, or a bucket of an S3 endpoint on 127.0.0.1."""
    if request.param == "local":
        yield str(tmp_path / "checkpoint")
    else:
        with s3_endpoint("megaphone") as uri:
            yield uri("checkpoint")


def test_lost_and_stale_working_copies_are_restored_from_the_checkpoint(spark, tmp_path,
                                                                         checkpoint):
    state_dir = tmp_path / "state"
    pipe = Pipeline(spark, str(state_dir), key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", pipeline_id=uuid.uuid4().hex,
                    checkpoint=checkpoint, snapshot_every=2)
    copies = local_stores_path(pipe.local_dir, pipe.fingerprint.pipeline_id)
    assert not (state_dir / "workers").exists() or not any((state_dir / "workers").iterdir())
    expected: Counter = Counter()
    stale = tmp_path / "stale-w0"
    restored: dict[int, list[int]] = {}
    for epoch in range(EPOCHS):
        if epoch == 2:  # scale out while copies go missing: bins 1 and 6 go to worker 2
            pipe.migrate(MigrationPlan.from_moves(
                pipe.routing, [[Move(1, pipe.routing.owner(1), 2)],
                               [Move(6, pipe.routing.owner(6), 2)]]))
        if epoch in (1, 3, 5):
            release_stores(pipe.local_dir, str(copies))  # as if its executor were gone
        if epoch == 1:
            shutil.copytree(copies / "w00000", stale)  # worker 0 at epoch 0
        if epoch == 3:
            shutil.rmtree(copies / "w00001")  # a lost disk
        if epoch == 5:  # an old copy of worker 0 comes back (another host's)
            shutil.rmtree(copies / "w00000")
            shutil.copytree(stale, copies / "w00000")
        keys = batch_keys(epoch)
        expected.update(keys)
        out = pipe.process_arrow(spark.createDataFrame([(k,) for k in keys], "k long"))
        assert pipe.epoch == epoch
        assert dict(zip(out.column("k").to_pylist(), out.column("count").to_pylist(),
                        strict=True)) == {k: expected[k] for k in set(keys)}
        for w, m in pipe.metrics(last=1)[0]["per_worker"].items():
            if m.get("restored"):
                restored.setdefault(int(w), []).append(epoch)
    assert restored == {1: [3], 0: [5]}
    assert pipe.routing.owner(1) == 2 and pipe.routing.owner(6) == 2
    release_stores(pipe.local_dir, str(copies))
    shutil.rmtree(copies / "w00002")  # state() restores it too
    assert {r[0]: r[1] for r in pipe.state().collect()} == dict(expected)
    pipe.close()

    for other in ({"pipeline_id": "another"}, {"key": "x"}):  # another pipeline's checkpoint
        with pytest.raises(ValueError, match=f"{next(iter(other))} .* != "):
            Pipeline(spark, str(tmp_path / "other"), **{"key": "k", **other}, num_bins=16,
                     key_type="int64", checkpoint=checkpoint)
        assert not (tmp_path / "other").exists()  # refused: nothing written
    claim_checkpoint(str(tmp_path / "claimed"), "another")  # claimed, no driver copy yet
    with pytest.raises(ValueError, match="belongs to pipeline"):
        Pipeline(spark, str(tmp_path / "fresh"), key="k", num_bins=16, key_type="int64",
                 pipeline_id="mine", checkpoint=str(tmp_path / "claimed"))


def test_a_driver_restarts_anywhere_from_the_checkpoint(spark, tmp_path, checkpoint):
    """The driver's disk is lost with the executors' (a new host): the pipeline restarts
    from the checkpoint location alone, with its epoch, routing, plans, metrics and kept
    outputs, and goes on as if nothing had been lost."""
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                    num_bins=16, key_type="int64", pipeline_id=uuid.uuid4().hex,
                    checkpoint=checkpoint, snapshot_every=3, keep_outputs=3,
                    local_dir=str(tmp_path / "host-a"))
    expected: Counter = Counter()

    def run(p: Pipeline, epoch: int) -> dict[int, int]:
        keys = batch_keys(epoch)
        expected.update(keys)
        out = p.process_arrow(spark.createDataFrame([(k,) for k in keys], "k long"))
        return dict(zip(out.column("k").to_pylist(), out.column("count").to_pylist(),
                        strict=True))

    for epoch in range(EPOCHS):
        run(pipe, epoch)
    plan = MigrationPlan.from_moves(  # in flight when the host is lost
        pipe.routing, [[Move(3, pipe.routing.owner(3), 2)], [Move(9, pipe.routing.owner(9), 2)]])
    pipe.migrate(plan)
    outputs = {e: pipe.state_dir.read_outputs(e) for e in pipe.state_dir.output_epochs()}
    metrics = pipe.metrics()
    pipe.close()
    for pid in service_pids(pipe.local_dir):  # the host is gone: its store services too
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(tmp_path / "state")
    shutil.rmtree(tmp_path / "host-a")

    moved = Pipeline(spark, str(tmp_path / "elsewhere" / "state"), key="k", update="count",
                     num_bins=16, checkpoint=checkpoint, local_dir=str(tmp_path / "host-b"))
    assert moved.epoch == EPOCHS - 1
    assert moved.metrics() == metrics
    assert [h.plan.to_dict() for h in moved.in_flight] == [plan.to_dict()]
    assert {e: moved.state_dir.read_outputs(e) for e in moved.state_dir.output_epochs()} == outputs
    for epoch in range(EPOCHS, EPOCHS + 3):
        keys = set(batch_keys(epoch))
        assert run(moved, epoch) == {k: expected[k] for k in keys}
    assert moved.routing.owner(3) == 2 and moved.routing.owner(9) == 2
    assert {r[0]: r[1] for r in moved.state().collect()} == dict(expected)
    moved.close()


def test_a_state_directory_behind_its_checkpoint_is_brought_forward(spark, tmp_path):
    """The driver's copy is written before the state directory's commit record: a driver lost
    between the two has committed the epoch, and reopening finds it committed."""
    state_dir, checkpoint = tmp_path / "state", str(tmp_path / "checkpoint")
    pipe = Pipeline(spark, str(state_dir), key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", pipeline_id=uuid.uuid4().hex, checkpoint=checkpoint)
    pipe.process_arrow(spark.createDataFrame([(1,), (2,)], "k long"))
    before = {n: (state_dir / n).read_bytes() for n in (COMMIT, ROUTING)}
    pipe.process_arrow(spark.createDataFrame([(2,), (3,)], "k long"))
    pipe.close()
    for name, data in before.items():  # as if the local rename had not happened
        (state_dir / name).write_bytes(data)
    StateDirPaths(state_dir).outputs_file(1).unlink()
    reopened = Pipeline(spark, str(state_dir), key="k", update="count", num_bins=16)
    assert reopened.epoch == 1 and reopened.recovery.clean
    assert reopened.state_dir.read_outputs(1).num_rows == 2
    assert {r[0]: r[1] for r in reopened.state().collect()} == {1: 1, 2: 2, 3: 1}
    reopened.close()

    copy = DriverCopy(checkpoint)  # corrupt: a clear error, and the directory is left alone
    newest = f"{copy.root}/{COMMITS}/" + seq_name(copy.latest_commit()["seq"], COMMIT_RECORD_SUFFIX)
    with open(newest, "r+b") as fh:
        fh.truncate(20)
    shutil.rmtree(state_dir)
    with pytest.raises(ValueError, match="corrupt"):
        Pipeline(spark, str(state_dir), key="k", update="count", num_bins=16,
                 checkpoint=checkpoint)
    assert not state_dir.exists()


def test_a_failed_epoch_is_rolled_back_by_the_executors(spark, tmp_path, monkeypatch):
    state_dir = tmp_path / "state"
    pipe = Pipeline(spark, str(state_dir), key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", pipeline_id=uuid.uuid4().hex,
                    checkpoint=str(tmp_path / "checkpoint"))
    pipe.process_arrow(spark.createDataFrame([(k,) for k in (1, 2, 2)], "k long"))
    monkeypatch.setattr(type(pipe.state_dir), "write_commit",
                        lambda self, commit, after=None: (_ for _ in ()).throw(OSError("full")))
    with pytest.raises(OSError, match="full"):  # the workers applied epoch 1, the driver not
        pipe.process_arrow(spark.createDataFrame([(k,) for k in (1, 1)], "k long"))
    monkeypatch.undo()
    assert pipe.epoch == 0
    assert {r[0]: r[1] for r in pipe.state().collect()} == {1: 1, 2: 2}  # the commit's
    assert pipe.bin_sizes().keys.sum() == 2
    out = pipe.process_arrow(spark.createDataFrame([(k,) for k in (2, 3)], "k long"))
    assert sorted(out.to_pylist(), key=lambda r: r["k"]) == [{"k": 2, "count": 3},
                                                             {"k": 3, "count": 1}]
    pipe.close()
    reopened = Pipeline(spark, str(state_dir), key="k", update="count", num_bins=16)
    assert reopened.epoch == 1
    assert {r[0]: r[1] for r in reopened.state().collect()} == {1: 1, 2: 3, 3: 1}
    reopened.close()


def test_a_checkpointed_pipeline_plans_before_its_first_epoch(spark, tmp_path):
    """Before anything is committed every bin is empty: rescale plans without reading the
    executors (it used to refuse, pointing at the pipeline it was given)."""
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                    num_bins=16, key_type="int64", pipeline_id=uuid.uuid4().hex,
                    checkpoint=str(tmp_path / "checkpoint"))
    assert pipe.epoch < 0 and pipe.bin_sizes().keys.sum() == 0
    handle = pipe.migrate(megaphone.rescale(pipe, workers=4, strategy="batched"))
    batch = spark.createDataFrame([(k,) for k in range(40)], "k long")
    epochs = 0
    while not handle.done and epochs < 10:
        pipe.process_arrow(batch)
        epochs += 1
    assert handle.done and len(pipe.routing.workers()) == 4
    assert {r[0]: r[1] for r in pipe.state().collect()} == {k: epochs for k in range(40)}
    pipe.close()


def test_bin_sizes_read_between_epochs_while_a_stream_would_commit(spark, tmp_path,
                                                                   monkeypatch):
    """rescale() from another thread while epochs run: the executors' stores must not move
    past the commit the size job reads (an epoch committed meanwhile used to fail it)."""
    import threading

    import megaphone.migrator.epoch.state_holder as pipeline_module

    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                    num_bins=16, key_type="int64", pipeline_id=uuid.uuid4().hex,
                    checkpoint=str(tmp_path / "checkpoint"))
    batch = spark.createDataFrame([(k,) for k in range(30)], "k long")
    pipe.process_arrow(batch)
    real, seen = pipeline_module.read_bin_stats, {}

    def read_while_an_epoch_tries_to_run(*args, **kw):
        epoch = threading.Thread(target=pipe.process_arrow, args=(batch,))
        epoch.start()
        epoch.join(timeout=5)  # it must wait for this read
        seen["epoch_ran_during_read"] = not epoch.is_alive()
        seen["thread"] = epoch
        return real(*args, **kw)

    monkeypatch.setattr(pipeline_module, "read_bin_stats", read_while_an_epoch_tries_to_run)
    sizes = pipe.bin_sizes()
    seen["thread"].join()
    assert not seen["epoch_ran_during_read"] and int(sizes.keys.sum()) == 30
    assert pipe.epoch == 1 and {r[0]: r[1] for r in pipe.state().collect()} == \
        {k: 2 for k in range(30)}
    pipe.close()
