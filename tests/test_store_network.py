"""The store service's network side (docs/placement.md): a pipeline registered on a host is
reachable from its tasks elsewhere, with its secret and nothing else. Each refused connection
or request changes nothing, and the service keeps serving."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import time

import msgpack
import numpy as np
import pyarrow as pa
import pytest

from megaphone.paths import local_worker_path, service_dir
from megaphone.state_backends.network import (
    AUTH_FRAME_BYTES,
    NetworkRefused,
    Registration,
    auth_mac,
    network_request,
    new_secret,
)
from megaphone.state_backends.remote import (
    DurableSpec,
    RemoteStore,
    StoreError,
    service_pid,
    service_pids,
)
from megaphone.state_backends.service_client import dial_network, sibling_address
from megaphone.state_backends.wire import recv_frame, send_frame
from tests.test_store_service import BINS, counts, one_epoch, raw

KIND = {"kind": "rocksdb", "key_type": "int64", "num_bins": BINS}


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A host's service holding worker 0 of pipeline ``p1`` at epoch 0 (keys 1 and 2 counted
    once), with ``p1`` and ``p2`` registered; the service is stopped at the end."""
    monkeypatch.setenv("MEGAPHONE_SERVICE_HOST", "127.0.0.1")
    local, ckpt = str(tmp_path / "local"), str(tmp_path / "ckpt")
    secrets = {"p1": new_secret(), "p2": new_secret()}

    def store(pipeline: str, worker: int = 0) -> RemoteStore:
        return RemoteStore(local, str(local_worker_path(local, pipeline, worker)), "rocksdb",
                           "int64", BINS, worker,
                           DurableSpec(ckpt, worker, 50, "", pipeline, secrets[pipeline]))

    try:
        p1 = store("p1")
        assert p1.begin(0) == (True, b"")
        one_epoch(p1, 0, [1, 2])
        store("p2")
        yield p1, store, secrets, ckpt
    finally:
        for pid in service_pids(local):  # a sibling too, if a test started one
            os.kill(pid, signal.SIGKILL)


def test_a_task_elsewhere_applies_an_epoch_at_the_home_over_the_network(home):
    p1, _, secrets, _ = home
    assert p1.address is not None and p1.address[0] == "127.0.0.1"
    conn = dial_network(p1.address, "p1", secrets["p1"])
    try:  # frames go out at once (no wait for a delayed ACK between a stream's frames)
        assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        begun = conn.call("begin", worker=0, **KIND, epoch=1, current=1, required=0, run="r")
        assert begun["apply"] is True
        keys = raw([1, 3])
        old = conn.call("read", worker=0, **KIND, keys=keys)["values"]
        new = [msgpack.packb((msgpack.unpackb(v) if v else 0) + 1) for v in old]
        conn.call("commit", worker=0, **KIND, lease=begun["lease"], epoch=1, keys=keys,
                  values=new, old=old, outputs=b"out1", installed=[], run="r")
    finally:
        conn.close()
    assert counts(p1, [1, 2, 3]) == [2, 1, 1]  # the home's own handle sees the remote commit


def _challenge(address) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(tuple(address), timeout=10)
    challenge = recv_frame(sock, AUTH_FRAME_BYTES)
    assert challenge is not None and isinstance(challenge["nonce"], bytes)
    return sock, challenge["nonce"]


def _refused(sock: socket.socket) -> str:
    """The error the service answered with; the connection is dropped after it."""
    reply = recv_frame(sock)
    assert reply is not None and reply["ok"] is False
    with contextlib.suppress(ConnectionResetError):
        assert recv_frame(sock) is None
    return reply["error"]


def _authenticated(address, pipeline: str, secret: str) -> socket.socket:
    sock, nonce = _challenge(address)
    send_frame(sock, {"op": "auth", "pipeline": pipeline,
                      "mac": auth_mac(bytes.fromhex(secret), nonce, pipeline)})
    assert recv_frame(sock)["ok"] is True
    return sock


def test_connections_and_requests_without_the_right_are_refused(home):
    p1, store, secrets, _ = home
    address, path = p1.address, p1.path
    pid = p1.service_pid
    wrong = {"wrong secret": ("p1", secrets["p2"]), "another pipeline's id": ("p2", secrets["p1"]),
             "a pipeline never registered here": ("p9", secrets["p1"])}
    for name, (pipeline, secret) in wrong.items():
        sock, nonce = _challenge(address)
        with sock:
            send_frame(sock, {"op": "auth", "pipeline": pipeline,
                              "mac": auth_mac(bytes.fromhex(secret), nonce, pipeline)})
            assert _refused(sock) == "NetworkRefused", name
    before_auth = {
        "a request before authenticating": msgpack.packb({"op": "read", "worker": 0}),
        "an oversized frame": msgpack.packb({"op": "auth", "pipeline": "p1",
                                             "mac": b"x" * AUTH_FRAME_BYTES}),
        "garbage": b"\xc1\xc1\xc1",
        "a frame cut short": None,
    }
    for name, body in before_auth.items():
        sock, _ = _challenge(address)
        with sock:
            if body is None:
                sock.sendall(struct.pack(">I", 100) + b"\x81" * 10)
                sock.shutdown(socket.SHUT_WR)
            else:
                sock.sendall(struct.pack(">I", len(body)) + body)
            assert _refused(sock) in ("NetworkRefused", "FrameError"), name
    requests = {
        "a path in a request": {"op": "read", "worker": 0, "path": path, "keys": raw([1])},
        "a checkpoint of its own": {"op": "stats", "worker": 0, "checkpoint": "file:///x"},
        "no worker": {"op": "read", "keys": raw([1])},
        "a negative worker": {"op": "read", "worker": -1, "keys": raw([1])},
        **{f"op {op}": {"op": op, "worker": 0} for op in
           ("destroy", "release", "shutdown", "ingest", "register", "hello", "rmtree")},
    }
    for name, request in requests.items():
        with _authenticated(address, "p1", secrets["p1"]) as sock:
            send_frame(sock, {**KIND, **request})
            assert _refused(sock) == "NetworkRefused", name
    # Authenticated as p2, worker 0 is p2's worker 0: p1's store is out of its reach.
    with _authenticated(address, "p2", secrets["p2"]) as sock:
        send_frame(sock, {"op": "read", "worker": 0, **KIND, "keys": raw([1, 2])})
        assert recv_frame(sock)["values"] == [None, None]
    # Nothing changed, and the same service still serves both sides.
    assert counts(store("p1"), [1, 2]) == [1, 1] and p1.service_pid == pid
    with _authenticated(address, "p1", secrets["p1"]) as sock:
        send_frame(sock, {"op": "read", "worker": 0, **KIND, "keys": raw([1, 2])})
        assert [msgpack.unpackb(v) for v in recv_frame(sock)["values"]] == [1, 1]


def test_registrations_survive_a_service_restart(home):
    p1, store, secrets, _ = home
    os.kill(p1.service_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while p1.conn.alive() and time.monotonic() < deadline:  # its socket closes as it dies
        time.sleep(0.01)
    again = store("p1")  # a task of p1 starts a new service and registers again
    assert again.service_pid != p1.service_pid
    # p2's registration was kept on the host's disk: its tasks elsewhere still get in.
    conn = dial_network(again.address, "p2", secrets["p2"])
    try:
        assert conn.call("read", worker=0, **KIND, keys=raw([1]))["values"] == [None]
    finally:
        conn.close()
    with pytest.raises(StoreError, match="NetworkRefused"):
        dial_network(again.address, "p2", secrets["p1"])


def test_a_registration_is_checked_and_the_secret_never_printed(home, tmp_path):
    p1, _, secrets, _ = home
    for bad in ({"pipeline": "../x", "secret": secrets["p1"], "checkpoint": "c"},
                {"pipeline": "p3", "secret": "abcd", "checkpoint": "c"},
                {"pipeline": "p3", "secret": secrets["p1"], "checkpoint": ""}):
        with pytest.raises(StoreError, match="ValueError"):
            p1.conn.call("register", **bad)
    reg = Registration("p1", bytes.fromhex(secrets["p1"]), "c")
    assert secrets["p1"] not in repr(reg) and reg.secret.hex() == secrets["p1"]
    spec = DurableSpec("c", 0, 50, "", "p1", secrets["p1"])
    assert secrets["p1"] not in repr(spec)
    with pytest.raises(NetworkRefused, match="may not name path"):
        network_request({"op": "read", "worker": 0, "path": "/etc"}, reg, str(tmp_path))
    assert network_request({"op": "read", "worker": 3}, reg, str(tmp_path))["path"] == \
        os.path.abspath(local_worker_path(str(tmp_path), "p1", 3))


def test_a_pipelines_secret_is_kept_in_its_state_dir_readable_by_its_user_only(tmp_path):
    from megaphone.migrator.statedir.directory import StateDir
    from megaphone.routing.fingerprint import Fingerprint

    state = StateDir.create(tmp_path / "s", Fingerprint("p", BINS, "int64"), 2,
                            {"backend": "memory"})
    first = state.secret()
    assert len(bytes.fromhex(first)) == 32 and state.secret() == first
    assert oct(state.paths.secret.stat().st_mode & 0o777) == "0o600"


def test_a_store_away_from_home_is_used_at_home_and_here_only_if_home_is_gone(home, tmp_path):
    """A task on another host (its own local directory) given worker 0's home reaches the
    home's store: it begins, reads, installs rows and a bin file (sent in parts), and commits
    there; nothing is created on its own host. A home that cannot be reached leaves the task
    on its host's copy, and says so."""
    from megaphone.state_backends import open_backend

    p1, _, secrets, ckpt = home
    elsewhere = str(tmp_path / "elsewhere")
    durable = DurableSpec(ckpt, 0, 50, p1.token, "p1", secrets["p1"])
    away = RemoteStore(elsewhere, str(local_worker_path(elsewhere, "p1", 0)), "rocksdb",
                       "int64", BINS, 0, durable, home=p1.address)
    assert away.remote and not away.home_unreachable and away.address == p1.address
    assert away.service_pid == p1.service_pid and service_pid(elsewhere) is None
    assert away.begin(1, 0) == (True, b"")
    (b_rows,), (b_file,) = {bin_of(5)}, {bin_of(6)}
    away.install([pa.record_batch([pa.array(raw([5])), pa.array([msgpack.packb(10)])],
                                  names=["k", "v"])])
    sender = open_backend("rocksdb", tmp_path / "sender", "int64", BINS)
    try:
        sender.put_many([b_file], [6], [20])
        made = sender.write_bin_file(b_file)
    finally:
        sender.close()
    assert away.ingest([made], part_bytes=7)["keys"] == 1
    one_epoch(away, 1, [1, 5, 6], installed=[b_rows, b_file])
    assert counts(p1, [1, 2, 5, 6]) == [2, 1, 11, 21]  # the home holds all of it
    assert not os.path.exists(local_worker_path(elsewhere, "p1", 0))
    committed = DurableSpec(ckpt, 0, 50, away.token, "p1", secrets["p1"])
    gone = RemoteStore(elsewhere, str(local_worker_path(elsewhere, "p1", 0)), "rocksdb",
                       "int64", BINS, 0, committed, home=["127.0.0.1", 1])
    try:
        assert gone.home_unreachable and not gone.remote
        assert gone.begin(2, 1)[0] is True and gone.restored is not None  # from the checkpoint
        assert counts(gone, [1, 2, 5, 6]) == [2, 1, 11, 21]
    finally:
        pid = service_pid(elsewhere)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def bin_of(key: int) -> int:
    from megaphone.routing.bins import bin_of as of

    return int(of(np.asarray([key], np.int64), BINS)[0])


def test_copies_of_workers_at_home_elsewhere_are_deleted_unless_in_use(home):
    """``prune`` deletes a host's copy of a worker homed elsewhere once it is closed or idle,
    keeps one in use, and refuses a pipeline id that cannot name a folder."""
    from megaphone.state_backends.remote import prune_copies, release_stores

    p1, store, _, _ = home
    local = p1.local_dir
    other = store("p1", worker=1)
    assert other.begin(0) == (True, b"")
    one_epoch(other, 0, [7])
    release_stores(local, os.path.dirname(other.path))  # closed: nothing uses them now
    assert counts(p1, [1, 2]) == [1, 1]  # worker 0's copy is in use again
    assert prune_copies(local, "p1", [0, 1, 5]) == [1]  # 5 has no copy here
    assert not os.path.exists(other.path) and counts(p1, [1, 2]) == [1, 1]
    with pytest.raises(StoreError, match="cannot name a folder"):
        p1.conn.call("prune", pipeline="../p1", workers=[0])


@pytest.fixture
def two_services(monkeypatch):
    """Two store services per host (requested before ``home``, whose services inherit it)."""
    monkeypatch.setenv("MEGAPHONE_STORE_SERVICES", "2")


def test_a_service_gives_its_siblings_address_only_to_its_pipeline_in_range(two_services, home):
    """``sibling``: a known service of a host, asked by an authenticated task, starts the
    host's service of another shard, registers the pipeline there and returns its address. A
    wrong secret, another pipeline's id, a shard out of range and a cut or garbage frame are
    each refused; nothing starts, and the service keeps serving."""
    p1, _, secrets, _ = home
    local, address, pid = p1.local_dir, p1.address, p1.service_pid
    sibling = service_dir(local, 1)
    for name, (pipeline, secret) in {"wrong secret": ("p1", secrets["p2"]),
                                     "another pipeline's id": ("p2", secrets["p1"])}.items():
        with pytest.raises(StoreError, match="NetworkRefused"):
            sibling_address(address, pipeline, secret, 1)
        assert service_pid(sibling) is None, name
    with _authenticated(address, "p1", secrets["p1"]) as sock:
        send_frame(sock, {"op": "sibling", "shard": 1, "pipeline": "p2"})
        assert _refused(sock) == "NetworkRefused"
    with _authenticated(address, "p1", secrets["p1"]) as sock:  # refused, and served on
        for shard in (2, -1, "1", True, None):
            send_frame(sock, {"op": "sibling", "shard": shard})
            reply = recv_frame(sock)
            assert reply["ok"] is False and "numbered 0 to 1" in reply["message"], shard
        assert service_pid(sibling) is None
        send_frame(sock, {"op": "sibling", "shard": 0})  # its own shard: its own address
        assert recv_frame(sock)["address"] == list(address)
    body = msgpack.packb({"op": "sibling", "shard": 1})
    for name, data in {"cut short": struct.pack(">I", len(body)) + body[:-3],
                       "garbage": struct.pack(">I", 3) + b"\xc1\xc1\xc1"}.items():
        with _authenticated(address, "p1", secrets["p1"]) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            assert _refused(sock) == "FrameError", name
        assert service_pid(sibling) is None, name
    found = sibling_address(address, "p1", secrets["p1"], 1)
    assert found != list(address) and service_pid(local) == pid
    assert sibling_address(address, "p1", secrets["p1"], 1) == found  # started once
    assert service_pid(sibling) is not None
    dial_network(found, "p1", secrets["p1"]).close()  # it listens, p1 registered there
    with pytest.raises(StoreError, match="NetworkRefused"):
        dial_network(found, "p1", secrets["p2"])


def test_a_task_away_from_a_new_workers_home_reaches_its_shard_through_a_sibling(
        two_services, home, tmp_path):
    """Worker 1 (shard 1) is homed on a host whose service for shard 0 only is known: a task
    elsewhere asks that service for shard 1's, and commits worker 1's epoch at the home's
    service for shard 1, where the home's own tasks find it; its own host gets no copy."""
    p1, _, secrets, ckpt = home
    local, elsewhere = p1.local_dir, str(tmp_path / "elsewhere")
    away = RemoteStore(elsewhere, str(local_worker_path(elsewhere, "p1", 1)), "rocksdb",
                       "int64", BINS, 1, DurableSpec(ckpt, 1, 50, "", "p1", secrets["p1"]),
                       home=p1.address, sibling=1)
    assert away.remote and not away.home_unreachable and away.address != p1.address
    assert away.service_pid == service_pid(service_dir(local, 1)) != p1.service_pid
    assert away.begin(0) == (True, b"")
    one_epoch(away, 0, [3, 4])
    at_home = RemoteStore(local, str(local_worker_path(local, "p1", 1)), "rocksdb", "int64",
                          BINS, 1, DurableSpec(ckpt, 1, 50, away.token, "p1", secrets["p1"]))
    assert at_home.service_pid == away.service_pid and at_home.address == away.address
    assert counts(at_home, [3, 4]) == [1, 1]
    assert not os.path.exists(local_worker_path(elsewhere, "p1", 1))
    assert service_pids(elsewhere) == []  # nothing started on the task's own host
    # A shard the home does not run: the task says so and uses its own host's copy.
    lost = RemoteStore(elsewhere, str(local_worker_path(elsewhere, "p1", 1)), "rocksdb",
                       "int64", BINS, 1, DurableSpec(ckpt, 1, 50, away.token, "p1",
                                                     secrets["p1"]), home=p1.address, sibling=5)
    try:
        assert lost.home_unreachable and not lost.remote
    finally:
        for pid in service_pids(elsewhere):
            os.kill(pid, signal.SIGKILL)
