"""Migration strategies: order a set of moves into the steps of a :class:`MigrationPlan`.

The three strategies of the Megaphone paper (Hoffmann et al., PVLDB 2019, §4) are policies of
:mod:`megaphone.plans.policy` that need no metrics, run ahead of time into fixed steps:

* ``all-at-once`` -- one step moves every bin: the fewest epochs, the largest latency spike;
* ``fluid`` -- one bin per step: the smallest spikes, the most epochs;
* ``batched`` -- each step is a maximum matching between sending and receiving workers, so no
  worker sends or receives more than one bin (``per_worker=k``: ``k`` bins) per step. The
  moves form a bipartite multigraph (senders x receivers); it is split into exactly ``Δ``
  matchings, ``Δ`` the largest number of bins one worker sends or receives, which no schedule
  with one bin per worker per step can beat; ``per_worker=k`` groups ``k`` of them per step.

Every fixed strategy is deterministic and takes ``gap``: idle epochs between steps.

``deadline`` (Cameo-style, :mod:`megaphone.plans.deadline`) cannot be fixed ahead of time: it
makes an *adaptive* plan that names the policy, and the operator asks it before every epoch
how much fits under the latency target.

Which step goes first is the plan's *order* (:mod:`megaphone.plans.relief`): ``relief`` (the
default when the per-bin load is known) puts first the steps that most lower the largest
worker load; ``bins`` keeps each strategy's own order by bin. Step sizes are the strategy's
either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from megaphone.plans.matching import hopcroft_karp, matching_rounds
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.policy import Batched, MigrationPolicy, drive, policy_from_spec
from megaphone.plans.relief import RELIEF, check_order, max_loads, order_steps
from megaphone.routing.table import Move, RoutingTable

ALL_AT_ONCE = "all-at-once"
"""Strategy name: every move in one step."""
FLUID = "fluid"
"""Strategy name: one move per step."""
BATCHED = "batched"
"""Strategy name: each step a maximum matching of senders to receivers."""
DEADLINE = "deadline"
"""Strategy name: as much per epoch as the latency target leaves room for (adaptive)."""
FIXED_STRATEGIES: tuple[str, ...] = (ALL_AT_ONCE, FLUID, BATCHED)
"""Strategy names :func:`schedule` accepts: fixed ahead of time."""
STRATEGIES: tuple[str, ...] = (*FIXED_STRATEGIES, DEADLINE)
"""Every strategy name :func:`make_plan` accepts."""


def strategy_policy(strategy: str, per_worker: int = 1) -> MigrationPolicy:
    """The policy of a fixed strategy (``per_worker`` is for ``batched``)."""
    if strategy not in FIXED_STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}; expected one of "
                        f"{', '.join(FIXED_STRATEGIES)}")
    return policy_from_spec({"name": strategy,
                             **({"per_worker": per_worker} if strategy == BATCHED else {})})


def _each_bin_once(moves: Iterable[Move]) -> list[Move]:
    """``moves`` sorted, or :class:`PlanError` if one bin is moved twice."""
    out = sorted(Move(*m) for m in moves)
    if len({m.bin for m in out}) != len(out):
        raise PlanError("a bin may be moved only once per plan")
    return out


def schedule(moves: Iterable[Move], strategy: str, per_worker: int = 1) -> list[list[Move]]:
    """Order ``moves`` into steps by ``strategy``; every move lands in exactly one step.

    ``all-at-once``: one step (sorted by bin). ``fluid``: one move per step, in the order of
    the batched rounds, so consecutive steps rotate over sender/receiver pairs and new workers
    start receiving early. ``batched``: ``ceil(Δ / per_worker)`` steps, each the union of
    ``per_worker`` consecutive matchings from :func:`matching_rounds`, so no worker sends or
    receives more than ``per_worker`` bins in one step. Each is its policy
    (:func:`strategy_policy`) driven ahead of time.
    """
    if isinstance(per_worker, bool) or not isinstance(per_worker, int) or per_worker < 1:
        raise PlanError(f"per_worker must be an integer >= 1, got {per_worker!r}")
    policy = strategy_policy(strategy, per_worker)
    return drive(policy, _each_bin_once(moves))


def make_plan(
    table: RoutingTable,
    moves: Iterable[Move],
    strategy: str = FLUID,
    gap: int = 0,
    per_worker: int = 1,
    target_latency: float | None = None,
    order: str | None = None,
    load: np.ndarray | None = None,
    **deadline: Any,
) -> MigrationPlan:
    """A :class:`MigrationPlan` from ``table``'s newest version that performs ``moves``.

    Fixed strategies: steps come from :func:`schedule`; step ``i`` takes effect
    ``i * (gap + 1)`` epochs after the plan starts. ``deadline`` (needs ``target_latency``
    in seconds; ``deadline`` keywords such as ``margin`` or ``priority`` go to
    :class:`~megaphone.plans.deadline.DeadlinePolicy`): an adaptive plan holding every move
    in one step, which the operator starts bin by bin as the target allows (offline it runs
    as all at once). The plan is accepted by ``megaphone.migrate`` unchanged.

    ``order`` (``relief`` or ``bins``, default relief when ``load`` is given) decides which
    steps go first from ``load``, records per epoch of every bin (:mod:`.relief`); ``batched``
    in relief order may also send a sender/receiver pair's heaviest bins in its first
    matchings (its policy with each pair's heaviest bins first: the same pairs per step, so
    the same step sizes; relief keeps whichever order has the lower largest load); a deadline
    plan lists its moves in that order and, in relief order, tries them by relief per second
    of transfer (``priority="relief"`` unless given). ``plan.meta`` records ``order`` (and
    ``order_reason`` when relief had no load to work with).
    """
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise PlanError(f"gap must be an integer >= 0 epochs, got {gap!r}")
    check_order(order)
    owners = np.asarray(table.owners(), dtype=np.int64)
    if strategy == DEADLINE:
        if target_latency is None:
            raise PlanError("strategy 'deadline' needs a target latency (seconds)")
        ordered = order_steps([[m] for m in _each_bin_once(moves)], owners, load, order)
        if ordered.order == RELIEF:
            deadline.setdefault("priority", RELIEF)
        spec = {"name": DEADLINE, "target_latency_s": target_latency, **deadline}
        policy_from_spec(spec)  # check the parameters now
        listed = [m for step in ordered.steps for m in step]
        plan = MigrationPlan.from_moves(table, [listed] if listed else [], 0, DEADLINE)
        plan = dataclasses.replace(plan, policy=spec)
    elif target_latency is not None or deadline:
        raise PlanError(f"target_latency and deadline options are for strategy 'deadline', "
                        f"not {strategy!r}")
    else:
        ordered = order_steps(schedule(moves, strategy, per_worker), owners, load, order)
        if strategy == BATCHED and ordered.order == RELIEF and load is not None:
            heaviest_first = Batched(per_worker, lambda m: float(load[m.bin]))
            heavy = order_steps(drive(heaviest_first, _each_bin_once(moves)), owners, load, order)
            ordered = min(ordered, heavy, key=lambda o: max_loads(o.steps, owners, load))
        plan = MigrationPlan.from_moves(table, ordered.steps, gap, strategy)
    reason = {"order_reason": ordered.reason} if ordered.reason else {}
    return dataclasses.replace(plan, meta={"order": ordered.order, **reason})


__all__ = [
    "ALL_AT_ONCE",
    "BATCHED",
    "DEADLINE",
    "FIXED_STRATEGIES",
    "FLUID",
    "STRATEGIES",
    "hopcroft_karp",
    "make_plan",
    "matching_rounds",
    "schedule",
    "strategy_policy",
]
