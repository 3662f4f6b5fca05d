"""Combinable user updates: the protocol that lets a hot key's records be split across workers.

A general update ``f(key, values, state) -> (state, outputs)`` may depend on the order of its
records, so a key's records must all be applied in one place (its owner): *sequential mode*.
A :class:`Combiner` instead says how its state is built from records -- ``fold`` a list of
values into a partial, ``combine`` two partials -- and how outputs are read from a state. When
``combine`` is commutative and associative and ``fold`` is a homomorphism
(``fold(k, xs + ys) == combine(fold(k, xs), fold(k, ys))``), the records of a hot key may be
folded in several places and the partials consolidated at the owner, with outputs and state
identical to applying them all at once: *dual mode* (docs/hot-keys.md).

Partials and states travel msgpack-encoded (a tuple arrives as a list). To keep split and
unsplit execution bit-identical, a combiner always sees a partial after that round trip, in
both modes (:meth:`Combiner.__call__`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import msgpack


def roundtrip(value: Any) -> Any:
    """``value`` as it comes back from msgpack (tuples become lists): what travels between
    workers, so both modes hand ``combine`` the same objects."""
    return msgpack.unpackb(msgpack.packb(value), strict_map_key=False)


class Combiner(ABC):
    """A keyed update whose state is a commutative, associative fold of its records.

    Subclass it and give it as a pipeline's ``update``; it is also an ordinary general update
    (``combiner(key, values, state) -> (state, outputs)``), so it runs unsplit unchanged. The
    contract, which splitting relies on (and the equivalence tests check for their combiners):

    - ``combine(a, b) == combine(b, a)`` and ``combine(a, combine(b, c)) ==
      combine(combine(a, b), c)``;
    - ``fold(key, xs + ys) == combine(fold(key, xs), fold(key, ys))`` for non-empty ``xs``,
      ``ys``;
    - ``outputs(key, state)`` depends only on its arguments.

    ``fold`` is where per-record work belongs: it is what runs in parallel for a hot key.
    States and partials must be msgpack-serializable (tuples arrive as lists).
    """

    @abstractmethod
    def fold(self, key: Any, values: list) -> Any:
        """The partial state of a non-empty list of ``key``'s values (the per-record work)."""

    @abstractmethod
    def combine(self, a: Any, b: Any) -> Any:
        """Two partial states (or a stored state and a partial) merged into one."""

    @abstractmethod
    def outputs(self, key: Any, state: Any) -> Iterable[Any]:
        """The outputs of ``key`` for an epoch that left it at ``state``."""

    def __call__(self, key: Any, values: list, state: Any) -> tuple[Any, list[Any]]:
        """Unsplit execution: fold the epoch's values, merge them into ``state``, emit."""
        new = self.merge(state, [roundtrip(self.fold(key, values))])
        return new, list(self.outputs(key, new))

    def merge(self, state: Any, partials: list[Any]) -> Any:
        """``state`` (``None`` for a new key) with ``partials`` (at least one) combined in:
        what the owner does with the partials of a hot key (and with the one partial of an
        unsplit key)."""
        merged = partials[0]
        for partial in partials[1:]:
            merged = self.combine(merged, partial)
        return merged if state is None else self.combine(state, merged)


__all__ = ["Combiner", "roundtrip"]
