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
    """One key's named states and timers (milliseconds), decoded from its stored value.

    A state with a TTL keeps each value's, list element's and map entry's expiry (processing
    time in ms) beside it; given ``now_ms``, the entries that expired (Spark's rule: expired
    once the processing time is >= the expiry) are dropped as the state is decoded, so they
    are never read and the next write removes them.
    """

    __slots__ = ("list_exp", "lists", "map_exp", "maps", "timers", "value_exp", "values")

    def __init__(self, stored: Any = None, now_ms: int | None = None) -> None:
        stored = stored or {}
        self.values: dict[str, Fields] = {n: tuple(v) for n, v in stored.get("v", {}).items()}
        self.value_exp: dict[str, int] = dict(stored.get("ve", {}))
        self.lists: dict[str, list[Fields]] = {
            n: [tuple(v) for v in vs] for n, vs in stored.get("l", {}).items()}
        self.list_exp: dict[str, list[int | None]] = {
            n: stored.get("le", {}).get(n, [None] * len(vs)) for n, vs in self.lists.items()}
        self.maps: dict[str, dict[Fields, Fields]] = {
            n: {tuple(k): tuple(v) for k, v in pairs} for n, pairs in stored.get("m", {}).items()}
        self.map_exp: dict[str, dict[Fields, int]] = {
            n: {tuple(k): e for (k, _), e in zip(stored["m"][n], exps, strict=True)
                if e is not None}
            for n, exps in stored.get("me", {}).items()}
        self.timers: set[int] = set(stored.get("t", ()))
        if now_ms is not None:
            self._expire(now_ms)

    def _expire(self, now_ms: int) -> None:
        """Drop the entries whose expiry is at or before ``now_ms``."""
        for n, e in list(self.value_exp.items()):
            if now_ms >= e:
                del self.value_exp[n]
                self.values.pop(n, None)
        for n, exps in self.list_exp.items():
            kept = [i for i, e in enumerate(exps) if e is None or now_ms < e]
            if len(kept) < len(exps):
                self.lists[n] = [self.lists[n][i] for i in kept]
                self.list_exp[n] = [exps[i] for i in kept]
        for n, exps in self.map_exp.items():
            for k in [k for k, e in exps.items() if now_ms >= e]:
                del exps[k]
                self.maps[n].pop(k, None)

    def encode(self) -> dict[str, Any] | None:
        """The value to store (``None`` when the key holds nothing: its state is deleted)."""
        out: dict[str, Any] = {}
        if self.values:
            out["v"] = {n: list(v) for n, v in self.values.items()}
            exps = {n: e for n, e in self.value_exp.items() if n in self.values}
            if exps:
                out["ve"] = exps
        lists = {n: [list(v) for v in vs] for n, vs in self.lists.items() if vs}
        if lists:
            out["l"] = lists
            exps = {n: self.list_exp[n] for n in lists
                    if any(e is not None for e in self.list_exp.get(n, ()))}
            if exps:
                out["le"] = exps
        maps = {n: m for n, m in self.maps.items() if m}
        if maps:
            out["m"] = {n: [[list(k), list(v)] for k, v in m.items()] for n, m in maps.items()}
            exps = {n: [self.map_exp[n].get(k) for k in m] for n, m in maps.items()
                    if self.map_exp.get(n)}
            if exps:
                out["me"] = exps
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
        """Set the key's value (a tuple or Row), restarting its TTL."""
        ks = self._handle.key_state
        ks.values[self._name] = fields(newValue)
        expiry = self._handle.expiry(self._name)
        if expiry is None:
            ks.value_exp.pop(self._name, None)
        else:
            ks.value_exp[self._name] = expiry

    def clear(self) -> None:
        """Remove the key's value."""
        self._handle.key_state.values.pop(self._name, None)
        self._handle.key_state.value_exp.pop(self._name, None)


class ListState:
    """Spark's ``ListState`` on the current key (with a TTL, each element expires on its own,
    counted from when it was put or appended)."""

    def __init__(self, handle: Handle, name: str) -> None:
        self._handle, self._name = handle, name

    def exists(self) -> bool:
        """True when the key's list is not empty."""
        return bool(self._handle.key_state.lists.get(self._name))

    def get(self) -> Iterator[Fields]:
        """The key's list, in order."""
        return iter(list(self._handle.key_state.lists.get(self._name, [])))

    def put(self, newState: list[Iterable[Any]]) -> None:
        """Replace the key's list."""
        self.clear()
        self.appendList(newState)

    def appendValue(self, newState: Iterable[Any]) -> None:
        """Append one value."""
        self.appendList([newState])

    def appendList(self, newState: list[Iterable[Any]]) -> None:
        """Append several values."""
        ks = self._handle.key_state
        added = [fields(v) for v in newState]
        ks.lists.setdefault(self._name, []).extend(added)
        ks.list_exp.setdefault(self._name, []).extend(
            [self._handle.expiry(self._name)] * len(added))

    def clear(self) -> None:
        """Empty the key's list."""
        self._handle.key_state.lists.pop(self._name, None)
        self._handle.key_state.list_exp.pop(self._name, None)


class MapState:
    """Spark's ``MapState`` on the current key (user keys and values are tuples; with a TTL,
    each entry expires on its own, counted from its last update)."""

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
        """Set the value of user key ``key``, restarting its TTL."""
        k = fields(key)
        self._map()[k] = fields(value)
        exps = self._handle.key_state.map_exp.setdefault(self._name, {})
        expiry = self._handle.expiry(self._name)
        if expiry is None:
            exps.pop(k, None)
        else:
            exps[k] = expiry

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
        self._handle.key_state.map_exp.get(self._name, {}).pop(fields(key), None)

    def clear(self) -> None:
        """Empty the key's map."""
        self._handle.key_state.maps.pop(self._name, None)
        self._handle.key_state.map_exp.pop(self._name, None)


class Handle:
    """The ``StatefulProcessorHandle`` megaphone gives ``init``: state variables and timers of
    the key being processed (Spark's implicit key). ``probe``: the handle given at
    construction, which only checks what ``init`` asks for. ``now_ms``: the epoch's
    processing time, which TTLs count from (set per key by the operator)."""

    def __init__(self, time_mode: str, probe: bool = False) -> None:
        self._time_mode, self._probe = time_mode, probe
        self.key_state = KeyState()
        self.declared: dict[str, str] = {}
        self.ttl: dict[str, int] = {}
        self.now_ms: int | None = None

    def _declare(self, name: str, kind: str, ttl: int | None) -> None:
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0):
            raise ValueError(f"state {name!r}: ttlDurationMs must be a positive number of "
                             f"milliseconds, got {ttl!r} (as in Spark)")
        if self.declared.get(name, kind) != kind:
            raise ValueError(f"state {name!r} is declared twice, as {self.declared[name]} and "
                             f"{kind}")
        self.declared[name] = kind
        if ttl is None:
            self.ttl.pop(name, None)
        else:
            self.ttl[name] = ttl

    def expiry(self, name: str) -> int | None:
        """When a value of state ``name`` written now expires (ms): Spark's processing time
        plus the TTL; ``None`` without a TTL."""
        ttl = self.ttl.get(name)
        if ttl is None:
            return None
        if self.now_ms is None:
            raise ValueError(f"state {name!r} has a TTL but the epoch has no processing time")
        return self.now_ms + ttl

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
            raise ValueError("timers need time_mode 'EventTime' or 'ProcessingTime' (the "
                             "pipeline runs with time_mode 'None'), as in Spark")
        if self._probe:
            raise ValueError("timers may be used in handleInputRows and handleExpiredTimer, "
                             "not in init")

    def registerTimer(self, expiryTimestampMs: int) -> None:
        """Call ``handleExpiredTimer`` for this key once the watermark (``ProcessingTime``:
        the processing time) passes the time."""
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
        ks.value_exp.pop(stateName, None)
        ks.list_exp.pop(stateName, None)
        ks.map_exp.pop(stateName, None)
