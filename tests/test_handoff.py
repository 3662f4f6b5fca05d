"""Home-to-home transfer (docs/placement.md, step 7): a moving bin's file stays at the sender's
home and the receiver's home pulls it from there, service to service, as the pipeline. Two
hosts are two local directories, each with its own services and host id. A refused fetch or
pull changes nothing, and the services keep serving."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from megaphone.paths import host_dir_of, local_worker_path
from megaphone.state_backends.bin_files import BinFile, transfer_dir
from megaphone.state_backends.handoff import (
    MAX_PART_BYTES,
    FileRef,
    LinkRef,
    crossings,
    link_kept,
)
from megaphone.state_backends.host import host_id
from megaphone.state_backends.remote import DurableSpec, RemoteStore, StoreError
from megaphone.state_backends.service_client import StoreUnavailable, dial_network, service_pid
from megaphone.state_backends.wire import recv_frame, send_frame
from tests import test_store_network
from tests.test_store_network import _authenticated, _refused, bin_of
from tests.test_store_service import BINS, counts, one_epoch

#: Worker 0 of ``p1`` at its home, holding keys 1 and 2 (shared with the network tests).
home = test_store_network.home
#: The keys worker 0 holds, and their bins, which move.
KEYS = [1, 2]
MOVING = sorted({bin_of(k) for k in KEYS})


@pytest.fixture
def receiver(home, tmp_path):
    """Worker 1 of ``p1`` on another host (a local directory of its own), its service stopped
    at the end."""
    _, _, secrets, ckpt = home
    other = str(tmp_path / "host-b")
    store = RemoteStore(other, str(local_worker_path(other, "p1", 1)), "rocksdb", "int64",
                        BINS, 1, DurableSpec(ckpt, 1, 50, "", "p1", secrets["p1"]))
    try:
        yield store
    finally:
        pid = service_pid(store.local_dir)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def kept_refs(sender: RemoteStore) -> list[FileRef]:
    """Export the moving bins of worker 0 at epoch 1, kept at its home."""
    refs = list(sender.export(MOVING, 1 << 20, 0, 1, "r", file_min_bytes=0, keep=True))
    assert refs and all(isinstance(r, FileRef) for r in refs)
    return refs


def test_a_bin_moves_home_to_home_exactly_once_under_retries(home, receiver):
    p1, _, _, _ = home
    refs = kept_refs(p1)
    here = host_id(host_dir_of(p1.local_dir))
    assert {r.host for r in refs} == {here} and all(r.source == p1.address for r in refs)
    assert all(os.path.exists(r.file.path) for r in refs)  # left at the sender's home
    assert receiver.begin(1, None, "r") == (True, b"")
    receiver.drop_bins(MOVING)
    assert receiver.pull(refs, part_bytes=7)["keys"] == len(KEYS)  # many small parts
    zombie = receiver.lease
    # A retry of the receiver before the commit: the kept files are pulled again, once.
    assert receiver.begin(1, None, "r") == (True, b"")
    with pytest.raises(StoreError, match="LeaseLost"):
        receiver._call("pull", lease=zombie, pipeline="p1", part_bytes=1 << 20,
                       refs=[r.to_wire() for r in refs])
    receiver.drop_bins(MOVING)
    receiver.pull(refs)
    one_epoch(receiver, 1, [], installed=MOVING)
    assert counts(receiver, KEYS) == [1, 1]
    # The sender's own epoch 1 keeps them (a receiver may still retry); its epoch 2 does not.
    assert p1.begin(1, 0, "r") == (True, b"")
    one_epoch(p1, 1, [])
    assert all(os.path.exists(r.file.path) for r in refs)
    assert p1.begin(2, 1, "r")[0] is True
    assert not any(os.path.exists(r.file.path) for r in refs)
    assert receiver.begin(2, 1, "r")[0] is True
    with pytest.raises(StoreError, match=r"StoreUnavailable.*FileNotKept"):  # the job runs again
        receiver.pull(refs)
    assert counts(receiver, KEYS) == [1, 1]
    assert crossings("a", "a", "b", None, "b") == 1 and crossings("a", "b", "a") == 2


def test_fetch_serves_only_the_pipelines_kept_files_in_bounded_parts(home, receiver):
    p1, store, secrets, _ = home
    refs = kept_refs(p1)
    fetch = {"op": "fetch", "worker": 0, "name": refs[0].file.name, "part_bytes": 1 << 20}
    with pytest.raises(StoreError, match="NetworkRefused"):
        dial_network(p1.address, "p1", secrets["p2"])  # a wrong secret
    with _authenticated(p1.address, "p2", secrets["p2"]) as sock:  # another pipeline's
        send_frame(sock, fetch)
        assert _refused(sock) == "FileNotKept"
    refused = {
        "a path": ({**fetch, "path": p1.path}, "NetworkRefused"),
        "a name leaving the outbox": ({**fetch, "name": "../../secret"}, "ValueError"),
        "a name no kept file has": ({**fetch, "name": "bin0x" + "0" * 32}, "ValueError"),
        "parts above the bound": ({**fetch, "part_bytes": MAX_PART_BYTES + 1}, "ValueError"),
        "another worker's": ({**fetch, "worker": 1}, "FileNotKept"),
    }
    for name, (request, error) in refused.items():
        with _authenticated(p1.address, "p1", secrets["p1"]) as sock:
            send_frame(sock, request)
            assert _refused(sock) == error, name
    # A source that answers with a frame above the bound: the pull fails, nothing installed.
    fake = _fake_source()
    assert receiver.begin(1, None, "r")[0] is True
    bad = FileRef(refs[0].file, 0, ["127.0.0.1", fake.getsockname()[1]], "elsewhere-00000000")
    with pytest.raises(StoreError, match="FrameError"):
        receiver.pull([bad], part_bytes=1024)
    fake.close()
    assert counts(receiver, KEYS) == [None, None]
    # Nothing changed at the sender's home, which still serves the file whole.
    assert all(os.path.exists(r.file.path) for r in refs)
    assert counts(store("p1"), KEYS) == [1, 1]
    with _authenticated(p1.address, "p1", secrets["p1"]) as sock:
        send_frame(sock, {**fetch, "part_bytes": 5})
        got = b""
        while not (frame := recv_frame(sock)).get("end"):
            assert len(frame["data"]) <= 5
            got += frame["data"]
    with open(refs[0].file.path, "rb") as fh:
        assert got == fh.read() and frame["size"] == refs[0].file.size


def _fake_source() -> socket.socket:
    """A listener that passes any client through its challenge, then answers a request with
    the length of a frame far above any part's bound."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            send_frame(conn, {"ok": True, "nonce": b"n" * 32})
            recv_frame(conn)
            send_frame(conn, {"ok": True, "pid": 1})
            recv_frame(conn)
            conn.sendall(struct.pack(">I", 1 << 29))
            conn.recv(1)  # until the client drops the connection

    threading.Thread(target=answer, daemon=True).start()
    return server


def test_a_kept_file_is_linked_only_from_a_sibling_store_and_whole(tmp_path):
    """``link_kept`` takes a kept file only from a sibling store of the receiver's, by a kept
    file's name, a regular file of the described size; a file that is gone is a
    ``StoreUnavailable`` (the epoch's job runs again); a retry links it again."""
    workers = tmp_path / "state" / "workers"
    sender, receiver = workers / "0", workers / "1"
    out = Path(transfer_dir(str(sender), "out"))
    out.mkdir(parents=True)
    made = BinFile(3, 2, 20, 5, str(out / "out-e4bin3xab.sst"), "e4bin3x" + "a" * 32)
    (out / f"out-{made.name}.sst").write_bytes(b"12345")
    inbox = transfer_dir(str(receiver), "in")
    for _ in range(2):  # a retried attempt links the same file again
        got = link_kept(str(receiver), str(sender), made, inbox)
        assert Path(got.path).read_bytes() == b"12345" and got.name == made.name
        assert os.path.dirname(got.path) == inbox and os.stat(got.path).st_nlink == 2
    with pytest.raises(ValueError, match="not a sibling"):
        link_kept(str(receiver), str(tmp_path / "elsewhere" / "0"), made, inbox)
    with pytest.raises(ValueError, match="not a sibling"):
        link_kept(str(receiver), str(receiver), made, inbox)
    with pytest.raises(ValueError, match="no kept bin file"):
        link_kept(str(receiver), str(sender), replace(made, name="../../etc"), inbox)
    with pytest.raises(ValueError, match="regular file of 6 bytes"):
        link_kept(str(receiver), str(sender), replace(made, size=6), inbox)
    with pytest.raises(StoreUnavailable):
        link_kept(str(receiver), str(sender), replace(made, name="e4bin3x" + "b" * 32), inbox)
    (out / f"out-e4bin3x{'c' * 32}.sst").symlink_to(out / f"out-{made.name}.sst")
    with pytest.raises(ValueError, match="regular file"):
        link_kept(str(receiver), str(sender), replace(made, name="e4bin3x" + "c" * 32), inbox)
    with pytest.raises(ValueError, match="malformed bin file link"):
        LinkRef.from_wire({**made.to_wire(), "worker": 0})  # not marked as a link
    assert LinkRef.from_wire(LinkRef(made, 0).to_wire()) == LinkRef(made, 0)
