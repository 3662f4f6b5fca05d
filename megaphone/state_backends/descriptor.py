"""The store descriptor: the metadata entry that records a store's format, key type and bin count.

It is written when a store is created and checked whenever one is opened, so a directory is
never read as state of another pipeline shape.
"""

from __future__ import annotations

import msgpack

from megaphone.state_backends.stats import STATS_META

FORMAT_VERSION = 1
"""Version of the on-disk layout, stored in the ``megaphone.backend`` metadata entry."""

INFO_META = "megaphone.backend"
"""Metadata name of the store descriptor (format version, key_type, num_bins)."""

RESERVED_META = frozenset({INFO_META, STATS_META})
"""Metadata names managed by the backend itself; user writes to them are refused."""


def info_bytes(key_type: str, num_bins: int) -> bytes:
    """The ``megaphone.backend`` descriptor written when a store is created."""
    return msgpack.packb(
        {"format": FORMAT_VERSION, "key_type": key_type, "num_bins": int(num_bins)},
        use_bin_type=True,
    )


def check_info(raw: bytes, key_type: str, num_bins: int, where: str) -> None:
    """Refuse (``ValueError``) a store created for another format, key_type or num_bins."""
    try:
        info = msgpack.unpackb(raw, raw=False)
        found = (int(info["format"]), info["key_type"], int(info["num_bins"]))
    except Exception as exc:  # corrupt or foreign descriptor
        raise ValueError(f"{where}: unreadable megaphone.backend descriptor") from exc
    if found[0] != FORMAT_VERSION:
        raise ValueError(f"{where}: state format {found[0]} unsupported (need {FORMAT_VERSION})")
    if found[1:] != (key_type, int(num_bins)):
        raise ValueError(
            f"{where} holds state for key_type={found[1]!r}, num_bins={found[2]}; "
            f"refusing to open it as key_type={key_type!r}, num_bins={num_bins}"
        )
