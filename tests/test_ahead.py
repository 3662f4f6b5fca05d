"""Bins written ahead (docs/transfer.md): a bin's file written from the state as of one moment,
then patched with the keys written since, installs exactly the bin's state as of its move, and
anything else that changes the bin forgets the file."""

from __future__ import annotations

import os
import time

import msgpack
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone.routing.bins import bin_of
from megaphone.state_backends import open_backend
from megaphone.state_backends.bin_files import transfer_dir
from megaphone.state_backends.encoding import encode_keys
from megaphone.state_backends.handoff import LinkRef
from megaphone.state_backends.remote import RemoteStore
from tests.test_bin_files import BINS, filled
from tests.test_store_service import counts, raw

keys = st.tuples(st.integers(0, BINS - 1), st.integers(-50, 50))
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, st.integers(-10**6, 10**6)),
    st.tuples(st.just("delete"), keys, st.none()),
    st.tuples(st.just("drop"), st.integers(0, BINS - 1), st.none())), max_size=40)


def apply(store, changes) -> None:
    for op, target, value in changes:
        if op == "put":
            store.put_many([target[0]], [target[1]], [value])
        elif op == "delete":
            store.write_raw(encode_keys([target[0]], [target[1]], "int64"), [None])
        else:
            store.drop_bins([target])


def contents(store, b: int) -> list[tuple[bytes, bytes]]:
    return list(store.raw_items([b]))


@settings(max_examples=40, deadline=None)
@given(start=st.dictionaries(keys, st.integers(-10**9, 10**9), max_size=200),
       ahead=st.sets(st.integers(0, BINS - 1), min_size=1, max_size=4),
       during=ops, after=ops, chunk=st.integers(1, 64))
def test_a_bin_written_ahead_and_patched_installs_its_state_at_the_move(
        tmp_path_factory, start, ahead, during, after, chunk):
    """Writes while the file is written (``during``) and after (``after``), deletions and
    drops among them: the file plus its patch install the bin as a fresh export would."""
    tmp = tmp_path_factory.mktemp("ahead")
    sender = filled(tmp / "sender", start)
    jobs = [job for b in sorted(ahead) if (job := sender.start_ahead(b, 1)) is not None]
    apply(sender, during)
    kept = [b for job in jobs
            if sender.finish_ahead(job, sender.write_ahead(job, chunk=chunk))
            for b in [job.entry.bin]]
    dropped = {target for op, target, _ in during if op == "drop"}
    assert set(kept) == {job.entry.bin for job in jobs} - dropped == set(sender.ahead_bins())
    apply(sender, after)
    for b in sorted(ahead):
        receiver = open_backend("rocksdb", tmp / f"receiver-{b}", "int64", BINS)
        files = sender.take_ahead(b)
        if files:
            assert b in kept and files[0].kind == "ahead"
            assert all(f.kind == "patch" for f in files[1:]) and len(files) <= 2
        else:
            made = sender.write_bin_file(b)
            files = [made] if made is not None else []
        receiver.ingest_bin_files(files)
        assert contents(receiver, b) == contents(sender, b)
        assert receiver.bin_stats().get(b) == sender.bin_stats().get(b)
        assert receiver.scan_bin_stats() == receiver.bin_stats()
        receiver.close()
    assert sender.ahead_bins() == []
    sender.close()


def test_files_written_ahead_go_when_forgotten_changed_or_closed(tmp_path):
    """A drop, an ingestion or no longer being wanted deletes a bin's file written ahead; so
    does closing the store; a bin too small or already written is not started."""
    store = filled(tmp_path / "s", {(b, k): k for b in range(4) for k in range(50)})
    out = transfer_dir(str(tmp_path / "s"), "out")

    def written(b: int) -> None:
        job = store.start_ahead(b, 1)
        assert job is not None and store.finish_ahead(job, store.write_ahead(job))

    for b in range(4):
        written(b)
    assert store.start_ahead(0, 1) is None and store.start_ahead(5, 1) is None  # empty bin
    assert store.start_ahead(6, 10**9) is None
    assert store.ahead_bins() == [0, 1, 2, 3]
    store.drop_bins([1])
    store.forget_ahead(keep=[0, 3])
    assert store.ahead_bins() == [0, 3]
    assert len(os.listdir(out)) == 2
    job = store.start_ahead(1, 1)
    assert job is None  # bin 1 is empty now
    store.close()
    assert os.listdir(out) == []


def test_the_service_writes_bins_ahead_while_idle_and_a_move_sends_them_patched(tmp_path,
                                                                                 local):
    """A commit names the bins its worker is to send next; the service writes them ahead
    between epochs; writes after that go into patches; the move sends each as its file
    written ahead plus a patch, linked into the receiver's store, which then holds exactly the
    sender's state of those bins."""
    workers = tmp_path / "state" / "workers"
    sender = RemoteStore(local, str(workers / "0"), "rocksdb", "int64", BINS, 0)
    receiver = RemoteStore(local, str(workers / "1"), "rocksdb", "int64", BINS, 1)
    keys = list(range(300))
    moving = sorted({int(b) for b in bin_of(np.asarray(keys), BINS)})[:3]
    mine = [k for k in keys if int(bin_of(np.asarray([k]), BINS)[0]) in moving]

    pending: list[int] = []

    def epoch(e: int, written: list[int]) -> list[int]:
        assert sender.begin(e, e - 1 if e else None, "r")[0]
        rk = raw(written)
        old = sender.read(rk)
        new = [msgpack.packb((msgpack.unpackb(v) if v else 0) + 1) for v in old]
        reply = sender.commit(e, rk, new, old, b"", [], "r", ahead=moving)
        pending.append(reply["ahead_pending"])
        return reply["ahead"]

    e = 0
    ready = epoch(e, keys)
    assert pending == [3]  # named at this commit: all still to write
    deadline = time.monotonic() + 30
    while ready != moving:  # the writer works between epochs
        assert time.monotonic() < deadline, f"bins {moving} not written ahead: {ready}"
        time.sleep(0.2)
        e += 1
        ready = epoch(e, [])
    assert pending[-1] == 0
    e += 1
    epoch(e, mine[::3])  # after their files were written: into the patches
    sent = list(sender.export(moving, 1 << 20, e, e + 1, "r", file_min_bytes=0, link_as=0))
    assert all(isinstance(s, LinkRef) for s in sent)
    assert sorted(s.file.kind for s in sent) == ["ahead"] * 3 + ["patch"] * len(
        {int(bin_of(np.asarray([k]), BINS)[0]) for k in mine[::3]})
    assert receiver.begin(e + 1, None, "r")[0]
    receiver.link(sent, [str(workers / "0")] * len(sent))
    receiver.commit(e + 1, [], [], [], b"", moving, "r")
    assert counts(receiver, mine) == counts(sender, mine)
    assert sorted(set(counts(receiver, mine))) == [1, 2]


def test_the_writer_stops_when_the_next_epoch_is_due():
    """Epochs that start at a steady pace tell the service when the next is due: the writer
    waits from DUE_LEAD of the spacing before it until the epoch's first request (or half a
    spacing after, if none comes); a repeated or unknown start changes nothing."""
    import threading

    from megaphone.state_backends.ahead_writer import DUE_LEAD, AheadWishes, AheadWriter

    wishes = AheadWishes()
    for t in (100.0, 102.0, 104.0):
        wishes.opened(t)
        assert not wishes.due(t + 0.5)  # too few starts before the third
    wishes.opened(104.0)
    wishes.opened(None)
    wishes.opened("soon")
    assert list(wishes.starts) == [100.0, 102.0, 104.0]
    lead = DUE_LEAD * 2.0  # of the 2 s spacing: the next is due at 106
    assert not wishes.due(106.0 - lead - 0.01)
    assert wishes.due(106.0 - lead + 0.01) and wishes.due(106.9)
    assert not wishes.due(107.1)  # the epoch did not come: the writer may work again

    class Entry:
        ahead = wishes

    writer = AheadWriter(lambda: [Entry()], lambda: 0, threading.Event())
    wishes.committed(None, 1)
    now = time.time()
    for t in (now - 6, now - 4, now - 2):  # the next is due now
        wishes.opened(t)
    wishes.committed(None, 1)
    assert writer.busy()
    wishes.starts.clear()
    assert not writer.busy()
