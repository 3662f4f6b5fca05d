"""Bins shipped as files: a store writes a bin as one SST file, another ingests it whole."""

from __future__ import annotations

import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone import MigrationPlan, Move, Pipeline
from megaphone.paths import local_stores_path
from megaphone.state_backends import BinFile, check_transfer, open_backend
from megaphone.state_backends.bin_files import (
    FILE_MIN_BYTES,
    FileAssembler,
    file_min_bytes,
    file_parts,
    transfer_dir,
)
from megaphone.state_backends.remote import release_stores

BINS = 16


def ship(f: BinFile, directory: str, part_bytes: int, seed: int) -> BinFile:
    """``f`` carried to ``directory`` in parts of ``part_bytes``, in a shuffled order."""
    parts = list(file_parts(f.path, part_bytes))
    random.Random(seed).shuffle(parts)
    assembler = FileAssembler(directory)
    for offset, data in parts:
        assembler.add(f, offset, data)
    (got,) = assembler.complete()
    return got


def filled(path: Path, entries: dict[tuple[int, int], int]):
    store = open_backend("rocksdb", path, "int64", BINS)
    if entries:
        bins, keys = zip(*entries, strict=True)
        store.put_many(list(bins), list(keys), list(entries.values()))
    return store


entries = st.dictionaries(st.tuples(st.integers(0, BINS - 1), st.integers(-10**6, 10**6)),
                          st.integers(-10**9, 10**9), max_size=300)


@settings(max_examples=25, deadline=None)
@given(src=entries, dst=entries, moving=st.sets(st.integers(0, BINS - 1)),
       part=st.integers(1, 4096), seed=st.integers(0, 99))
def test_bins_shipped_as_files_arrive_exactly(tmp_path_factory, src, dst, moving, part, seed):
    root = tmp_path_factory.mktemp("files")
    dst = {k: v for k, v in dst.items() if k[0] not in moving}  # arriving bins are empty
    sender, receiver = filled(root / "a", src), filled(root / "b", dst)
    try:
        inbox = transfer_dir(str(root / "b"), "in")
        files = []
        for b in sorted(moving):
            made = sender.write_bin_file(b)
            assert (made is None) == (not any(k[0] == b for k in src))
            if made is not None:
                files.append(ship(made, inbox, part, seed))
                os.unlink(made.path)
        stats = receiver.ingest_bin_files(files)
        assert (stats.keys, stats.method) == (sum(k[0] in moving for k in src), "files")
        want = {**dst, **{k: v for k, v in src.items() if k[0] in moving}}
        assert {(b, k): v for b, k, v in receiver.items()} == want
        assert receiver.bin_stats() == receiver.scan_bin_stats()
        assert sender.bin_stats() == sender.scan_bin_stats()  # the sender is unchanged
        assert {(b, k): v for b, k, v in sender.items()} == src
        assert not os.listdir(inbox) if os.path.isdir(inbox) else True  # moved, not copied
    finally:
        sender.close()
        receiver.close()


def test_write_bin_file_skips_small_and_empty_bins(tmp_path):
    store = filled(tmp_path / "a", {(3, k): k for k in range(100)})
    try:
        assert store.write_bin_file(4) is None  # empty
        nbytes = store.bin_stats()[3].bytes
        assert store.write_bin_file(3, min_bytes=nbytes + 1) is None
        made = store.write_bin_file(3, min_bytes=nbytes)
        assert made is not None and (made.bin, made.keys, made.bytes) == (3, 100, nbytes)
        assert os.path.dirname(made.path) == transfer_dir(str(tmp_path / "a"), "out")
    finally:
        store.close()


def test_ingest_refuses_bad_files_and_changes_nothing(tmp_path):
    sender = filled(tmp_path / "a", {(b, k): k for b in (1, 2) for k in range(50)})
    receiver = filled(tmp_path / "b", {(2, 7): 7})
    inbox = transfer_dir(str(tmp_path / "b"), "in")
    try:
        one, two = (ship(sender.write_bin_file(b), inbox, 1000, 0) for b in (1, 2))
        before = list(receiver.items()), receiver.bin_stats()
        with pytest.raises(ValueError, match="not empty"):
            receiver.ingest_bin_files([one, two])  # bin 2 holds a key here
        with pytest.raises(ValueError, match="two files for one bin"):
            receiver.ingest_bin_files([one, one])
        with pytest.raises(ValueError, match="missing or not"):
            receiver.ingest_bin_files([BinFile(1, 50, one.bytes, one.size + 1, one.path,
                                               one.name)])
        assert (list(receiver.items()), receiver.bin_stats()) == before
        # A corrupt file: the counters, written first, are reset; the bin stays empty.
        with open(one.path, "r+b") as fh:
            fh.write(b"\0" * 64)
        with pytest.raises(Exception):  # noqa: B017 - RocksDB's own error for a bad SST file
            receiver.ingest_bin_files([one])
        assert (list(receiver.items()), receiver.bin_stats()) == before
        receiver.close()
        receiver = open_backend("rocksdb", tmp_path / "b", "int64", BINS)  # and after a reopen
        assert (list(receiver.items()), receiver.bin_stats()) == before
        assert not os.path.exists(inbox)  # a reopen deletes stale transfer files
    finally:
        sender.close()
        receiver.close()


def test_assembler_refuses_duplicate_outside_and_missing_parts(tmp_path):
    f = BinFile(0, 1, 10, 10, "/elsewhere", "abc")
    assembler = FileAssembler(str(tmp_path))
    assembler.add(f, 0, b"01234")
    with pytest.raises(RuntimeError, match="twice"):
        assembler.add(f, 0, b"01234")
    with pytest.raises(RuntimeError, match="outside"):
        assembler.add(f, 8, b"01234")
    with pytest.raises(RuntimeError, match="incomplete"):
        assembler.complete()
    assembler.discard()
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("bad", [{}, {"bin": -1, "keys": 1, "bytes": 1, "size": 1, "path": "p",
                                      "name": "n"},
                                 {"bin": 0, "keys": 1, "bytes": 1, "size": 1, "path": "p",
                                  "name": "../x"}])
def test_malformed_descriptors_are_refused(bad):
    with pytest.raises(ValueError, match="malformed"):
        BinFile.from_wire(bad)


def test_memory_backend_keeps_rows_and_modes_are_checked(tmp_path):
    store = open_backend("memory", tmp_path / "m", "int64", BINS)
    assert not store.supports_bin_files
    with pytest.raises(NotImplementedError):
        store.write_bin_file(0)
    assert [file_min_bytes(m) for m in ("auto", "files", "rows")] == [FILE_MIN_BYTES, 0, None]
    with pytest.raises(ValueError, match="transfer mode"):
        check_transfer("fast")


def test_a_live_move_ships_bins_as_files_and_the_durable_copy_has_them(spark, tmp_path):
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                    num_bins=BINS, key_type="int64", pipeline_id="files-test",
                    checkpoint=str(tmp_path / "checkpoint"), transfer="files",
                    local_dir=str(tmp_path / "local"))
    expected: Counter = Counter()

    def epoch(keys: list[int]) -> None:
        expected.update(keys)
        out = pipe.process_arrow(spark.createDataFrame([(k,) for k in keys], "k long"))
        assert dict(zip(out.column(0).to_pylist(), out.column(1).to_pylist(), strict=True)) \
            == {k: expected[k] for k in set(keys)}

    epoch(list(range(400)) * 2)
    moving = [0, 3, 5, 10]
    pipe.migrate(MigrationPlan.from_moves(
        pipe.routing, [[Move(b, pipe.routing.owner(b), 2) for b in moving]]))
    epoch(list(range(0, 400, 7)))
    m = pipe.metrics(last=1)[0]
    assert m["bins_moved"] == 4 and m["keys_moved"] > 0
    arrived = m["per_worker"]["2"]
    assert (arrived["files_in"], arrived["install_method"]) == (4, "files")
    assert sum(w.get("files_out", 0) for w in m["per_worker"].values()) == 4
    # With a checkpoint location workers have homes: the files were kept at the senders' home
    # and pulled by the receiver's, on one host here (docs/placement.md, step 7).
    assert arrived["h2h_bytes"] == arrived["bytes_in"] > 0 and arrived["across_bytes"] == 0
    copies = local_stores_path(pipe.local_dir, pipe.fingerprint.pipeline_id)
    epoch(list(range(0, 400, 3)))
    assert not any(copies.rglob("out-*.sst"))  # the senders' next epoch dropped them
    # Lose every working copy: the next epoch restores them from the durable copy, whose
    # changelog holds the bins that arrived as files.
    release_stores(pipe.local_dir, str(copies))
    for worker_copy in copies.iterdir():
        shutil.rmtree(worker_copy)
    epoch(list(range(0, 400, 5)))
    assert {r[0]: r[1] for r in pipe.state().collect()} == dict(expected)
    assert not any(copies.rglob("*.sst.part")) and not any(copies.rglob("in-*.sst"))
    pipe.close()


def test_receivers_pull_their_bins_in_their_own_tasks(spark, tmp_path, monkeypatch):
    """On one host without a checkpoint location the receivers read the bins they install
    from the senders' stores in their own tasks (docs/transfer.md, "Receivers that pull"): the
    epoch's job has no export branch, a sender two receivers pull from reports the sum of both
    parts, and the state is exact. With ``transfer="rows"`` the export tasks stay."""
    from megaphone.migrator.epoch import spark_job

    plans: list[str] = []
    built = spark_job.epoch_job

    def spied(*args, **kwargs):
        job = built(*args, **kwargs)
        plans.append(job._jdf.queryExecution().analyzed().toString())
        return job

    monkeypatch.setattr("megaphone.migrator.epoch.run.epoch_job", spied)
    for transfer, pulled in (("files", True), ("rows", False)):
        pipe = Pipeline(spark, str(tmp_path / transfer), key="k", update="count", workers=3,
                        num_bins=BINS, key_type="int64", transfer=transfer,
                        local_dir=str(tmp_path / f"local-{transfer}"))
        expected = Counter(list(range(600)) * 2)
        pipe.process_arrow(spark.createDataFrame([(k,) for k in expected.elements()], "k long"))
        mine = [b for b in range(BINS) if pipe.routing.owner(b) == 0]
        pipe.migrate(MigrationPlan.from_moves(pipe.routing, [
            [Move(mine[0], 0, 1), Move(mine[1], 0, 2), Move(mine[2], 0, 2)]]))
        keys = list(range(0, 600, 7))
        expected.update(keys)
        plans.clear()
        pipe.process_arrow(spark.createDataFrame([(k,) for k in keys], "k long"))
        m = pipe.metrics(last=1)[0]["per_worker"]
        # The apply tasks' MapInArrow, and the export tasks' unless the receivers pull.
        assert plans[0].count("MapInArrow") == (1 if pulled else 2)
        assert (m["1"]["bins_in"], m["2"]["bins_in"], m["0"]["bins_out"]) == (1, 2, 3)
        assert m["0"]["keys_out"] == m["1"]["keys_in"] + m["2"]["keys_in"] > 0
        assert m["2"].get("files_in", 0) == (2 if pulled else 0)
        assert {r[0]: r[1] for r in pipe.state().collect()} == dict(expected)
        pipe.close()


def test_without_a_checkpoint_a_kept_file_is_linked_not_shipped(spark, tmp_path):
    """Without a checkpoint location the stores share the state directory: a moving bin's file
    stays in the sender's store, one reference row crosses the shuffle and the receiver's
    service links the file into its own store (docs/transfer.md, "Within the state
    directory"); the result is exact and the kept files go at the senders' next epoch."""
    state = tmp_path / "state"
    pipe = Pipeline(spark, str(state), key="k", update="count", workers=2, num_bins=BINS,
                    key_type="int64", pipeline_id="link-test", transfer="files",
                    local_dir=str(tmp_path / "local"))
    expected: Counter = Counter()

    def epoch(keys: list[int]) -> None:
        expected.update(keys)
        pipe.process_arrow(spark.createDataFrame([(k,) for k in keys], "k long"))

    epoch(list(range(400)) * 2)
    first, later = [0, 3, 5, 10], [1, 2, 7]
    pipe.migrate(MigrationPlan.from_moves(
        pipe.routing, [[Move(b, pipe.routing.owner(b), 2) for b in first],
                       [Move(b, pipe.routing.owner(b), 3) for b in later]]))
    epoch(list(range(0, 400, 7)))
    m = pipe.metrics(last=1)[0]
    arrived = m["per_worker"]["2"]
    assert (arrived["files_in"], arrived["install_method"]) == (4, "files")
    assert arrived["keys_in"] == m["keys_moved"] > 0 and not arrived.get("h2h_bytes")
    kept = sorted(p.name for p in (state / "workers").rglob("out-e*.sst"))
    assert len(kept) == 4 and all(name.startswith("out-e1bin") for name in kept)
    # The later step's bins were named at that commit: their stores write them ahead while
    # idle (docs/transfer.md, "Bins written ahead"), and the next step sends those files with
    # patches of the keys this epoch writes.
    assert sorted(b for w in m["per_worker"].values() for b in w.get("ahead_bins", [])) \
        in ([], later)  # as far as the writers had got by the commit
    time.sleep(2)
    epoch(list(range(0, 400, 3)))
    m = pipe.metrics(last=1)[0]
    assert sum(w.get("ahead_out", 0) for w in m["per_worker"].values()) == len(later)
    assert m["per_worker"]["3"]["files_in"] == len(later)
    assert not any((state / "workers").rglob("out-e1*.sst"))  # the senders' next epoch dropped them
    assert {r[0]: r[1] for r in pipe.state().collect()} == dict(expected)
    pipe.close()
