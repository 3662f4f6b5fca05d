"""The id of a host, as megaphone tells hosts apart: a name kept in the host's store service
directory (``LOCAL_DIR``). Every executor of one machine shares it; two machines, or two
simulated hosts with their own local directories, never do. It names where a worker's task ran
and where its state is at home (docs/placement.md)."""

from __future__ import annotations

import re
import socket
import uuid

from megaphone._io import create_once
from megaphone.errors import MegaphoneError
from megaphone.paths import host_id_path

#: What a host id looks like: the machine's name (sanitized) and eight hex digits.
HOST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}-[0-9a-f]{8}")

_KNOWN: dict[str, str] = {}


class HostIdError(MegaphoneError, ValueError):
    """The host id file under a local directory is not one megaphone wrote."""


def host_id(local_dir: str) -> str:
    """This host's id, created once under ``local_dir`` (the first process to write it wins, so
    concurrent executors agree) and cached per process."""
    known = _KNOWN.get(local_dir)
    if known is not None:
        return known
    path = host_id_path(local_dir)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"
    text = create_once(path, lambda: f"{name}-{uuid.uuid4().hex[:8]}\n", 0o644)
    if not HOST_ID.fullmatch(text):
        raise HostIdError(f"{path} does not hold a host id ({text[:80]!r}); delete it and "
                          "megaphone writes a new one")
    _KNOWN[local_dir] = text
    return text


__all__ = ["HOST_ID", "HostIdError", "host_id"]
