"""The worker store's lifecycle and the store service that keeps stores open across epochs."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import msgpack
import pytest

from megaphone.paths import store_socket_path
from megaphone.routing.bins import bin_of
from megaphone.state_backends import wire
from megaphone.state_backends.encoding import bins_of_raw, encode_keys
from megaphone.state_backends.remote import (
    DurableSpec,
    RemoteStore,
    StoreError,
    release_stores,
    service_pid,
)
from megaphone.state_backends.service import StoreService
from megaphone.state_backends.service_identity import process_start
from megaphone.state_backends.wire import MAX_FRAME_BYTES, recv_frame, send_frame
from megaphone.state_backends.worker_store import StoreVersionError, WorkerStore
from tests.helpers.mapped_files import mapped_tables

BINS = 16


def raw(keys) -> list[bytes]:
    import numpy as np

    k = np.asarray(keys, dtype=np.int64)
    return list(encode_keys(bin_of(k, BINS), k, "int64"))


def one_epoch(store, epoch: int, keys, installed=(), run: str = "") -> None:
    """Add one to ``keys`` and commit ``epoch`` (a RemoteStore after ``begin``) in ``run``."""
    rk = raw(keys)
    old = store.read(rk)
    new = [msgpack.packb((msgpack.unpackb(v) if v else 0) + 1) for v in old]
    store.commit(epoch, rk, new, old, f"out{epoch}".encode(), list(installed), run)


def counts(store, keys) -> list[int | None]:
    return [msgpack.unpackb(v) if v else None for v in store.read(raw(keys))]


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_commit_replay_and_rollback_of_a_worker_store(tmp_path, kind):
    with WorkerStore.open(kind, tmp_path / "w", "int64", BINS) as store:
        assert store.epoch == -1 and store.check_can_apply(0)
        one_epoch(store, 0, [1, 2])
        one_epoch(store, 1, [2, 3])
        assert store.epoch == 1 and store.stored_outputs() == b"out1"
        assert not store.check_can_apply(1)  # a retry of epoch 1: replay
        with pytest.raises(StoreVersionError, match="ahead of epoch 0"):
            store.check_can_apply(0)
        with pytest.raises(StoreVersionError, match="cannot commit 1"):
            one_epoch(store, 1, [9])
        store.rollback(1)
        assert store.epoch == 0 and counts(store, [1, 2, 3]) == [1, 1, None]
        with pytest.raises(StoreVersionError, match="no undo record for epoch 1"):
            store.rollback(1)
    with WorkerStore.open(kind, tmp_path / "w", "int64", BINS, read_only=True) as again:
        assert again.epoch == 0 and counts(again, [1, 2, 3]) == [1, 1, None]


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_a_commit_reports_whether_the_store_is_compacting(tmp_path, kind, monkeypatch):
    """The deadline policy learns epochs beside a compaction apart (docs/transfer.md): a
    RocksDB store's commit says whether a compaction runs or is due; a memory store has none."""
    with WorkerStore.open(kind, tmp_path / "w", "int64", BINS) as store:
        one_epoch(store, 0, [1, 2])
        expected = None if kind == "memory" else False
        assert store.health()["compacting"] is expected
        if kind == "rocksdb":
            real = store.backend.property
            monkeypatch.setattr(store.backend, "property", lambda name: "1" if name ==
                                "rocksdb.num-running-compactions" else real(name))
            assert store.health()["compacting"] is True


def test_a_store_stays_open_in_the_service_and_survives_its_kill(tmp_path, local):
    path = str(tmp_path / "w")
    store = RemoteStore(local, path, "rocksdb", "int64", BINS, 0)
    for epoch in range(3):
        assert store.begin(epoch) == (True, b"")
        one_epoch(store, epoch, [1, 2])
    first = store.service_pid
    # The store is open in the service, not here: a second writer is refused by RocksDB's lock,
    # while a read-only open (inspect, state()) works beside it.
    with pytest.raises(Exception, match=r"(?i)lock"):
        WorkerStore.open("rocksdb", path, "int64", BINS)
    with WorkerStore.open("rocksdb", path, "int64", BINS, read_only=True) as ro:
        assert ro.epoch == 2
    os.kill(first, signal.SIGKILL)
    time.sleep(0.2)
    # A retry of epoch 2 after the kill: a new service reopens the store from its log, and the
    # epoch is replayed with its stored outputs, not applied twice.
    again = RemoteStore(local, path, "rocksdb", "int64", BINS, 0)
    assert again.begin(2) == (False, b"out2")
    assert again.service_pid != first
    assert counts(again, [1, 2]) == [3, 3]
    assert release_stores(local, str(tmp_path)) == [os.path.abspath(path)]
    with WorkerStore.open("rocksdb", path, "int64", BINS) as direct:  # the lock is free again
        assert direct.epoch == 2


def test_a_stale_attempt_cannot_write_after_a_retry_began(tmp_path, local):
    path = str(tmp_path / "w")
    zombie = RemoteStore(local, path, "rocksdb", "int64", BINS, 0)
    retry = RemoteStore(local, path, "rocksdb", "int64", BINS, 0)
    zombie.begin(0)
    retry.begin(0)  # a newer attempt of the same epoch
    with pytest.raises(StoreError, match="LeaseLost"):
        one_epoch(zombie, 0, [1])
    with pytest.raises(StoreError, match="LeaseLost"):
        zombie.drop_bins([1])
    one_epoch(retry, 0, [1])
    assert counts(retry, [1]) == [1]


def test_the_service_closes_the_stores_of_a_dead_executor_and_exits(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = (gone.pid, process_start(gone.pid))
    gone.wait()
    service = StoreService(idle_exit_s=3600)
    req = {"path": str(tmp_path / "w"), "kind": "rocksdb", "key_type": "int64",
           "num_bins": BINS}
    service.op_begin({**req, "epoch": 0}, owner)
    alive = (os.getpid(), process_start(os.getpid()))
    service.op_begin({**req, "path": str(tmp_path / "v"), "epoch": 0}, alive)
    assert service.housekeeping()  # the live executor's store keeps the service up
    assert set(service.stores) == {str(tmp_path / "v")}
    service.close_stores(lambda p, e: True, "test")
    assert not service.housekeeping()  # nothing left, and an executor it served is gone
    with WorkerStore.open("rocksdb", tmp_path / "w", "int64", BINS) as store:
        assert store.epoch == -1  # closed: its lock is free


def test_a_store_is_refused_under_other_settings(tmp_path, local):
    path = str(tmp_path / "w")
    RemoteStore(local, path, "rocksdb", "int64", BINS, 0).begin(0)
    with pytest.raises(StoreError, match="is open as rocksdb/int64/16 bins"):
        RemoteStore(local, path, "rocksdb", "int64", 32, 0).begin(0)


def test_a_service_running_other_code_is_replaced(tmp_path):
    """A service started before an upgrade may not speak this protocol: it is stopped and a
    new one started, never used."""
    from megaphone.state_backends import remote

    local = str(tmp_path / "local")
    os.makedirs(local)
    old = subprocess.Popen(
        [sys.executable, "-c",
         "from megaphone.state_backends import service_identity, service_process; "
         "service_identity._CODE_ID = 'code-before-an-upgrade'; service_process.main()", local],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while service_pid(local) != old.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service_pid(local) == old.pid
        conn = remote.connect(local)
        assert conn is not None and conn.pid != old.pid
        assert old.wait(timeout=30) == 0  # it was asked to stop, and did
        conn.call("shutdown")
    finally:
        remote.forget(local)
        if old.poll() is None:
            old.kill()


def test_a_service_whose_starter_died_before_its_hello_exits_at_once(tmp_path):
    """A crash while the service starts leaves it without a store or a connection: it watches
    its starter from the start, so it exits as soon as it finds it gone, not after idling."""
    local = str(tmp_path / "local")
    os.makedirs(local)
    starter = subprocess.Popen([sys.executable, "-c", "pass"])
    watch = f"{starter.pid}:{process_start(starter.pid)}"
    starter.wait()  # gone (and reaped) before the service runs
    started = time.monotonic()
    service = subprocess.run(
        [sys.executable, "-c", "from megaphone.state_backends import service_process; "
         "service_process.main()", local, "--idle-exit", "3600", "--watch", watch],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        timeout=60)
    assert service.returncode == 0 and time.monotonic() - started < 30
    assert service_pid(local) is None


def test_a_copy_that_a_failed_run_left_on_a_host_is_never_used(tmp_path):
    """Two hosts (two services) and one checkpoint location. Run r1 applies epoch 1 on host A
    and fails before committing it; run r2 applies epoch 1 to another batch on host B and
    commits it. When the worker's task is back on host A, A's copy is at epoch 1 too, but
    not the committed attempt (its token differs): it is restored from the checkpoint. A copy
    of a worker that owned no bins at the commit is emptied."""
    ckpt, hosts = str(tmp_path / "ckpt"), [str(tmp_path / h) for h in ("a", "b")]

    def store(host: str, committed: str) -> RemoteStore:
        return RemoteStore(host, f"{host}/w0", "rocksdb", "int64", BINS, 0,
                           DurableSpec(ckpt, 0, 50, committed))

    try:
        a = store(hosts[0], "")
        assert a.begin(0, None, "r1") == (True, b"")
        one_epoch(a, 0, [1], run="r1")  # committed by r1
        t0 = a.token
        a = store(hosts[0], t0)
        assert a.begin(1, 0, "r1") == (True, b"")
        one_epoch(a, 1, [1], run="r1")  # r1 fails before its commit
        b = store(hosts[1], t0)
        assert b.begin(1, 0, "r2") == (True, b"") and b.restored["epoch"] == 0
        one_epoch(b, 1, [2], run="r2")  # committed by r2
        a = store(hosts[0], b.token)
        assert a.begin(2, 1, "r2") == (True, b"")
        assert a.restored is not None and a.restored["epoch"] == 1
        assert counts(a, [1, 2]) == [1, 1]
        one_epoch(a, 2, [2], run="r2")
        again = store(hosts[0], b.token)
        assert again.begin(2, 1, "r2") == (False, b"out2") and again.token == a.token
        b = store(hosts[1], a.token)  # its bins moved away at epoch 2: B's copy is emptied
        assert b.begin(3, None, "r2") == (True, b"") and counts(b, [1, 2]) == [None, None]
    finally:
        for host in hosts:
            if (pid := service_pid(host)) is not None:
                os.kill(pid, signal.SIGKILL)


def test_a_durable_copy_another_attempt_overwrote_fails_the_restore_loudly(tmp_path):
    """Two attempts of epoch 0 in one run, on two hosts: the driver takes B's, then A's late
    write replaces B's changelog. A third host that must restore the committed attempt finds
    the wrong one and says so, instead of restoring it."""
    ckpt, hosts = str(tmp_path / "ckpt"), [str(tmp_path / h) for h in ("a", "b", "c")]

    def store(host: str, committed: str = "") -> RemoteStore:
        return RemoteStore(host, f"{host}/w0", "rocksdb", "int64", BINS, 0,
                           DurableSpec(ckpt, 0, 50, committed))

    try:
        b = store(hosts[1])
        b.begin(0, None, "r")
        one_epoch(b, 0, [1], run="r")  # the attempt the driver takes
        a = store(hosts[0])
        a.begin(0, None, "r")
        one_epoch(a, 0, [1, 2], run="r")  # a late attempt: its changelog replaces B's
        with pytest.raises(StoreError, match="not by the one the driver committed"):
            store(hosts[2], b.token).begin(1, 0, "r")
    finally:
        for host in hosts:
            if (pid := service_pid(host)) is not None:
                os.kill(pid, signal.SIGKILL)


def test_a_copy_left_behind_on_the_committed_history_replays_only_what_it_lacks(tmp_path):
    """A worker runs epoch 0 on host A, epochs 1 and 2 on host B, then epoch 3 on A again:
    A's copy is caught up with the changelogs of epochs 1 and 2, not rebuilt."""
    ckpt, hosts = str(tmp_path / "ckpt"), [str(tmp_path / h) for h in ("a", "b")]

    def store(host: str, committed: str = "") -> RemoteStore:
        return RemoteStore(host, f"{host}/w0", "rocksdb", "int64", BINS, 0,
                           DurableSpec(ckpt, 0, 50, committed))

    try:
        a = store(hosts[0])
        a.begin(0, None, "r")
        one_epoch(a, 0, [1, 2], run="r")
        token = a.token
        for epoch in (1, 2):
            b = store(hosts[1], token)
            b.begin(epoch, epoch - 1, "r")
            one_epoch(b, epoch, [2, 3], run="r")
            token = b.token
        a = store(hosts[0], token)
        assert a.begin(3, 2, "r") == (True, b"")
        assert (a.restored["since"], a.restored["changelogs"], a.restored["snapshot"]) == \
            (0, 2, None)
        assert counts(a, [1, 2, 3]) == [1, 3, 2]
        one_epoch(a, 3, [3], run="r")
        assert counts(a, [1, 2, 3]) == [1, 3, 3]
    finally:
        for host in hosts:
            if (pid := service_pid(host)) is not None:
                os.kill(pid, signal.SIGKILL)


def _wal_and_sst_bytes(path) -> tuple[int, int]:
    files = [f for f in os.scandir(path) if f.is_file()]
    return (sum(f.stat().st_size for f in files if f.name.endswith(".log")),
            sum(f.stat().st_size for f in files if f.name.endswith(".sst")))


def test_a_slowly_written_store_has_its_log_trimmed_between_epochs(tmp_path, monkeypatch):
    """A memtable RocksDB would not flush for hours keeps its write-ahead log growing on disk;
    the service flushes one that is old and big enough, between two operations."""
    import megaphone.state_backends.rocksdb_tuning as tuning

    service = StoreService(idle_exit_s=3600)
    path = tmp_path / "w"
    req = {"path": str(path), "kind": "rocksdb", "key_type": "int64", "num_bins": BINS}
    service.op_begin({**req, "epoch": 0}, None)
    entry = service.stores[str(path)]
    keys = raw(range(2000))
    for i in range(20):  # the same keys again and again, as a steady stream's epochs do
        entry.store.backend.write_raw(keys, [msgpack.packb(i)] * len(keys))
    wal, sst = _wal_and_sst_bytes(path)
    assert wal > 256 << 10 and sst == 0
    monkeypatch.setattr(tuning, "LOG_TRIM_BYTES", 256 << 10)
    service.housekeeping()  # young memtable (LOG_TRIM_AGE_S): kept
    assert _wal_and_sst_bytes(path) == (wal, 0)
    monkeypatch.setattr(tuning, "LOG_TRIM_AGE_S", 0.0)
    with entry.lock:
        service.housekeeping()  # in the middle of an operation: kept
    assert _wal_and_sst_bytes(path) == (wal, 0)
    service.housekeeping()
    deadline = time.monotonic() + 10
    while _wal_and_sst_bytes(path)[0] >= wal and time.monotonic() < deadline:
        time.sleep(0.05)
    wal_after, sst_after = _wal_and_sst_bytes(path)
    assert wal_after < wal // 10 and sst_after > 0
    assert entry.store.backend.get_raw(keys[:3]) == [msgpack.packb(19)] * 3
    service.close_stores(lambda p, e: True, "test")


def test_a_store_a_move_takes_bins_from_keeps_its_memtable(tmp_path, monkeypatch):
    """A flush in the middle of a move would carry its range deletions into the tree and start
    a rewrite of the store; the trim waits while the worker has bins to send or dropped some in
    the last DROP_QUIET_S, or until the memtable is LOG_TRIM_MAX_AGE_S old."""
    import megaphone.state_backends.rocksdb_tuning as tuning

    service = StoreService(idle_exit_s=3600)
    path = tmp_path / "w"
    req = {"path": str(path), "kind": "rocksdb", "key_type": "int64", "num_bins": BINS}
    service.op_begin({**req, "epoch": 0}, None)
    entry = service.stores[str(path)]
    backend = entry.store.backend
    keys = raw(range(2000))
    for i in range(20):
        backend.write_raw(keys, [msgpack.packb(i)] * len(keys))
    monkeypatch.setattr(tuning, "LOG_TRIM_BYTES", 256 << 10)
    monkeypatch.setattr(tuning, "LOG_TRIM_AGE_S", 0.0)
    backend.drop_bins([])  # drops nothing: no move under way
    assert backend.last_drop_s == -math.inf
    backend.drop_bins([bins_of_raw(keys[:1])[0]])
    assert time.monotonic() - backend.last_drop_s < 5
    wal, _ = _wal_and_sst_bytes(path)
    service.housekeeping()  # a bin dropped just now: kept (no flush started)
    assert entry.log.seen > 0 and _wal_and_sst_bytes(path) == (wal, 0)
    backend.last_drop_s -= tuning.DROP_QUIET_S  # the drops paused, but bins are still to go
    entry.ahead.bins = [3]
    service.housekeeping()
    assert entry.log.seen > 0 and _wal_and_sst_bytes(path) == (wal, 0)
    monkeypatch.setattr(tuning, "LOG_TRIM_MAX_AGE_S", 0.0)  # too old to wait for the move
    service.housekeeping()
    deadline = time.monotonic() + 10
    while _wal_and_sst_bytes(path)[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _wal_and_sst_bytes(path)[1] > 0
    service.close_stores(lambda p, e: True, "test")


def test_a_trim_is_due_once_the_move_is_done_with_the_store():
    """The trim's rule alone: a memtable old and big enough waits while its worker has bins
    still to send and while bins are dropped, and is flushed DROP_QUIET_S after the last drop
    once none are left to send."""
    from megaphone.state_backends.rocksdb_tuning import (
        DROP_QUIET_S,
        LOG_TRIM_AGE_S,
        LOG_TRIM_MAX_AGE_S,
        LogTrim,
    )

    class Backend:
        path = "w"
        last_drop_s = -math.inf
        flushes = 0

        def memtable_bytes(self) -> int:
            return 8 << 20

        def flush_in_background(self) -> bool:
            self.flushes += 1
            return True

    b, t0 = Backend(), 1000.0
    trim = LogTrim(since=t0)
    b.last_drop_s = t0 + LOG_TRIM_AGE_S
    assert not trim.trim(b, t0 + LOG_TRIM_AGE_S + 1)  # dropping
    assert not trim.trim(b, b.last_drop_s + DROP_QUIET_S - 1)
    # a pause in the move's drops: bins still to send keep it waiting
    assert not trim.trim(b, b.last_drop_s + DROP_QUIET_S, sending=True)
    assert trim.trim(b, b.last_drop_s + DROP_QUIET_S) and b.flushes == 1
    trim = LogTrim(since=t0)
    b.last_drop_s = t0 + LOG_TRIM_MAX_AGE_S - 1  # still dropping, but the log is too old
    assert trim.trim(b, t0 + LOG_TRIM_MAX_AGE_S, sending=True) and b.flushes == 2


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc/self/maps")
def test_housekeeping_keeps_a_compactions_new_tables_mapped_and_drops_its_old(tmp_path):
    """Table files stay mapped, out of the reach of a proactive reclaim of unmapped page cache
    (docs/worker-store.md); a compaction replaces them, and the service follows between two
    operations."""
    service = StoreService(idle_exit_s=3600)
    path = tmp_path / "w"
    req = {"path": str(path), "kind": "rocksdb", "key_type": "int64", "num_bins": BINS}
    service.op_begin({**req, "epoch": 0}, None)
    backend = service.stores[str(path)].store.backend
    for start in (0, 2000):
        backend.write_raw(raw(range(start, start + 2000)), [msgpack.packb(1)] * 2000)
        backend.flush()
    backend._db.compact_range(None, None)
    tables = {f for f in os.listdir(path) if f.endswith(".sst")}

    def mapped_soon() -> set[str]:
        deadline = time.monotonic() + 10
        while mapped_tables(path) != tables and time.monotonic() < deadline:
            time.sleep(0.05)
        return mapped_tables(path)

    service.housekeeping()
    assert tables and mapped_soon() == tables
    service.close_stores(lambda p, e: True, "test")
    assert mapped_tables(path) == set()


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


#: Bytes that are not a request of the store service's protocol, each sent on its own
#: connection: an oversized length, a frame cut short, garbage, msgpack that is not a map.
MALFORMED = {
    "oversized": struct.pack(">I", MAX_FRAME_BYTES + 1) + b"\x80",
    "cut short": struct.pack(">I", 100) + b"\x81" * 10,
    "garbage": _frame(b"\xc1\xc1\xc1"),
    "not a map": _frame(msgpack.packb([1, 2, 3])),
}


def test_malformed_frames_are_refused_and_the_service_keeps_serving(tmp_path, local):
    """Each malformed frame gets a FrameError and its connection dropped; a request for an
    unknown operation or with wrong fields gets an error and the connection stays usable;
    the same service keeps serving, and the store is unchanged."""
    path = str(tmp_path / "w")
    store = RemoteStore(local, path, "rocksdb", "int64", BINS, 0)
    store.begin(0)
    one_epoch(store, 0, [1, 2])
    for name, data in MALFORMED.items():
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(store_socket_path(local))
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)  # "cut short": the body never comes
            reply = recv_frame(sock)
            assert reply is not None and reply["error"] == "FrameError", name
            with contextlib.suppress(ConnectionResetError):  # closed with bytes unread
                assert recv_frame(sock) is None, name  # dropped
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(store_socket_path(local))
        for request in ({"op": "rmtree", "path": path}, {"op": 7}, {},
                        {"op": "drop", "path": path, "bins": "all"},
                        {"op": "read", "path": path}):
            send_frame(sock, request)
            reply = recv_frame(sock)
            assert reply is not None and reply["ok"] is False, request
        send_frame(sock, {"op": "hello"})
        assert recv_frame(sock)["ok"] is True  # the connection still serves
    again = RemoteStore(local, path, "rocksdb", "int64", BINS, 0)
    assert again.begin(1) == (True, b"")
    assert again.service_pid == store.service_pid
    assert counts(again, [1, 2, 3]) == [1, 1, None]


def test_a_frame_whose_body_stalls_is_refused(monkeypatch):
    """A peer that sends a frame's length and then stalls frees the reader after
    ``FRAME_TIMEOUT_S``; the socket's own timeout is restored."""
    monkeypatch.setattr(wire, "FRAME_TIMEOUT_S", 0.2)
    left, right = socket.socketpair()
    with left, right:
        left.sendall(struct.pack(">I", 50) + b"\x80")
        with pytest.raises(wire.FrameError, match="did not arrive"):
            wire.recv_frame(right)
        assert right.gettimeout() is None
        with pytest.raises(wire.FrameError, match="exceeds"):
            monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 8)
            wire.send_frame(left, {"op": "x" * 20})
