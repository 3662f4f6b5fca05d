"""Bipartite matchings of moves: the rounds in which no worker sends or receives twice.

Used by the ``batched`` and ``fluid`` policies (:mod:`megaphone.plans.policy`): a round is a
maximum matching between sending and receiving workers, and ``Δ`` rounds (``Δ`` the most bins
one worker sends or receives) cover every move, which no schedule of one bin per worker per
round can beat.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from megaphone.routing.table import Move


def hopcroft_karp(
    adj: Sequence[Sequence[int]], n_right: int, match_left: Sequence[int] | None = None
) -> list[int]:
    """A maximum matching of a bipartite graph (Hopcroft–Karp, ``O(E sqrt(V))``).

    ``adj[u]`` lists the right vertices adjacent to left vertex ``u``. Returns ``m`` with
    ``m[u]`` the right vertex matched to ``u`` or ``-1``. Starting from ``match_left`` (a valid
    matching), augmenting paths only ever add vertices to it, so every vertex it covers stays
    covered. Iterative, so large graphs do not hit Python's recursion limit.
    """
    n_left = len(adj)
    ml = [-1] * n_left if match_left is None else list(match_left)
    mr = [-1] * n_right
    for u, v in enumerate(ml):
        if v != -1:
            if mr[v] != -1:
                raise ValueError(f"initial matching uses right vertex {v} twice")
            mr[v] = u
    while True:
        dist = [-1] * n_left
        queue = [u for u in range(n_left) if ml[u] == -1]
        for u in queue:
            dist[u] = 0
        found = False
        head = 0
        while head < len(queue):
            u = queue[head]
            head += 1
            for v in adj[u]:
                w = mr[v]
                if w == -1:
                    found = True
                elif dist[w] == -1:
                    dist[w] = dist[u] + 1
                    queue.append(w)
        if not found:
            return ml
        nxt = [0] * n_left
        for root in range(n_left):
            if ml[root] != -1:
                continue
            stack = [root]
            while stack:
                u = stack[-1]
                if nxt[u] == len(adj[u]):
                    dist[u] = -2  # dead end for the rest of this phase
                    stack.pop()
                    continue
                v = adj[u][nxt[u]]
                nxt[u] += 1
                w = mr[v]
                if w == -1:
                    for x in stack:  # augment: each stacked vertex takes the edge it followed
                        y = adj[x][nxt[x] - 1]
                        ml[x] = y
                        mr[y] = x
                    break
                if dist[w] == dist[u] + 1:
                    stack.append(w)


def iter_rounds(moves: Iterable[Move],
                heavier: Callable[[Move], float] | None = None) -> Iterator[list[Move]]:
    """Yield ``moves`` as ``Δ`` matchings: in each, a worker sends and receives at most one bin.

    ``Δ`` is the most bins any one worker sends or receives, the fewest rounds possible. Each
    round is a maximum matching that covers every worker of maximum remaining degree: the
    multigraph is padded to be ``Δ``-regular (dummy workers and edges), a perfect matching of
    that is found with Hopcroft–Karp, its real edges are kept and augmented to a maximum
    matching of the real graph. Pairs with several moves send their lowest bin first, or with
    ``heavier`` (a move's weight, e.g. its records per epoch) their heaviest first; the pairs
    each round matches do not depend on it. Rounds are computed one at a time, so taking the
    first ``k`` costs ``k`` matchings, not ``Δ``.
    """
    pending: dict[tuple[int, int], deque[Move]] = {}
    ordered = sorted(Move(*m) for m in moves)
    if heavier is not None:
        ordered.sort(key=lambda m: -heavier(m))  # stable: ties stay in bin order
    for m in ordered:
        pending.setdefault((m.src, m.dst), deque()).append(m)
    while pending:
        senders = sorted({s for s, _ in pending})
        receivers = sorted({d for _, d in pending})
        si = {s: i for i, s in enumerate(senders)}
        ri = {d: i for i, d in enumerate(receivers)}
        deg_l = [0] * len(senders)
        deg_r = [0] * len(receivers)
        real: list[set[int]] = [set() for _ in senders]
        for (s, d), q in pending.items():
            deg_l[si[s]] += len(q)
            deg_r[ri[d]] += len(q)
            real[si[s]].add(ri[d])
        delta = max(max(deg_l), max(deg_r))
        n = max(len(senders), len(receivers))
        # Pad to a delta-regular bipartite multigraph: pair up left and right deficits.
        need_l = [delta - d for d in deg_l] + [delta] * (n - len(senders))
        need_r = [delta - d for d in deg_r] + [delta] * (n - len(receivers))
        full: list[set[int]] = [set(r) for r in real] + [set() for _ in range(n - len(senders))]
        j = 0
        for i in range(n):
            while need_l[i] > 0:
                while need_r[j] == 0:
                    j += 1
                take = min(need_l[i], need_r[j])
                full[i].add(j)
                need_l[i] -= take
                need_r[j] -= take
        perfect = hopcroft_karp([sorted(a) for a in full], n)
        start = [
            v if i < len(senders) and v in real[i] else -1
            for i, v in enumerate(perfect[: len(senders)])
        ]
        match = hopcroft_karp([sorted(a) for a in real], len(receivers), start)
        step = []
        for i, j in enumerate(match):
            if j == -1:
                continue
            key = (senders[i], receivers[j])
            step.append(pending[key].popleft())
            if not pending[key]:
                del pending[key]
        yield sorted(step)


def matching_rounds(moves: Iterable[Move]) -> list[list[Move]]:
    """Every round of :func:`iter_rounds`: ``Δ`` matchings that together hold every move."""
    return list(iter_rounds(moves))


__all__ = ["hopcroft_karp", "iter_rounds", "matching_rounds"]
