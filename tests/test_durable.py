"""A worker's durable copy: restoring any committed epoch gives the working store's state."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone.paths import (
    CHANGELOG,
    CHECKPOINT_OWNER,
    checkpoint_durable_file,
    checkpoint_owner_path,
    checkpoint_worker_root,
    durable_epoch_of,
)
from megaphone.routing.bins import bin_of
from megaphone.state_backends.durable import DurableCopy, DurableCopyError, claim_checkpoint
from megaphone.state_backends.encoding import encode_keys
from megaphone.state_backends.worker_store import StoreVersionError, WorkerStore
from tests.helpers.servers import s3_endpoint

NUM_BINS = 8


def raw(keys: list[int]) -> tuple[list[int], list[bytes]]:
    bins = [int(b) for b in np.atleast_1d(bin_of(np.array(keys, np.int64), NUM_BINS))] \
        if keys else []
    return bins, list(encode_keys(bins, keys, "int64")) if keys else []


def state_of(store: WorkerStore) -> dict[bytes, bytes]:
    return dict(store.backend.raw_items())


def open_store(root: Path, name: str, checkpoint: Path, every: int,
               kind: str = "rocksdb") -> WorkerStore:
    return WorkerStore.open(kind, root / name, "int64", NUM_BINS,
                            durable=DurableCopy(str(checkpoint), 0, every))


def run_epoch(store: WorkerStore, epoch: int, drops: set[int], chunk: pa.RecordBatch,
              keys: list[bytes], values: list[bytes | None]) -> None:
    """As a worker does: drop departed and arriving bins, install, write, commit."""
    assert store.check_can_apply(epoch)
    store.drop_bins(drops)
    if chunk.num_rows:
        store.install([chunk])
    installed = sorted(set(raw_bins(chunk)))
    store.commit(epoch, keys, values, store.read(keys), b"", installed)


def raw_bins(chunk: pa.RecordBatch) -> list[int]:
    """The bins of raw keys (their 4-byte big-endian prefix)."""
    return [int.from_bytes(k[:4], "big") for k in chunk.column(0).to_pylist()]


# An epoch: keys written (a value, or None to delete), bins dropped, chunk installed, and
# whether the driver failed to commit it (the worker rolls it back).
epochs = st.lists(st.tuples(
    st.dictionaries(st.integers(0, 40), st.one_of(st.none(), st.binary(max_size=3)),
                    max_size=6),
    st.sets(st.integers(0, NUM_BINS - 1), max_size=2),
    st.dictionaries(st.integers(100, 140), st.binary(min_size=1, max_size=3), max_size=4),
    st.booleans()), min_size=1, max_size=12)


@settings(max_examples=30)
@given(epochs, st.integers(1, 4), st.data())
def test_restoring_any_committed_epoch_gives_the_working_state(history, every, data):
    # The memory backend (same raw bytes as RocksDB) keeps the many examples fast; the tests
    # below restore RocksDB stores.
    with tempfile.TemporaryDirectory() as tmp:
        root, checkpoint = Path(tmp), Path(tmp) / "ckpt"
        live = open_store(root, "live", checkpoint, every, "memory")
        committed: dict[int, dict[bytes, bytes]] = {}
        tokens: dict[int, str] = {}
        for epoch, (writes, dropped, installed, fails) in enumerate(history):
            ibins, ikeys = raw(list(installed))
            chunk = pa.RecordBatch.from_arrays(
                [pa.array(ikeys, pa.binary()), pa.array(list(installed.values()), pa.binary())],
                names=["k", "v"])
            run_epoch(live, epoch, dropped | set(ibins), chunk, raw(list(writes))[1],
                      list(writes.values()))
            if fails:  # the driver never committed it: rolled back, then run again routed
                live.rollback(epoch)  # alike (same drops and installs) with other records
                run_epoch(live, epoch, dropped | set(ibins), chunk, raw([epoch])[1], [b"again"])
            committed[epoch], tokens[epoch] = state_of(live), live.token
        live.close()
        retained = sorted(committed)[-(every + 1):]
        target = data.draw(st.sampled_from(retained), "restore epoch")
        with open_store(root, f"restored{target}", checkpoint, every, "memory") as fresh:
            done = fresh.restore(target, tokens[target])
            assert fresh.epoch == target == done.epoch
            assert state_of(fresh) == committed[target]
        # A copy left at an earlier retained epoch catches up by replaying what it lacks.
        base = data.draw(st.sampled_from([e for e in retained if e <= target]), "copy's epoch")
        with open_store(root, f"behind{base}", checkpoint, every, "memory") as behind:
            behind.restore(base, tokens[base])
            done = behind.catch_up(target, tokens[target])
            assert done is not None and done.since == base
            assert behind.epoch == target and state_of(behind) == committed[target]


def test_a_missing_changelog_is_an_error_not_a_short_state(tmp_path):
    store = open_store(tmp_path, "w", tmp_path / "ckpt", 100)
    for epoch in range(3):
        store.check_can_apply(epoch)
        _, keys = raw([epoch])
        store.commit(epoch, keys, [b"x"], [None], b"", [])
    store.close()
    Path(checkpoint_durable_file(checkpoint_worker_root(str(tmp_path / "ckpt"), 0), CHANGELOG, 1)
         ).unlink()
    with open_store(tmp_path, "fresh", tmp_path / "ckpt", 100) as fresh, \
            pytest.raises(DurableCopyError, match="no changelog or snapshot of epoch 1"):
        fresh.restore(2)


def test_a_corrupt_changelog_is_an_error(tmp_path):
    store = open_store(tmp_path, "w", tmp_path / "ckpt", 100)
    store.check_can_apply(0)
    store.commit(0, raw([1])[1], [b"x"], [None], b"", [])
    store.close()
    Path(checkpoint_durable_file(checkpoint_worker_root(str(tmp_path / "ckpt"), 0), CHANGELOG, 0)
         ).write_bytes(b"not arrow")
    with open_store(tmp_path, "fresh", tmp_path / "ckpt", 100) as fresh, \
            pytest.raises(DurableCopyError, match="missing or corrupt"):
        fresh.restore(0)


def test_restore_needs_an_empty_store_and_a_durable_copy(tmp_path):
    store = open_store(tmp_path, "w", tmp_path / "ckpt", 100)
    store.check_can_apply(0)
    store.commit(0, raw([1])[1], [b"x"], [None], b"", [])
    with pytest.raises(StoreVersionError, match="needs an empty store"):
        store.restore(0)
    store.close()
    with WorkerStore.open("rocksdb", tmp_path / "plain", "int64", NUM_BINS) as plain, \
            pytest.raises(StoreVersionError, match="no checkpoint location"):
        plain.restore(0)


def test_snapshots_prune_what_the_one_before_superseded(tmp_path):
    store = open_store(tmp_path, "w", tmp_path / "ckpt", 2)
    for epoch in range(9):
        store.check_can_apply(epoch)
        store.commit(epoch, raw([epoch])[1], [b"x"], [None], b"", [])
    durable = store.durable
    assert durable is not None and durable.snapshots == [5, 7]  # the last two
    assert durable.changelogs == [6, 7, 8]  # what restoring epoch 6 or later needs
    store.close()
    with open_store(tmp_path, "fresh", tmp_path / "ckpt", 2) as fresh:
        done = fresh.restore(6)
        assert (done.snapshot, done.changelogs) == (5, 1)
        assert len(state_of(fresh)) == 7


def test_a_checkpoint_location_belongs_to_one_pipeline(tmp_path):
    claim_checkpoint(str(tmp_path / "ckpt"), "p1")
    claim_checkpoint(str(tmp_path / "ckpt"), "p1")  # the same pipeline again: fine
    with pytest.raises(ValueError, match="belongs to pipeline 'p1'"):
        claim_checkpoint(str(tmp_path / "ckpt"), "p2")


def test_the_durable_copy_on_an_s3_endpoint_holds_only_arrow_files(tmp_path):
    with s3_endpoint("megaphone") as uri:
        checkpoint = uri("pipelines/p1")
        claim_checkpoint(checkpoint, "p1")
        store = WorkerStore.open("rocksdb", tmp_path / "w", "int64", NUM_BINS,
                                 durable=DurableCopy(checkpoint, 0, 2))
        states = {}
        for epoch in range(6):
            keys = raw([epoch, epoch + 1])[1]
            run_epoch(store, epoch, {epoch % NUM_BINS} if epoch == 3 else set(),
                      pa.RecordBatch.from_arrays([pa.array([], pa.binary())] * 2,
                                                 names=["k", "v"]), keys, [b"a", b"b"])
            if epoch == 4:  # not committed by the driver: rolled back, run again
                store.rollback(epoch)
                run_epoch(store, epoch, set(), pa.RecordBatch.from_arrays(
                    [pa.array([], pa.binary())] * 2, names=["k", "v"]), keys, [b"c", b"d"])
            states[epoch] = state_of(store)
        store.close()
        for target in (4, 5):
            with WorkerStore.open("rocksdb", tmp_path / f"r{target}", "int64", NUM_BINS,
                                  durable=DurableCopy(checkpoint, 0, 2)) as fresh:
                fresh.restore(target)
                assert state_of(fresh) == states[target]
        fs, root = pafs.FileSystem.from_uri(checkpoint)
        names = [info.path.removeprefix(root + "/") for info in
                 fs.get_file_info(pafs.FileSelector(root, recursive=True))
                 if info.type == pafs.FileType.File]
        assert CHECKPOINT_OWNER in names
        objects = sorted(n for n in names if n != CHECKPOINT_OWNER)
        assert objects and all(n.endswith(".arrow") for n in objects), objects  # no RocksDB file
        changelog = checkpoint_durable_file(checkpoint_worker_root(root, 0), CHANGELOG, 4)
        assert changelog.removeprefix(root + "/") in objects


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sets(st.integers(0, NUM_BINS - 1), max_size=2),
                          st.lists(st.tuples(st.integers(0, 30),
                                             st.one_of(st.none(), st.binary(max_size=2))),
                                   max_size=8)), max_size=6),
       st.dictionaries(st.integers(0, 30), st.binary(max_size=2), max_size=10))
def test_merged_rows_equal_replaying_the_changelogs(changelogs, snapshot):
    """What a restore bulk-loads equals the state a plain replay leaves (a dict reference)."""
    from megaphone.state_backends.durable import merged_rows

    def batch(pairs):
        keys = [raw([k])[1][0] for k, _ in pairs]
        return pa.RecordBatch.from_arrays([pa.array(keys, pa.binary()),
                                           pa.array([v for _, v in pairs], pa.binary())],
                                          names=["k", "v"])

    state = {raw([k])[1][0]: v for k, v in sorted(snapshot.items())}
    for drops, writes in changelogs:
        state = {k: v for k, v in state.items() if int.from_bytes(k[:4], "big") not in drops}
        for k, v in writes:
            key = raw([k])[1][0]
            if v is None:
                state.pop(key, None)
            else:
                state[key] = v
    snap = [batch(sorted(snapshot.items()))] if snapshot else []
    table = merged_rows(snap, [(sorted(d), [batch(w)]) for d, w in changelogs])
    keys = table.column("k").to_pylist()
    assert keys == sorted(keys)
    assert dict(zip(keys, table.column("v").to_pylist(), strict=True)) == state


def test_the_durable_copy_keeps_its_file_names():
    """The names on disk are a format: a checkpoint written before must still be read."""
    assert checkpoint_durable_file("/c/workers/w00000", CHANGELOG, 4) == \
        "/c/workers/w00000/changelog/e000000000004.arrow"
    assert durable_epoch_of("e000000000004.arrow") == 4
    assert durable_epoch_of("e000000000004.arrow.tmp") is None
    assert checkpoint_owner_path("/c/") == "/c/megaphone-checkpoint.json"
