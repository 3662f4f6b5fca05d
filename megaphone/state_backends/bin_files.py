"""Bins shipped as files: a moving bin leaves its sender as one SST file, not as rows of keys.

The sender's store writes the bin's key range into a sorted SST file (:class:`BinFile` describes
it); the file travels through Spark's shuffle in parts of at most ``chunk_bytes``
(:func:`file_parts`); the receiver writes the parts back into a file (:class:`FileAssembler`)
and its store ingests it, with no per-key work there. Bins smaller than
:data:`FILE_MIN_BYTES` keep the row path: an SST file and an ingestion cost a fixed few
milliseconds that a small bin does not pay back (``bench/RESULTS.md``, "Shipping bins as files").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

TRANSFER_MODES = ("auto", "rows", "files")
"""How moving bins travel: ``"files"`` (SST files), ``"rows"`` (one shuffle row per key) or
``"auto"`` (files for bins of at least :data:`FILE_MIN_BYTES`, where the backend can)."""

FILE_MIN_BYTES = 64 << 10
"""``transfer="auto"`` ships a bin as a file from this many bytes of keys and values up."""


def transfer_dir(store_path: str, direction: str) -> str:
    """Where a store's outgoing (``"out"``) or incoming (``"in"``) bin files wait: inside the
    store's directory, whose stale ``.megaphone-ingest-*`` directories a reopen deletes."""
    if direction not in ("in", "out"):
        raise ValueError(f"direction must be 'in' or 'out', not {direction!r}")
    return os.path.join(store_path, f".megaphone-ingest-{direction}")


def check_transfer(mode: str) -> str:
    """``mode`` if it is one of :data:`TRANSFER_MODES`, else ``ValueError``."""
    if mode not in TRANSFER_MODES:
        raise ValueError(f"unknown transfer mode {mode!r}; expected one of {TRANSFER_MODES}")
    return mode


def file_min_bytes(mode: str) -> int | None:
    """The smallest bin (bytes) that ``mode`` ships as a file; ``None``: never."""
    return {"auto": FILE_MIN_BYTES, "files": 0, "rows": None}[check_transfer(mode)]


FILE_KINDS = ("bin", "ahead", "patch")
"""What a bin file holds: the whole bin as of its export (``"bin"``), the whole bin as of a
snapshot before it (``"ahead"``, written ahead: docs/transfer.md), or the changes to such a
file since its snapshot (``"patch"``: puts and deletions, ingested after it)."""


@dataclass(frozen=True)
class BinFile:
    """One bin's state as an SST file: its ``bin``, the ``keys`` and ``bytes`` (keys plus
    values, as the bin's counters count them) the bin holds once the file is installed, the
    file's ``size`` and ``path`` on this host. ``name`` identifies the file across hosts (the
    receiver's copy has the same). ``kind``: one of :data:`FILE_KINDS` (a patch counts no keys
    or bytes: its bin's file written ahead counts the bin's)."""

    bin: int
    keys: int
    bytes: int
    size: int
    path: str
    name: str
    kind: str = "bin"

    def to_wire(self) -> dict[str, Any]:
        """The descriptor as a msgpack-able map."""
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> BinFile:
        """The descriptor from :meth:`to_wire`'s map (``ValueError`` if it is malformed)."""
        try:
            made = cls(int(data["bin"]), int(data["keys"]), int(data["bytes"]),
                       int(data["size"]), str(data["path"]), str(data["name"]),
                       data.get("kind", "bin"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed bin file descriptor {data!r}: {exc}") from None
        if min(made.bin, made.keys, made.bytes, made.size) < 0 or \
                not made.name.isalnum() or made.kind not in FILE_KINDS or \
                (made.kind == "patch" and (made.keys or made.bytes)):
            raise ValueError(f"malformed bin file descriptor {data!r}")
        return made


def new_file_name(b: int) -> str:
    """A fresh name for bin ``b``'s file (alphanumeric, unique across hosts and attempts)."""
    return f"bin{b}x{uuid.uuid4().hex}"


def file_parts(path: str, part_bytes: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` parts of the file at ``path``, each at most ``part_bytes`` long."""
    with open(path, "rb") as fh:
        offset = 0
        while data := fh.read(part_bytes):
            yield offset, data
            offset += len(data)


class FileAssembler:
    """The receiving end: writes the parts of incoming bin files into ``directory``.

    Parts may arrive in any order; a file is complete once all ``size`` bytes are there.
    :meth:`complete` hands over the finished files (their ingestion moves them away);
    :meth:`discard` deletes what is left (a failed attempt), so nothing lingers on disk.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._files: dict[str, tuple[BinFile, set[int], int]] = {}

    def add(self, desc: BinFile, offset: int, data: bytes) -> None:
        """Write one part of the file ``desc`` describes at ``offset``."""
        seen = self._files.get(desc.name)
        if seen is None:
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, f"in-{desc.name}.sst")
            local = dataclasses.replace(desc, path=path)
            with open(path, "wb") as fh:
                fh.truncate(desc.size)
            seen = (local, set(), 0)
        local, offsets, received = seen
        if offset in offsets:  # a part seen twice would be counted twice
            raise RuntimeError(f"part at {offset} of bin file {desc.name} arrived twice")
        if offset < 0 or offset + len(data) > local.size:
            raise RuntimeError(f"part at {offset} (+{len(data)}) lies outside bin file "
                               f"{desc.name} of {local.size} bytes")
        with open(local.path, "r+b") as fh:
            fh.seek(offset)
            fh.write(data)
        offsets.add(offset)
        self._files[desc.name] = (local, offsets, received + len(data))

    def complete(self) -> list[BinFile]:
        """Every file received whole, by bin; ``RuntimeError`` if one lacks parts."""
        missing = [f"{local.name} ({received} of {local.size} bytes)"
                   for local, _, received in self._files.values() if received != local.size]
        if missing:
            raise RuntimeError("bin files arrived incomplete: " + ", ".join(missing))
        return sorted((local for local, _, _ in self._files.values()), key=lambda f: f.bin)

    def discard(self) -> None:
        """Delete every file this assembler wrote that is still here."""
        discard(local for local, _, _ in self._files.values())
        self._files.clear()


def discard(files: Iterable[BinFile]) -> None:
    """Delete ``files`` where they are still there (an ingestion moved the others away)."""
    for f in files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f.path)
