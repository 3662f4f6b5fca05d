"""The handle a Spark ``StatefulProcessor`` gets from megaphone (:class:`Handle`): Spark's value,
list and map states and timers of the key being processed, held in one :class:`KeyState` that
:class:`~megaphone.operators.stateful_processor.TransformWithState` stores as the key's
msgpack value. State values are tuples, as Spark's clients return them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql.types import StructType

#: A state value (or a map state's user key): a tuple of fields, as Spark's state clients give.
Fields = tuple[Any, ...]


def fields(value: Iterable[Any]) -> Fields:
    """A state value as stored: a tuple of plain Python values (numpy scalars unwrapped)."""
    return tuple(v.item() if hasattr(v, "item") and not isinstance(v, (bytes, str)) else v
                 for v in value)


class KeyState:
    """One key's named states and timers (milliseconds), decoded from its stored value."""

    __slots__ = ("lists", "maps", "timers", "values")

    def __init__(self, stored: Any = None) -> None:
        stored = stored or {}
        self.values: dict[str, Fields] = {n: tuple(v) for n, v in stored.get("v", {}).items()}
        self.lists: dict[str, list[Fields]] = {
            n: [tuple(v) for v in vs] for n, vs in stored.get("l", {}).items()}
        self.maps: dict[str, dict[Fields, Fields]] = {
            n: {tuple(k): tuple(v) for k, v in pairs} for n, pairs in stored.get("m", {}).items()}
        self.timers: set[int] = set(stored.get("t", ()))

    def encode(self) -> dict[str, Any] | None:
        """The value to store (``None`` when the key holds nothing: its state is deleted)."""
        out: dict[str, Any] = {}
        if self.values:
            out["v"] = {n: list(v) for n, v in self.values.items()}
        lists = {n: [list(v) for v in vs] for n, vs in self.lists.items() if vs}
        if lists:
            out["l"] = lists
        maps = {n: [[list(k), list(v)] for k, v in m.items()] for n, m in self.maps.items() if m}
        if maps:
            out["m"] = maps
        if self.timers:
            out["t"] = sorted(self.timers)
        return out or None


class ValueState:
    """Spark's ``ValueState`` on the current key: ``exists``, ``get``, ``update``, ``clear``."""

    def __init__(self, handle: Handle, name: str) -> None:
        self._handle, self._name = handle, name

    def exists(self) -> bool:
        """True when the key holds a value."""
        return self._name in self._handle.key_state.values

    def get(self) -> Fields | None:
        """The key's value (a tuple), or ``None``."""
        return self._handle.key_state.values.get(self._name)

    def update(self, newValue: Iterable[Any]) -> None:
        """Set the key's value (a tuple or Row)."""
        self._handle.key_state.values[self._name] = fields(newValue)

    def clear(self) -> None:
        """Remove the key's value."""
        self._handle.key_state.values.pop(self._name, None)


class ListState:
    """Spark's ``ListState`` on the current key."""

    def __init__(self, handle: Handle, name: str) -> None:
        self._handle, self._name = handle, name

    def _list(self) -> list[Fields]:
        return self._handle.key_state.lists.setdefault(self._name, [])

    def exists(self) -> bool:
        """True when the key's list is not empty."""
        return bool(self._handle.key_state.lists.get(self._name))

    def get(self) -> Iterator[Fields]:
        """The key's list, in order."""
        return iter(list(self._handle.key_state.lists.get(self._name, [])))

    def put(self, newState: list[Iterable[Any]]) -> None:
        """Replace the key's list."""
        self._handle.key_state.lists[self._name] = [fields(v) for v in newState]

    def appendValue(self, newState: Iterable[Any]) -> None:
        """Append one value."""
        self._list().append(fields(newState))

    def appendList(self, newState: list[Iterable[Any]]) -> None:
        """Append several values."""
        self._list().extend(fields(v) for v in newState)

    def clear(self) -> None:
        """Empty the key's list."""
        self._handle.key_state.lists.pop(self._name, None)


class MapState:
    """Spark's ``MapState`` on the current key (user keys and values are tuples)."""

    def __init__(self, handle: Handle, name: str) -> None:
        self._handle, self._name = handle, name

    def _map(self) -> dict[Fields, Fields]:
        return self._handle.key_state.maps.setdefault(self._name, {})

    def exists(self) -> bool:
        """True when the key's map is not empty."""
        return bool(self._handle.key_state.maps.get(self._name))

    def getValue(self, key: Iterable[Any]) -> Fields | None:
        """The value of user key ``key``, or ``None``."""
        return self._map().get(fields(key))

    def containsKey(self, key: Iterable[Any]) -> bool:
        """True when user key ``key`` is in the map."""
        return fields(key) in self._map()

    def updateValue(self, key: Iterable[Any], value: Iterable[Any]) -> None:
        """Set the value of user key ``key``."""
        self._map()[fields(key)] = fields(value)

    def iterator(self) -> Iterator[tuple[Fields, Fields]]:
        """The map's ``(key, value)`` pairs."""
        return iter(list(self._map().items()))

    def keys(self) -> Iterator[Fields]:
        """The map's user keys."""
        return iter(list(self._map()))

    def values(self) -> Iterator[Fields]:
        """The map's values."""
        return iter(list(self._map().values()))

    def removeKey(self, key: Iterable[Any]) -> None:
        """Remove user key ``key``."""
        self._map().pop(fields(key), None)

    def clear(self) -> None:
        """Empty the key's map."""
        self._handle.key_state.maps.pop(self._name, None)


class Handle:
    """The ``StatefulProcessorHandle`` megaphone gives ``init``: state variables and timers of
    the key being processed (Spark's implicit key). ``probe``: the handle given at
    construction, which only checks what ``init`` asks for."""

    def __init__(self, time_mode: str, probe: bool = False) -> None:
        self._time_mode, self._probe = time_mode, probe
        self.key_state = KeyState()
        self.declared: dict[str, str] = {}

    def _declare(self, name: str, kind: str, ttl: int | None) -> None:
        if ttl is not None:
            raise ValueError(f"state {name!r} asks for ttlDurationMs={ttl}: megaphone has no "
                             "processing time fixed per epoch yet, so state TTL is not "
                             "supported (drop the TTL, or expire with event-time timers)")
        if self.declared.get(name, kind) != kind:
            raise ValueError(f"state {name!r} is declared twice, as {self.declared[name]} and "
                             f"{kind}")
        self.declared[name] = kind

    def getValueState(self, stateName: str, schema: StructType | str,
                      ttlDurationMs: int | None = None) -> ValueState:
        """The value state ``stateName`` (``schema`` is not needed: values are tuples)."""
        self._declare(stateName, "value", ttlDurationMs)
        return ValueState(self, stateName)

    def getListState(self, stateName: str, schema: StructType | str,
                     ttlDurationMs: int | None = None) -> ListState:
        """The list state ``stateName``."""
        self._declare(stateName, "list", ttlDurationMs)
        return ListState(self, stateName)

    def getMapState(self, stateName: str, userKeySchema: StructType | str,
                    valueSchema: StructType | str,
                    ttlDurationMs: int | None = None) -> MapState:
        """The map state ``stateName``."""
        self._declare(stateName, "map", ttlDurationMs)
        return MapState(self, stateName)

    def _check_timers(self) -> None:
        if self._time_mode == "None":
            raise ValueError("timers need time_mode 'EventTime' (the pipeline runs with "
                             "time_mode 'None'), as in Spark")
        if self._probe:
            raise ValueError("timers may be used in handleInputRows and handleExpiredTimer, "
                             "not in init")

    def registerTimer(self, expiryTimestampMs: int) -> None:
        """Call ``handleExpiredTimer`` for this key once the watermark passes the time."""
        self._check_timers()
        self.key_state.timers.add(int(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        """Delete this key's timer at the time (if set)."""
        self._check_timers()
        self.key_state.timers.discard(int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:
        """This key's timers, ascending."""
        self._check_timers()
        return iter(sorted(self.key_state.timers))

    def deleteIfExists(self, stateName: str) -> None:
        """Remove state ``stateName`` of the current key."""
        ks = self.key_state
        ks.values.pop(stateName, None)
        ks.lists.pop(stateName, None)
        ks.maps.pop(stateName, None)
