"""What the columnar operators' property tests share: the key-by-key run's state carried from
one epoch to the next (states, timers, the largest event time) and msgpack-packed states."""

from __future__ import annotations

from typing import Any

import msgpack

from megaphone.operators.process import KeyResults, watermark


def packed(states: list[Any]) -> list[bytes | None]:
    """The states as the store keeps them (msgpack bytes; ``None`` for no state)."""
    return [None if s is None else msgpack.packb(s) for s in states]


class Carried:
    """The state between epochs of a key-by-key run: per key its state and timers, and the
    largest event time so far (from which the next epoch's watermark comes)."""

    def __init__(self, lateness_us: int) -> None:
        self.lateness_us = lateness_us
        self.states: dict[Any, Any] = {}
        self.timers: dict[Any, set[int]] = {}
        self.high: int | None = None

    def watermark(self) -> int | None:
        """The next epoch's watermark."""
        return watermark(self.high, self.lateness_us)

    def due(self, wm: int | None) -> dict[Any, list[int]]:
        """Each key's timers due at watermark ``wm``, in time order."""
        return {k: sorted(t for t in ts if wm is not None and t <= wm)
                for k, ts in self.timers.items()}

    def advance(self, keys: list[Any], result: KeyResults, states: list[Any],
                times: list[int]) -> None:
        """Take an epoch's ``result`` for ``keys`` (its new ``states``, as kept here) and the
        event times of its records."""
        for key, state, fired, added in zip(keys, states, result.fired, result.set,
                                            strict=True):
            if state is None:
                self.states.pop(key, None)
            else:
                self.states[key] = state
            self.timers[key] = (self.timers.get(key, set()) - set(fired)) | added
        for t in times:
            self.high = t if self.high is None else max(self.high, t)
