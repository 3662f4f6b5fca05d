"""How a host's store service and its clients recognize each other.

A digest of the service's code (a client replaces a service running other code) and process
start times (a pid plus its start time names one process even after the pid is reused); the
socket and pid file of a local directory are in :mod:`megaphone.paths`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def process_start(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), ``None`` if it does not exist.

    A pid together with its start time names one process even after the pid is reused.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def code_id() -> str:
    """A digest of the store service's code (this package's modules): a client that reaches a
    service running other code (one started before an upgrade) replaces it, since the two may
    not agree on the protocol."""
    global _CODE_ID
    if _CODE_ID is None:
        digest = hashlib.sha256()
        for path in sorted(Path(__file__).parent.glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        _CODE_ID = digest.hexdigest()[:16]
    return _CODE_ID


_CODE_ID: str | None = None

