"""Migration strategies: order a set of moves into the steps of a :class:`MigrationPlan`.

The three strategies of the Megaphone paper (Hoffmann et al., PVLDB 2019, §4):

* ``all-at-once`` -- one step moves every bin: the fewest epochs, the largest latency spike;
* ``fluid`` -- one bin per step: the smallest spikes, the most epochs;
* ``batched`` -- each step is a maximum matching between sending and receiving workers, so no
  worker sends or receives more than one bin (``per_worker=k``: ``k`` bins) per step. The
  moves form a bipartite multigraph (senders x receivers); it is split into exactly ``Δ``
  matchings, ``Δ`` the largest number of bins one worker sends or receives, which no schedule
  with one bin per worker per step can beat; ``per_worker=k`` groups ``k`` of them per step.

Every strategy is deterministic and takes ``gap``: idle epochs between steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.routing.table import Move, RoutingTable

ALL_AT_ONCE = "all-at-once"
"""Strategy name: every move in one step."""
FLUID = "fluid"
"""Strategy name: one move per step."""
BATCHED = "batched"
"""Strategy name: each step a maximum matching of senders to receivers."""
STRATEGIES: tuple[str, ...] = (ALL_AT_ONCE, FLUID, BATCHED)
"""Every strategy name :func:`schedule` accepts."""


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


def matching_rounds(moves: Iterable[Move]) -> list[list[Move]]:
    """Split ``moves`` into ``Δ`` matchings: in each, a worker sends and receives at most one bin.

    ``Δ`` is the most bins any one worker sends or receives, the fewest rounds possible. Each
    round is a maximum matching that covers every worker of maximum remaining degree: the
    multigraph is padded to be ``Δ``-regular (dummy workers and edges), a perfect matching of
    that is found with Hopcroft–Karp, its real edges are kept and augmented to a maximum
    matching of the real graph. Pairs with several moves send their lowest bin first.
    """
    pending: dict[tuple[int, int], deque[Move]] = {}
    for m in sorted(Move(*m) for m in moves):
        pending.setdefault((m.src, m.dst), deque()).append(m)
    rounds: list[list[Move]] = []
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
        rounds.append(sorted(step))
    return rounds


def schedule(moves: Iterable[Move], strategy: str, per_worker: int = 1) -> list[list[Move]]:
    """Order ``moves`` into steps by ``strategy``; every move lands in exactly one step.

    ``all-at-once``: one step (sorted by bin). ``fluid``: one move per step, in the order of
    the batched rounds, so consecutive steps rotate over sender/receiver pairs and new workers
    start receiving early. ``batched``: ``ceil(Δ / per_worker)`` steps, each the union of
    ``per_worker`` consecutive matchings from :func:`matching_rounds`, so no worker sends or
    receives more than ``per_worker`` bins in one step.
    """
    if strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if isinstance(per_worker, bool) or not isinstance(per_worker, int) or per_worker < 1:
        raise PlanError(f"per_worker must be an integer >= 1, got {per_worker!r}")
    moves = sorted(Move(*m) for m in moves)
    if len({m.bin for m in moves}) != len(moves):
        raise PlanError("a bin may be moved only once per plan")
    if not moves:
        return []
    if strategy == ALL_AT_ONCE:
        return [moves]
    rounds = matching_rounds(moves)
    if strategy == FLUID:
        return [[m] for r in rounds for m in r]
    return [
        sorted(m for r in rounds[i : i + per_worker] for m in r)
        for i in range(0, len(rounds), per_worker)
    ]


def make_plan(
    table: RoutingTable,
    moves: Iterable[Move],
    strategy: str = FLUID,
    gap: int = 0,
    per_worker: int = 1,
) -> MigrationPlan:
    """A :class:`MigrationPlan` from ``table``'s newest version that performs ``moves``.

    Steps come from :func:`schedule`; step ``i`` takes effect ``i * (gap + 1)`` epochs after the
    plan starts. The plan is accepted by ``megaphone.migrate`` unchanged.
    """
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise PlanError(f"gap must be an integer >= 0 epochs, got {gap!r}")
    return MigrationPlan.from_moves(table, schedule(moves, strategy, per_worker), gap, strategy)


__all__ = [
    "ALL_AT_ONCE",
    "BATCHED",
    "FLUID",
    "STRATEGIES",
    "hopcroft_karp",
    "make_plan",
    "matching_rounds",
    "schedule",
]
