"""The program activity graph (PAG) of a time window, built from epoch traces as SnailTrail
does: vertices are instants on timelines, edges are activities.

Construction, for the window ``[t_s, t_e]``:

* Every activity is clipped to the window; one with no time inside it is left out (a
  zero-length activity is kept if its instant lies in the window).
* Every timeline ``(worker, lane)`` with an activity left runs from a *source* vertex at
  ``t_s`` to a *sink* vertex at ``t_e``: each activity is an edge from a start vertex to an end
  vertex of its own, and consecutive vertices are joined by a ``"wait"`` edge when time passes
  between them (role :data:`GAP`: waiting is an activity too, though nobody recorded it) or by
  a zero-length :data:`LINK` edge when none does. Separate start and end vertices keep program
  order: a message received when an activity starts cannot travel back to one that ended at
  the same instant.
* A dependency between activities on different timelines becomes a communication edge (role
  :data:`COMM`) from the source's end vertex to the target's start vertex, weighted by its own
  duration, the time from one to the other, and reported under the dependency's kind. A
  dependency within one timeline adds nothing (program order already holds it); one whose
  source or target lies outside the window is left out (the receiver's wait covers it).

So every edge's weight is its end time minus its start time, and every path from a source to a
sink, sums to exactly ``t_e - t_s``; the critical participations of all edges then sum to 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import pairwise

from megaphone.snailtrail.activity import Activity, EpochTrace, Timeline, epoch_traces

#: Edge roles: a recorded activity, a wait found in a gap, a communication edge, a zero link.
RECORDED, GAP, COMM, LINK = "recorded", "gap", "comm", "link"


@dataclass(frozen=True)
class PagEdge:
    """An edge of the PAG: ``kind`` done from ``start`` to ``end`` (clipped to the window),
    leading from vertex ``src`` to vertex ``dst``.

    ``role`` is :data:`RECORDED` (``activity`` is its id in ``epoch``), :data:`GAP` (an
    unrecorded wait, kind ``"wait"``), :data:`COMM` (a dependency: ``sender`` is the source's
    timeline, ``worker``/``lane`` the receiver's, ``activity`` the target's id) or :data:`LINK`
    (zero length, structure only, never reported). ``bin`` is the recorded activity's bin, and
    a communication edge's when its two ends share one.
    """

    src: int
    dst: int
    kind: str
    role: str
    start: float
    end: float
    worker: int | None
    lane: int = 0
    sender: Timeline | None = None
    bin: int | None = None
    epoch: int | None = None
    activity: int | None = None

    @property
    def weight(self) -> float:
        """Its duration in seconds, ``end - start`` (never negative)."""
        return self.end - self.start


@dataclass(frozen=True)
class Pag:
    """The program activity graph of the window ``[t_s, t_e]``.

    Vertex ``v`` is the instant ``times[v]``; ``sources`` (at ``t_s``) and ``sinks`` (at
    ``t_e``) hold one vertex per timeline in ``timelines``, in that order (the driver first).
    A path of interest runs from any source to any sink.
    """

    t_s: float
    t_e: float
    times: tuple[float, ...]
    edges: tuple[PagEdge, ...]
    sources: tuple[int, ...]
    sinks: tuple[int, ...]
    timelines: tuple[Timeline, ...]

    @property
    def n_vertices(self) -> int:
        """How many vertices the graph has (``0 .. n_vertices-1``)."""
        return len(self.times)


def check_window(t_s: float, t_e: float) -> tuple[float, float]:
    """The window as floats; ValueError unless both are finite numbers and ``t_s < t_e``."""
    for name, value in (("t_s", t_s), ("t_e", t_e)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if not t_s < t_e:
        raise ValueError(f"the window must have t_s < t_e, got [{t_s}, {t_e}]")
    return float(t_s), float(t_e)


def clip(activity: Activity, t_s: float, t_e: float) -> Activity | None:
    """``activity`` cut to ``[t_s, t_e]``, or None if no time of it lies inside (an interval
    that only touches the window is outside; an instant on its boundary is inside)."""
    if activity.start == activity.end:
        return activity if t_s <= activity.start <= t_e else None
    if activity.end <= t_s or activity.start >= t_e:
        return None
    if t_s <= activity.start and activity.end <= t_e:
        return activity
    return replace(activity, start=max(activity.start, t_s), end=min(activity.end, t_e))


def trace_span(traces: Iterable[EpochTrace]) -> tuple[float, float]:
    """The earliest start and latest end of the traces' activities: the window that holds all
    of them. ValueError if there are none."""
    activities = [a for trace in traces for a in trace.activities]
    if not activities:
        raise ValueError("the traces hold no activity")
    return min(a.start for a in activities), max(a.end for a in activities)


def _timeline_key(timeline: Timeline) -> tuple[int, int, int]:
    worker, lane = timeline
    return (0 if worker is None else 1, worker or 0, lane)


class _Builder:
    """Vertices and edges as they are added."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.edges: list[PagEdge] = []

    def vertex(self, t: float) -> int:
        self.times.append(t)
        return len(self.times) - 1

    def join(self, u: int, v: int, timeline: Timeline) -> None:
        """Program order from ``u`` to the later ``v``: a gap wait, or a link if no time."""
        start, end = self.times[u], self.times[v]
        role, kind = (GAP, "wait") if end > start else (LINK, LINK)
        self.edges.append(PagEdge(u, v, kind, role, start, end, timeline[0], timeline[1]))


def build_pag(traces: Iterable[EpochTrace], t_s: float, t_e: float) -> Pag:
    """The PAG of the window ``[t_s, t_e]`` over ``traces`` (several epochs, each once).

    ValueError for a bad window, an epoch given twice, or activities of different epochs that
    overlap on one timeline. A window with no activity gives a graph with no timeline.
    """
    t_s, t_e = check_window(t_s, t_e)
    by_epoch = epoch_traces(list(traces))
    lanes: dict[Timeline, list[Activity]] = {}
    kept: dict[tuple[int, int], Activity] = {}
    for epoch, trace in by_epoch.items():
        for activity in trace.activities:
            clipped = clip(activity, t_s, t_e)
            if clipped is not None:
                kept[(epoch, activity.id)] = clipped
                lanes.setdefault(clipped.timeline, []).append(clipped)
    graph = _Builder()
    starts: dict[tuple[int, int], int] = {}
    ends: dict[tuple[int, int], int] = {}
    sources, sinks = [], []
    timelines = sorted(lanes, key=_timeline_key)
    for timeline in timelines:
        acts = sorted(lanes[timeline], key=Activity.order_key)
        previous = graph.vertex(t_s)
        sources.append(previous)
        for before, after in pairwise(acts):
            if after.start < before.end:
                raise ValueError(f"activities {before.id} (epoch {before.epoch}) and {after.id} "
                                 f"(epoch {after.epoch}) overlap on timeline {timeline}")
        for a in acts:
            key = (a.epoch or 0, a.id)
            starts[key] = start = graph.vertex(a.start)
            graph.join(previous, start, timeline)
            ends[key] = previous = graph.vertex(a.end)
            graph.edges.append(PagEdge(start, previous, a.kind, RECORDED, a.start, a.end,
                                       a.worker, a.lane, bin=a.bin, epoch=a.epoch,
                                       activity=a.id))
        sinks.append(graph.vertex(t_e))
        graph.join(previous, sinks[-1], timeline)
    for epoch, trace in by_epoch.items():
        for d in trace.dependencies:
            src, dst = kept.get((epoch, d.src)), kept.get((epoch, d.dst))
            if src is None or dst is None or src.timeline == dst.timeline:
                continue
            shared_bin = src.bin if src.bin == dst.bin else None
            graph.edges.append(PagEdge(ends[(epoch, d.src)], starts[(epoch, d.dst)], d.kind,
                                       COMM, src.end, dst.start, dst.worker, dst.lane,
                                       sender=src.timeline, bin=shared_bin, epoch=epoch,
                                       activity=dst.id))
    return Pag(t_s, t_e, tuple(graph.times), tuple(graph.edges), tuple(sources), tuple(sinks),
               tuple(timelines))
