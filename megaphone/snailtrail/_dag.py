"""A topological order of a small directed graph, shared by the trace's and the PAG's checks."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


def topological_order(n_vertices: int, edges: Iterable[tuple[int, int]]) -> list[int] | None:
    """Vertices ``0 .. n_vertices-1`` so that every edge ``(u, v)`` has ``u`` before ``v``, or
    None if the edges form a cycle.

    Kahn's algorithm, smallest ready vertex first (a deque fed in index order), so the order is
    deterministic. Parallel edges are allowed; a self-loop is a cycle.
    """
    successors: list[list[int]] = [[] for _ in range(n_vertices)]
    indegree = [0] * n_vertices
    for u, v in edges:
        successors[u].append(v)
        indegree[v] += 1
    ready = deque(v for v in range(n_vertices) if indegree[v] == 0)
    order: list[int] = []
    while ready:
        u = ready.popleft()
        order.append(u)
        for v in successors[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    return order if len(order) == n_vertices else None
