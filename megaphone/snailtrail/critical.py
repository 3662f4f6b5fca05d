"""Critical participation (SnailTrail, NSDI 2018): how much each activity of a window's
program activity graph takes part in its critical path, without enumerating paths.

With ``N`` the number of paths from a source to a sink of the PAG and ``N_a`` the number of
those through activity ``a`` (an edge of weight ``w_a``)::

    CP(a) = N_a * w_a / (N * (t_e - t_s))

``N_a`` is the number of paths into ``a``'s start vertex times the number out of its end
vertex: one forward and one backward count over a topological order. Every path of the PAG
spans the window exactly (see :mod:`~megaphone.snailtrail.graph`), so ``sum(N_a * w_a)`` is
``N * (t_e - t_s)`` and the participations of all activities sum to 1: CP is the expected
share of the window that ``a`` takes on a path drawn uniformly from all of them. Counts are
Python ints (they grow exponentially with the graph); only the ratio becomes a float.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from megaphone.snailtrail._dag import topological_order
from megaphone.snailtrail.activity import EpochTrace
from megaphone.snailtrail.graph import COMM, GAP, LINK, RECORDED, Pag, PagEdge, build_pag

_K = TypeVar("_K", bound=Hashable)


@dataclass(frozen=True)
class PathCounts:
    """Path counts of a DAG: ``forward[v]`` paths from a source to ``v``, ``backward[v]``
    paths from ``v`` to a sink, ``total`` paths from a source to a sink.

    A path is a sequence of edges (parallel edges give different paths); a vertex that is a
    source and a sink is also a path of no edge.
    """

    forward: tuple[int, ...]
    backward: tuple[int, ...]
    total: int

    def through(self, src: int, dst: int) -> int:
        """How many source-to-sink paths take one given edge from ``src`` to ``dst``."""
        return self.forward[src] * self.backward[dst]


def count_paths(n_vertices: int, edges: Sequence[tuple[int, int]], sources: Iterable[int],
                sinks: Iterable[int]) -> PathCounts:
    """Count paths by dynamic programming over a topological order (never enumerating them):
    ``forward[v] = [v is a source] + sum(forward[u] for u -> v)``, and backward likewise from
    the sinks. ValueError if the edges form a cycle."""
    order = topological_order(n_vertices, edges)
    if order is None:
        raise ValueError("the graph has a cycle: paths cannot be counted")
    into: list[list[int]] = [[] for _ in range(n_vertices)]
    out_of: list[list[int]] = [[] for _ in range(n_vertices)]
    for u, v in edges:
        out_of[u].append(v)
        into[v].append(u)
    is_source, is_sink = set(sources), set(sinks)
    forward = [0] * n_vertices
    for v in order:
        forward[v] = (v in is_source) + sum(forward[u] for u in into[v])
    backward = [0] * n_vertices
    for v in reversed(order):
        backward[v] = (v in is_sink) + sum(backward[w] for w in out_of[v])
    total = sum(forward[v] for v in is_sink)
    return PathCounts(tuple(forward), tuple(backward), total)


@dataclass(frozen=True)
class Participation:
    """One activity's part: its PAG ``edge``, the ``paths`` (``N_a``) through it and its
    critical participation ``cp``."""

    edge: PagEdge
    paths: int
    cp: float


@dataclass(frozen=True)
class CriticalReport:
    """Critical participation of every activity of the window ``[t_s, t_e]``: recorded
    activities, waits found in gaps and communication edges (links, of no length, are left
    out). ``paths`` is ``N``; 0 when the window held no activity, and then there is no item.

    The summaries add CP up by a key and list the keys by falling CP, so the first is the
    biggest bottleneck of its kind.
    """

    t_s: float
    t_e: float
    paths: int
    items: tuple[Participation, ...]

    def total(self) -> float:
        """The sum of every item's CP: 1 up to rounding (0 for an empty window)."""
        return sum(item.cp for item in self.items)

    def top(self, n: int = 10) -> list[Participation]:
        """The ``n`` items of highest CP, highest first."""
        return sorted(self.items, key=lambda item: -item.cp)[:n]

    def summarize(self, key: Callable[[PagEdge], _K | None]) -> dict[_K, float]:
        """CP summed by ``key(edge)``, skipping items whose key is None; by falling CP."""
        sums: dict[_K, float] = {}
        for item in self.items:
            k = key(item.edge)
            if k is not None:
                sums[k] = sums.get(k, 0.0) + item.cp
        return dict(sorted(sums.items(), key=lambda kv: -kv[1]))

    def by_kind(self) -> dict[str, float]:
        """CP by activity kind (waits and dependency kinds included): which kind of work
        holds the window back. Sums to 1."""
        return self.summarize(lambda e: e.kind)

    def by_worker(self, exclude_kinds: Collection[str] = ()) -> dict[int | None, float]:
        """CP by worker (None: the driver) of what ran on its timelines, communication left
        out; ``exclude_kinds=("wait",)`` keeps only work, to spot stragglers."""
        def key(edge: PagEdge) -> tuple[int | None] | None:
            if edge.role not in (RECORDED, GAP) or edge.kind in exclude_kinds:
                return None
            return (edge.worker,)

        return {k[0]: cp for k, cp in self.summarize(key).items()}

    def by_bin(self) -> dict[int, float]:
        """CP by bin, of the activities (and communication) that name one: which moved bin
        costs the most."""
        return self.summarize(lambda e: e.bin)

    def by_channel(self) -> dict[tuple[int | None, int | None], float]:
        """CP of communication edges by ``(sending worker, receiving worker)``."""
        return self.summarize(
            lambda e: (e.sender[0], e.worker) if e.role == COMM and e.sender else None)


def critical_participation(pag: Pag) -> CriticalReport:
    """The critical participation of every edge of ``pag`` but its links."""
    counts = count_paths(pag.n_vertices, [(e.src, e.dst) for e in pag.edges], pag.sources,
                         pag.sinks)
    span = pag.t_e - pag.t_s
    items = []
    for edge in pag.edges:
        if edge.role == LINK:
            continue
        n_a = counts.through(edge.src, edge.dst)
        items.append(Participation(edge, n_a, (n_a / counts.total) * edge.weight / span))
    return CriticalReport(pag.t_s, pag.t_e, counts.total, tuple(items))


def analyze(traces: Iterable[EpochTrace], t_s: float, t_e: float) -> CriticalReport:
    """Build the window's PAG from ``traces`` and rank its activities: the one-call entry."""
    return critical_participation(build_pag(traces, t_s, t_e))
