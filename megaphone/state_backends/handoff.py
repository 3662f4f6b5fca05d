"""Home-to-home transfer: a moving bin's file goes from the old home's store service straight to
the new home's, so its bytes cross hosts once (docs/placement.md, step 7; docs/transfer.md).

With homes, the exporting task asks the sender's service to write each moving bin's SST file
and keep it in the sender's outgoing transfer directory (:func:`keep_file`), tagged with the
epoch. Only a small descriptor (:class:`FileRef`: the file, the sender, the address and host id
of the service keeping it) travels through the epoch's shuffle. The receiving task asks its
home's service to ``pull`` the files: that service connects to the keeping service over TCP,
authenticated with the pipeline's registered secret as a task is, and asks it to ``fetch`` each
file (:func:`serve_file`: only a kept file of the authenticated pipeline's worker, by a name
checked against :data:`KEPT_NAME`, in parts of at most :data:`MAX_PART_BYTES`), then ingests
them. A kept file stays until the sender's store begins an epoch after the one that kept it
(:func:`drop_kept`), so a retried receiver pulls it again; a reopened store deletes what is
left, and a file that is gone fails the pull (and so the epoch) loudly.

Without a checkpoint location every worker's store lives in the pipeline's state directory, which
each task's service reaches. A moving bin's file is then kept the same way, and the receiving
store's service links it from the sender's store into its own (:func:`link_kept`: a hard link,
a copy where the filesystem has none): only a :class:`LinkRef` crosses the shuffle, and the
file's bytes are neither read nor written again (docs/transfer.md, "Within the state
directory").
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import os
import re
import shutil
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from megaphone.errors import MegaphoneError
from megaphone.state_backends.bin_files import BinFile, FileAssembler, discard, transfer_dir
from megaphone.state_backends.service_client import StoreError, StoreUnavailable, dial_network
from megaphone.state_backends.wire import FrameError, recv_frame, send_frame

#: The name of a kept file: the epoch that kept it, then the bin file's own name.
KEPT_NAME = re.compile(r"e([0-9]{1,18})bin[0-9]+x[0-9a-f]{32}")
#: The largest part of a file a service sends or accepts in one frame.
MAX_PART_BYTES = 64 << 20
#: Bytes of a part's frame beyond its data (the map's keys and the offset).
_FRAME_SLACK = 1024
#: Seconds a pulling service waits for the next frame of a file it fetches.
PULL_TIMEOUT_S = 60.0


class FileNotKept(MegaphoneError, FileNotFoundError):
    """A fetched file is not kept (any more) by the service asked: its epoch was committed, or
    its store reopened since (a restarted service). The puller reports it as
    ``StoreUnavailable``: the epoch's job runs again, and its exporters keep new files."""


@dataclass(frozen=True)
class FileRef:
    """A bin file kept at the sender's home: the ``file`` (its path is on that host), the
    ``worker`` that sent it, and the ``source`` ``[host, port]`` and ``host`` id of the service
    keeping it."""

    file: BinFile
    worker: int
    source: list[Any]
    host: str

    def to_wire(self) -> dict[str, Any]:
        """The descriptor as a msgpack-able map (the shuffle's file column holds it)."""
        return {**self.file.to_wire(), "worker": self.worker, "source": list(self.source),
                "host": self.host}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> FileRef:
        """The reference :meth:`to_wire` wrote (``ValueError`` if it is malformed)."""
        made = BinFile.from_wire(data)
        worker, source, host = data.get("worker"), data.get("source"), data.get("host")
        if not KEPT_NAME.fullmatch(made.name) or isinstance(worker, bool) or \
                not isinstance(worker, int) or worker < 0 or not isinstance(host, str) or \
                not isinstance(source, list | tuple) or len(source) != 2 or \
                not isinstance(source[0], str) or not isinstance(source[1], int):
            raise ValueError(f"malformed bin file reference {data!r:.200}")
        return cls(made, worker, list(source), host)


@dataclass(frozen=True)
class LinkRef:
    """A bin file kept in the outgoing transfer directory of the store of ``worker``, a sibling
    of the receiver's store in the pipeline's state directory: the receiver's service links it
    (:func:`link_kept`). Its path is never taken from the shuffle: the receiving task names the
    sender's store, the service checks it is a sibling of its own."""

    file: BinFile
    worker: int

    def to_wire(self) -> dict[str, Any]:
        """The descriptor as a msgpack-able map (the shuffle's file column holds it)."""
        return {**self.file.to_wire(), "worker": self.worker, "link": True}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> LinkRef:
        """The reference :meth:`to_wire` wrote (``ValueError`` if it is malformed)."""
        made, worker = BinFile.from_wire(data), data.get("worker")
        if not KEPT_NAME.fullmatch(made.name) or data.get("link") is not True or \
                isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
            raise ValueError(f"malformed bin file link {data!r:.200}")
        return cls(made, worker)


def link_kept(store_path: str, sender_path: str, made: BinFile, into: str) -> BinFile:
    """The kept file ``made`` of the store at ``sender_path``, linked (copied where the
    filesystem cannot link) into the directory ``into`` of the store at ``store_path``; that
    copy, ready to ingest. The sender's store must be a sibling of the receiver's (one state
    directory's ``workers/``), the name a kept file's, the file a regular one of the described
    size: else a ``ValueError``. A file that is not there (its store reopened since, or its
    epoch committed) is a ``StoreUnavailable``: the epoch's job runs again, and exports anew."""
    if not KEPT_NAME.fullmatch(made.name):
        raise ValueError(f"no kept bin file is named {made.name!r:.80}")
    here, there = os.path.abspath(store_path), os.path.abspath(sender_path)
    if here == there or os.path.dirname(here) != os.path.dirname(there):
        raise ValueError(f"store {sender_path} is not a sibling of {store_path}: a kept file is "
                         "linked only within one state directory")
    source = os.path.join(transfer_dir(there, "out"), f"out-{made.name}.sst")
    try:
        st = os.lstat(source)
    except FileNotFoundError:
        raise StoreUnavailable(f"StoreUnavailable: bin file {made.name} is not kept in "
                               f"{sender_path} (its store reopened since)") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size != made.size:
        raise ValueError(f"kept bin file {made.name} is not a regular file of {made.size} bytes")
    os.makedirs(into, exist_ok=True)
    target = os.path.join(into, f"in-{made.name}.sst")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)  # a retried attempt's link
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(source, target)
    return dataclasses.replace(made, path=target)


def link_all(store_path: str, links: list[dict[str, Any]]) -> list[BinFile]:
    """:func:`link_kept` for each of ``links`` (a :class:`LinkRef`'s map plus its sender's
    ``store`` path) into the incoming transfer directory of the store at ``store_path``; the
    linked copies (all deleted again if one fails)."""
    inbox, files = transfer_dir(store_path, "in"), []
    try:
        for wire in links:
            ref = LinkRef.from_wire(wire)
            files.append(link_kept(store_path, str(wire.get("store")), ref.file, inbox))
    except BaseException:
        discard(files)
        raise
    return files


def keep_file(made: BinFile, epoch: int) -> BinFile:
    """Keep the bin file ``made`` (just written in its store's outgoing transfer directory) for
    a pull, under a name tagged with ``epoch``."""
    name = f"e{int(epoch)}{made.name}"
    path = os.path.join(os.path.dirname(made.path), f"out-{name}.sst")
    os.replace(made.path, path)
    return dataclasses.replace(made, path=path, name=name)


def drop_kept(store_path: str, before: int) -> int:
    """Delete the files kept in the store at ``store_path`` by epochs before ``before`` (the
    driver committed them: no receiver pulls them again); how many went."""
    try:
        names = os.listdir(transfer_dir(store_path, "out"))
    except FileNotFoundError:
        return 0
    dropped = 0
    for name in names:
        found = KEPT_NAME.fullmatch(name[4:-4]) if name.startswith("out-") and \
            name.endswith(".sst") else None
        if found is not None and int(found.group(1)) < before:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(transfer_dir(store_path, "out"), name))
            dropped += 1
    return dropped


def serve_file(sock: socket.socket, req: dict[str, Any]) -> None:
    """Answer a ``fetch``: the kept file ``req["name"]`` of the store at ``req["path"]`` (a
    network request's path is derived from its pipeline and worker), as frames of at most
    ``req["part_bytes"]`` data each, then an end frame with the size. A name that is no kept
    file's, a file that is not a regular one or parts too large: a ``ValueError``; a file that
    is not there: :class:`FileNotKept`; both before anything is sent."""
    name, part_bytes = req.get("name"), req.get("part_bytes")
    if not isinstance(name, str) or not KEPT_NAME.fullmatch(name):
        raise ValueError(f"no kept bin file is named {name!r:.80}")
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or \
            not 0 < part_bytes <= MAX_PART_BYTES:
        raise ValueError(f"part_bytes must be 1..{MAX_PART_BYTES}, not {part_bytes!r:.40}")
    path = os.path.join(transfer_dir(req["path"], "out"), f"out-{name}.sst")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise FileNotKept(f"bin file {name} is not kept here (its epoch was committed, or its "
                          "store reopened since)") from None
    except OSError as exc:  # a symbolic link (ELOOP), or what cannot be read
        raise ValueError(f"bin file {name} cannot be served: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise ValueError(f"bin file {name} is not a regular file")
        size = 0
        while data := fh.read(part_bytes):
            send_frame(sock, {"offset": size, "data": data})
            size += len(data)
    send_frame(sock, {"ok": True, "end": True, "size": size})


def pull_files(refs: Iterable[FileRef], into: FileAssembler, pipeline_id: str, secret: str,
               part_bytes: int) -> None:
    """Fetch each of ``refs`` from the service keeping it (one authenticated connection per
    service, as ``pipeline_id`` with its ``secret``) into ``into``. A service that cannot be
    reached is a :class:`StoreUnavailable`; a refusal, a part larger than asked or a file that
    arrives incomplete, a :class:`StoreError`."""
    part_bytes = min(part_bytes, MAX_PART_BYTES)
    by_source: dict[tuple[str, int], list[FileRef]] = {}
    for ref in refs:
        by_source.setdefault((ref.source[0], ref.source[1]), []).append(ref)
    for source, wanted in sorted(by_source.items()):
        conn = dial_network(source, pipeline_id, secret)
        try:
            conn.sock.settimeout(PULL_TIMEOUT_S)
            for ref in wanted:
                send_frame(conn.sock, {"op": "fetch", "worker": ref.worker,
                                       "name": ref.file.name, "part_bytes": part_bytes})
                _receive_file(conn.sock, ref, into, part_bytes + _FRAME_SLACK)
        except FrameError as exc:  # oversized, cut short or garbled: not a service's answer
            raise StoreError(f"FrameError: the service at {source[0]}:{source[1]}: {exc}"
                             ) from None
        except OSError as exc:
            raise StoreUnavailable(f"StoreUnavailable: the store service at {source[0]}:"
                                   f"{source[1]} keeping bin files: {exc}") from exc
        finally:
            conn.close()


def _receive_file(sock: socket.socket, ref: FileRef, into: FileAssembler, max_frame: int
                  ) -> None:
    """The frames answering one ``fetch``, written into ``into``."""
    while True:
        frame = recv_frame(sock, max_frame)
        if frame is None:
            raise StoreUnavailable(f"StoreUnavailable: the service keeping bin file "
                                   f"{ref.file.name} closed the connection")
        if frame.get("ok") is False:
            error = StoreUnavailable if frame.get("error") == FileNotKept.__name__ else StoreError
            raise error(f"{frame.get('error')}: {frame.get('message')}")
        if frame.get("end"):
            return
        data, offset = frame.get("data"), frame.get("offset")
        if not isinstance(data, bytes) or isinstance(offset, bool) or \
                not isinstance(offset, int):
            raise StoreError(f"a malformed part of bin file {ref.file.name}")
        try:
            into.add(ref.file, offset, data)
        except RuntimeError as exc:  # a part twice or outside the file
            raise StoreError(f"RuntimeError: {exc}") from None


def crossings(*hosts: str | None) -> int:
    """How many times bytes that went through ``hosts`` in order crossed from one host to
    another (an unknown host, ``None``, counts no crossing)."""
    known = [h for h in hosts if h is not None]
    return sum(1 for a, b in itertools.pairwise(known) if a != b)


__all__ = ["KEPT_NAME", "MAX_PART_BYTES", "PULL_TIMEOUT_S", "FileNotKept", "FileRef", "LinkRef",
           "crossings", "drop_kept", "keep_file", "link_all", "link_kept", "pull_files",
           "serve_file"]
