"""Where a worker store keeps the epochs of the group it is in (docs/groups.md): each earlier
epoch's undo record and outputs in a metadata slot of its own, and a small index naming them.

Each slot is written once, in the atomic write that commits the next epoch, so a group's
commits cost the same at its last epoch as at its first; a new group overwrites old slots as
it fills them, and its index starts empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

#: The index: the group's first epoch and its kept epochs (:class:`GroupIndex`).
GROUP_META = "group"
#: Slot ``i``'s undo record is ``group.undo.<i>``, its outputs ``group.outputs.<i>``.
GROUP_UNDO_META = "group.undo"
GROUP_OUTPUTS_META = "group.outputs"


def undo_slot(slot: int) -> str:
    """The metadata name of slot ``slot``'s undo record."""
    return f"{GROUP_UNDO_META}.{slot}"


def outputs_slot(slot: int) -> str:
    """The metadata name of slot ``slot``'s outputs."""
    return f"{GROUP_OUTPUTS_META}.{slot}"


@dataclass(frozen=True)
class GroupIndex:
    """The group a store is in: its first epoch (``start``, ``None`` outside a group) and the
    group's ``epochs`` before the store's, whose undo records and outputs are kept in slots
    ``0..len(epochs) - 1``."""

    start: int | None
    epochs: list[int]

    @classmethod
    def unpack(cls, raw: bytes | None) -> GroupIndex | None:
        """The index stored as ``raw`` (an empty one for none); ``None`` if ``raw`` is not an
        index (an older format)."""
        if not raw:
            return cls(None, [])
        index = msgpack.unpackb(raw)
        if not isinstance(index, dict) or "epochs" not in index:
            return None
        return cls(index["start"], list(index["epochs"]))

    def packed(self) -> bytes:
        """The index as stored (:data:`GROUP_META`); empty bytes when no epoch is kept."""
        if not self.epochs:
            return b""
        return msgpack.packb({"start": self.start, "epochs": self.epochs})
