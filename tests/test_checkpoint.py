"""A pipeline with a checkpoint location: working copies that are lost or left behind are
restored from the durable copy, and outputs and state equal a run where nothing was lost."""

from __future__ import annotations

import shutil
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from megaphone import MigrationPlan, Move, Pipeline, PlanError
from megaphone.migrator.offline import migrate_offline
from megaphone.migrator.worker import local_worker_path
from megaphone.state_backends.remote import release_stores
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
    copies = local_worker_path(pipe.local_dir, pipe.fingerprint.pipeline_id, 0).parent
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

    with pytest.raises(PlanError, match="offline migration does not write it"):
        migrate_offline(str(state_dir), MigrationPlan.from_moves(
            pipe.routing, [[Move(2, pipe.routing.owner(2), 1)]]))
    with pytest.raises(ValueError, match="belongs to pipeline"):
        Pipeline(spark, str(tmp_path / "other"), key="k", num_bins=16, key_type="int64",
                 checkpoint=checkpoint)


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
