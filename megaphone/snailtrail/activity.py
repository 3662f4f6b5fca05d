"""Typed trace records for SnailTrail's critical-path analysis: timed activities, the
happens-before dependencies between them, and one epoch's trace of both.

A trace says what the driver and each worker were doing during an epoch (an
:class:`Activity` on a timeline, with a start and an end in seconds) and which activity had to
end before another could start (a :class:`Dependency`, e.g. the driver's job submission before
a worker's task, an export before the receiver's install). :mod:`~megaphone.snailtrail.graph`
turns traces into a program activity graph; :mod:`~megaphone.snailtrail.critical` ranks its
activities.

Times must come from one clock (or be corrected for skew before they are recorded): a
dependency whose target starts before its source ends is rejected, not repaired.

An :class:`EpochTrace` stores compactly as plain JSON-able data (one column per field, the
epoch once) and is rebuilt only through the same checks, so malformed input raises a
ValueError naming what is wrong. There is no pickle anywhere.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from megaphone.snailtrail._dag import topological_order

#: The kinds of recorded activity, and what each stands for.
ACTIVITY_KINDS: dict[str, str] = {
    "admit": "driver: admitting a migration plan into the epoch",
    "layout": "driver: computing the epoch's routing layout",
    "submit": "driver: submitting the epoch's job",
    "schedule": "scheduling delay: a task submitted but not yet running",
    "begin": "a worker opening its state for the epoch (restoring it when needed)",
    "export": "a worker exporting a moving bin's state",
    "wait": "waiting, recorded explicitly (for the shuffle, a barrier, a lock)",
    "install": "a worker installing a received bin's state",
    "apply": "a worker applying the epoch's updates",
    "flush": "flushing or compacting state",
    "output": "writing the epoch's output",
    "commit": "committing the epoch",
    "cleanup": "driver: removing what the epoch left obsolete (old outputs)",
    "other": "anything else",
}

#: The kinds of dependency; a dependency's edge in the graph is reported under its kind.
DEPENDENCY_KINDS: dict[str, str] = {
    "comm": "a message or control signal from one timeline to another",
    "schedule": "from a job's submission to a task's start (Spark's scheduling delay)",
    "shuffle": "data shuffled from a sender's activity to a receiver's",
}

#: The tag of the serialized form; a different tag is refused.
TRACE_FORMAT = "megaphone.snailtrail.trace/1"

#: A sequential thread of execution: ``(worker, lane)``, the driver's worker being None.
Timeline = tuple[int | None, int]

_ACTIVITY_COLUMNS = ("id", "kind", "worker", "lane", "start", "end", "bin")
_DEPENDENCY_COLUMNS = ("src", "dst", "kind")


def _check_int(name: str, value: Any, *, optional: bool = False) -> None:
    """Raise ValueError unless ``value`` is a non-negative int (or None when optional)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        expected = "a non-negative int" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _check_time(name: str, value: Any) -> float:
    """``value`` as a finite float; ValueError for anything else (bools and strings too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        raise ValueError(f"{name} is out of range: {value!r}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return seconds


@dataclass(frozen=True)
class Activity:
    """One timed activity on one timeline: ``kind`` (a key of :data:`ACTIVITY_KINDS`) done by
    ``worker`` (None: the driver) on ``lane`` from ``start`` to ``end`` (seconds, one clock).

    ``id`` identifies it within its epoch's trace (dependencies name it); ``bin`` is the bin it
    worked on, if one (an export or install of a moving bin); ``epoch`` is set by the
    :class:`EpochTrace` that holds it. A worker that runs activities at the same time (two task
    slots) puts them on different lanes: one lane's activities never overlap, since the graph
    reads a lane as a sequence.
    """

    id: int
    kind: str
    worker: int | None
    start: float
    end: float
    bin: int | None = None
    epoch: int | None = None
    lane: int = 0

    def __post_init__(self) -> None:
        _check_int("id", self.id)
        if not isinstance(self.kind, str) or self.kind not in ACTIVITY_KINDS:
            raise ValueError(f"kind must be one of {sorted(ACTIVITY_KINDS)}, got {self.kind!r}")
        _check_int("worker", self.worker, optional=True)
        _check_int("lane", self.lane)
        _check_int("bin", self.bin, optional=True)
        _check_int("epoch", self.epoch, optional=True)
        start = _check_time("start", self.start)
        end = _check_time("end", self.end)
        if end < start:
            raise ValueError(f"activity {self.id} ends ({end}) before it starts ({start})")
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)

    @property
    def duration(self) -> float:
        """Its length in seconds (its weight in the activity graph)."""
        return self.end - self.start

    @property
    def timeline(self) -> Timeline:
        """The sequential timeline it belongs to: ``(worker, lane)``."""
        return (self.worker, self.lane)

    def order_key(self) -> tuple[float, float, int, int]:
        """Its place on its timeline: by start, then end (an instant before an interval that
        starts with it), then epoch and id, so equal times still have one fixed order."""
        return (self.start, self.end, self.epoch or 0, self.id)


@dataclass(frozen=True)
class Dependency:
    """Happens-before: activity ``src`` must end before activity ``dst`` starts (both ids of
    the same epoch's trace). ``kind`` (a key of :data:`DEPENDENCY_KINDS`) names what crossed:
    the time from ``src``'s end to ``dst``'s start is reported under it."""

    src: int
    dst: int
    kind: str = "comm"

    def __post_init__(self) -> None:
        _check_int("src", self.src)
        _check_int("dst", self.dst)
        if not isinstance(self.kind, str) or self.kind not in DEPENDENCY_KINDS:
            raise ValueError(
                f"dependency kind must be one of {sorted(DEPENDENCY_KINDS)}, got {self.kind!r}")
        if self.src == self.dst:
            raise ValueError(f"activity {self.src} cannot depend on itself")


def _columns(name: str, data: Any, columns: tuple[str, ...]) -> dict[str, list[Any]]:
    """``data`` checked as a dict of exactly ``columns``, each a list, all of one length."""
    if not isinstance(data, dict):
        raise ValueError(f"{name} must be a dict of columns, got {type(data).__name__}")
    if set(data) != set(columns):
        missing = sorted(set(columns) - set(data))
        unknown = sorted(map(str, set(data) - set(columns)))
        raise ValueError(f"{name} columns: missing {missing}, unknown {unknown}")
    lengths = set()
    for column in columns:
        if not isinstance(data[column], list):
            raise ValueError(f"{name}.{column} must be a list, got {type(data[column]).__name__}")
        lengths.add(len(data[column]))
    if len(lengths) > 1:
        raise ValueError(f"{name} columns differ in length: "
                         f"{ {c: len(data[c]) for c in columns} }")
    return data


@dataclass(frozen=True)
class EpochTrace:
    """One epoch's activities and the dependencies among them, checked as a whole.

    Checked: ids unique; every dependency names two of the activities, once, and its target
    starts no earlier than its source ends; the activities of one timeline do not overlap
    (touching is fine); the dependencies and the timelines' order form no cycle (possible only
    among zero-length activities at one instant). Activities without an epoch get this one;
    another epoch is refused.
    """

    epoch: int
    activities: tuple[Activity, ...]
    dependencies: tuple[Dependency, ...] = ()

    def __post_init__(self) -> None:
        _check_int("epoch", self.epoch)
        object.__setattr__(self, "dependencies", tuple(self.dependencies))
        activities = []
        for a in self.activities:
            if not isinstance(a, Activity):
                raise ValueError(f"activities must be Activity records, got {a!r}")
            if a.epoch not in (None, self.epoch):
                raise ValueError(f"activity {a.id} is of epoch {a.epoch}, not {self.epoch}")
            activities.append(a if a.epoch == self.epoch else replace(a, epoch=self.epoch))
        for d in self.dependencies:
            if not isinstance(d, Dependency):
                raise ValueError(f"dependencies must be Dependency records, got {d!r}")
        object.__setattr__(self, "activities", tuple(activities))
        self._check()

    def _check(self) -> None:
        index: dict[int, int] = {}
        for i, a in enumerate(self.activities):
            if a.id in index:
                raise ValueError(f"epoch {self.epoch}: activity id {a.id} appears twice")
            index[a.id] = i
        edges: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        for d in self.dependencies:
            for end in (d.src, d.dst):
                if end not in index:
                    raise ValueError(f"epoch {self.epoch}: dependency {d.src} -> {d.dst} names "
                                     f"unknown activity {end}")
            if (d.src, d.dst) in seen:
                raise ValueError(f"epoch {self.epoch}: dependency {d.src} -> {d.dst} twice")
            seen.add((d.src, d.dst))
            src, dst = self.activities[index[d.src]], self.activities[index[d.dst]]
            if dst.start < src.end:
                raise ValueError(f"epoch {self.epoch}: activity {dst.id} starts at {dst.start}, "
                                 f"before activity {src.id} it depends on ends ({src.end})")
            edges.append((index[d.src], index[d.dst]))
        for timeline, acts in self.timelines().items():
            for before, after in pairwise(acts):
                if after.start < before.end:
                    raise ValueError(f"epoch {self.epoch}: activities {before.id} and {after.id} "
                                     f"overlap on timeline {timeline}")
                edges.append((index[before.id], index[after.id]))
        if topological_order(len(self.activities), edges) is None:
            raise ValueError(f"epoch {self.epoch}: the dependencies form a cycle")

    def timelines(self) -> dict[Timeline, list[Activity]]:
        """The activities by timeline, each list in timeline order (:meth:`Activity.order_key`)."""
        out: dict[Timeline, list[Activity]] = {}
        for a in sorted(self.activities, key=Activity.order_key):
            out.setdefault(a.timeline, []).append(a)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The trace as plain JSON-able data: the format tag, the epoch, and one list per field
        of the activities and of the dependencies (columns, so field names appear once)."""
        acts, deps = self.activities, self.dependencies
        return {
            "format": TRACE_FORMAT,
            "epoch": self.epoch,
            "activities": {column: [getattr(a, column) for a in acts]
                           for column in _ACTIVITY_COLUMNS},
            "dependencies": {column: [getattr(d, column) for d in deps]
                             for column in _DEPENDENCY_COLUMNS},
        }

    @classmethod
    def from_dict(cls, data: Any) -> EpochTrace:
        """The trace stored as ``data`` (from :meth:`to_dict`), through every check of the
        records; ValueError, naming the place, for anything malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"a trace must be a dict, got {type(data).__name__}")
        expected = {"format", "epoch", "activities", "dependencies"}
        if set(data) != expected:
            raise ValueError(f"trace keys must be {sorted(expected)}, got {sorted(map(str, data))}")
        if data["format"] != TRACE_FORMAT:
            raise ValueError(f"unknown trace format {data['format']!r} (this reads "
                             f"{TRACE_FORMAT!r})")
        epoch = data["epoch"]
        _check_int("epoch", epoch)
        acts = _columns("activities", data["activities"], _ACTIVITY_COLUMNS)
        deps = _columns("dependencies", data["dependencies"], _DEPENDENCY_COLUMNS)
        activities = []
        for i in range(len(acts["id"])):
            try:
                activities.append(Activity(epoch=epoch, **{c: acts[c][i] for c in acts}))
            except ValueError as e:
                raise ValueError(f"activities[{i}]: {e}") from None
        dependencies = []
        for i in range(len(deps["src"])):
            try:
                dependencies.append(Dependency(**{c: deps[c][i] for c in deps}))
            except ValueError as e:
                raise ValueError(f"dependencies[{i}]: {e}") from None
        return cls(epoch, tuple(activities), tuple(dependencies))

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON text (floats written exactly, no NaN)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> EpochTrace:
        """The trace written by :meth:`to_json`; ValueError for bad JSON or a bad trace."""
        return cls.from_dict(json.loads(text))


def epoch_traces(traces: Sequence[EpochTrace]) -> dict[int, EpochTrace]:
    """The traces by epoch; ValueError if an epoch appears twice (its ids would collide)."""
    out: dict[int, EpochTrace] = {}
    for trace in traces:
        if not isinstance(trace, EpochTrace):
            raise ValueError(f"expected EpochTrace records, got {trace!r}")
        if trace.epoch in out:
            raise ValueError(f"epoch {trace.epoch} is traced twice")
        out[trace.epoch] = trace
    return out
