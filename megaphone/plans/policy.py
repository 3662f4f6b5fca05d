"""Migration policies: at each epoch boundary, which of a plan's remaining moves start now.

A policy is any callable ``policy(view) -> moves`` (:data:`MigrationPolicy`). The operator
calls it before every epoch of an *adaptive* plan (one whose JSON names a ``policy``) with an
:class:`EpochView` -- the remaining moves, the bins' sizes and load, recent per-epoch metrics
and how late the epoch starts -- and applies the moves it returns at that epoch. Returning no
move lets the epoch run without migration.

The Megaphone strategies are policies too: :class:`AllAtOnce`, :class:`Fluid` and
:class:`Batched` ignore the metrics, so :func:`drive` can run them ahead of time into the
fixed steps of an ordinary plan (that is what :func:`megaphone.plans.schedule` does). The
deadline policy (:class:`megaphone.plans.deadline.DeadlinePolicy`) is the one that reads them.

Policies are named in plans as JSON (``{"name": "deadline", "target_latency_s": 2.0}``), so a
plan stays data; :func:`policy_from_spec` builds the callable from a registry of factories by
name, which modules add to with :func:`register_policy` (:mod:`.deadline` registers
``deadline``). A user's own callable is passed in process (``pipe.migrate(plan, policy=fn)``)
and is never stored.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, ClassVar

from megaphone.plans.matching import iter_rounds
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.records import EpochMetrics
from megaphone.routing.table import Move
from megaphone.snailtrail import EpochTrace


@dataclass(frozen=True)
class EpochView:
    """What a policy sees before epoch ``epoch``: the work left and how the pipeline runs.

    ``remaining``: moves not started yet, in plan order. ``bin_bytes`` / ``bin_records``:
    size (keys + values) and recent records per bin, where known. ``history``: the newest
    per-epoch metrics, oldest first, as :class:`~megaphone.records.EpochMetrics` records
    (``Pipeline.metrics()`` gives the same records as dicts; read ``m.duration_s``,
    ``m.per_worker[w].useful_s``); ``traces``: the same epochs' SnailTrail traces, where
    kept, which the built-in policies read their times from. ``lag_s``: how long
    after the end of its input the epoch starts (0 when unknown). ``idle_epochs``: epochs in a
    row the plan has started no move. ``parallelism``: tasks that can run at once.
    ``homes``: each worker's home host and ``host_slots``: the tasks each host runs at once
    (the last commit's, docs/placement.md; empty when unknown), so a policy can tell a move
    onto a busy host from one onto an idle host.
    """

    epoch: int
    remaining: tuple[Move, ...]
    bin_bytes: Mapping[int, int] = field(default_factory=dict)
    bin_records: Mapping[int, float] = field(default_factory=dict)
    history: tuple[EpochMetrics, ...] = ()
    lag_s: float = 0.0
    idle_epochs: int = 0
    parallelism: int = 1
    traces: tuple[EpochTrace, ...] = ()
    homes: Mapping[int, str] = field(default_factory=dict)
    host_slots: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepDecision:
    """What the deadline policy did before one epoch, and why (``DeadlinePolicy.decisions``).

    ``action``: ``warm-up`` (too few epochs measured), ``behind`` (no slack: nothing moves),
    ``probe`` (no transfer measured yet, or only of bins written ahead: the smallest bin
    alone), ``fit`` (moves that fit), ``wait`` (slack, but no remaining bin fits yet),
    ``oversized`` (a bin over the whole budget, moved after ``patience`` waits with the bins
    the slack holds) or ``stalled`` (behind for ``max_behind`` epochs in a row: the smallest
    bin alone), ``compaction`` (every remaining move goes to a worker whose store still owes
    more than ``max_compaction_debt`` bytes of compaction: nothing moves until it catches up)
    or ``prepare`` (before the probe, no bin written ahead yet where stores write them: up to
    ``ahead_wait`` epochs to write one).
    """

    epoch: int
    action: str
    bins: int
    bytes: int
    predicted_s: float
    budget_s: float
    note: str = ""
    calibration: float = 1.0


MigrationPolicy = Callable[[EpochView], Iterable[Move]]
"""A policy: given the view before an epoch, the moves (a subset of ``remaining``) to start."""


class AllAtOnce:
    """Start every remaining move at once: the fewest epochs, the largest spike."""

    spec: ClassVar[dict[str, Any]] = {"name": "all-at-once"}

    def __call__(self, view: EpochView) -> list[Move]:
        """All of ``view.remaining``."""
        return list(view.remaining)


class _Rounds:
    """Matching rounds of the remaining moves, computed one at a time and kept between calls.

    The rounds continue as long as the moves left are the ones this policy has not handed
    out yet (checked by count); otherwise they start again from what is left. ``heavier`` (a
    move's weight) makes each sender/receiver pair send its heaviest bins first
    (:func:`~megaphone.plans.matching.iter_rounds`); it is not part of the policy's spec.
    """

    def __init__(self, heavier: Callable[[Move], float] | None = None) -> None:
        self._heavier = heavier
        self._rounds: Iterator[list[Move]] | None = None
        self._left = -1
        self._round: list[Move] = []

    def _sync(self, view: EpochView) -> None:
        if self._rounds is None or len(view.remaining) != self._left:
            self._rounds = iter_rounds(view.remaining, self._heavier)
            self._left = len(view.remaining)
            self._round = []

    def _handed_out(self, moves: list[Move]) -> list[Move]:
        self._left -= len(moves)
        return moves


class Fluid(_Rounds):
    """Start one move per epoch, rotating over sender/receiver pairs (matching-round order)."""

    spec: ClassVar[dict[str, Any]] = {"name": "fluid"}

    def __call__(self, view: EpochView) -> list[Move]:
        """The next move of the current matching round (a new round once it is used up)."""
        self._sync(view)
        assert self._rounds is not None
        if not self._round:
            self._round = next(self._rounds, [])
        return self._handed_out([self._round.pop(0)] if self._round else [])


class Batched(_Rounds):
    """Start ``per_worker`` matching rounds per epoch: no worker sends or receives more bins
    (with ``heavier``, each sender/receiver pair's heaviest bins first)."""

    def __init__(self, per_worker: int = 1, heavier: Callable[[Move], float] | None = None
                 ) -> None:
        if isinstance(per_worker, bool) or not isinstance(per_worker, int) or per_worker < 1:
            raise PlanError(f"per_worker must be an integer >= 1, got {per_worker!r}")
        super().__init__(heavier)
        self.per_worker = per_worker
        self.spec: dict[str, Any] = {"name": "batched", "per_worker": per_worker}

    def __call__(self, view: EpochView) -> list[Move]:
        """The union of the next ``per_worker`` matchings of the remaining moves."""
        self._sync(view)
        assert self._rounds is not None
        rounds = islice(self._rounds, self.per_worker)
        return self._handed_out(sorted(m for r in rounds for m in r))


def drive(policy: MigrationPolicy, moves: Iterable[Move], max_idle: int = 1) -> list[list[Move]]:
    """Run ``policy`` with no metrics until every move started; return the steps it chose.

    This turns a policy that does not need metrics into the fixed steps of a plan. Raises
    :class:`PlanError` if it chooses a move that is not left, or no move ``max_idle`` times
    in a row (it would never finish without live metrics).
    """
    remaining = dict.fromkeys(sorted(Move(*m) for m in moves))  # ordered, O(1) removal
    steps: list[list[Move]] = []
    idle = 0
    epoch = 0
    while remaining:
        chosen = checked_choice(policy(EpochView(epoch, tuple(remaining), idle_epochs=idle)),
                                remaining)
        epoch += 1
        if not chosen:
            idle += 1
            if idle >= max_idle:
                raise PlanError(f"policy {policy_name(policy)} started no move with "
                                f"{len(remaining)} left and no live metrics to wait for")
            continue
        idle = 0
        steps.append(sorted(chosen))
        for m in chosen:
            del remaining[m]
    return steps


def checked_choice(chosen: Iterable[Move], remaining: Collection[Move]) -> list[Move]:
    """``chosen`` as a list of moves, or :class:`PlanError` if one is not in ``remaining``
    (a set or dict: membership is tested per move) or is chosen twice."""
    out: list[Move] = []
    seen: set[Move] = set()
    for m in chosen:
        move = Move(*m)
        if move not in remaining or move in seen:
            raise PlanError(f"policy chose bin {move.bin} ({move.src} -> {move.dst}), which is "
                            "not among the plan's remaining moves")
        seen.add(move)
        out.append(move)
    return out


def policy_name(policy: MigrationPolicy) -> str:
    """A short name for messages: the spec's name, else the callable's own name."""
    spec = getattr(policy, "spec", None)
    if isinstance(spec, dict) and "name" in spec:
        return str(spec["name"])
    return getattr(policy, "__name__", type(policy).__name__)


PolicyFactory = Callable[[Mapping[str, Any]], MigrationPolicy]
"""Builds a policy from a spec's parameters (the spec without ``name``); raises PlanError."""

_FACTORIES: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make ``{"name": name, ...}`` specs build their policy with ``factory(params)``."""
    _FACTORIES[name] = factory


def _no_params(name: str, make: Callable[[], MigrationPolicy]) -> PolicyFactory:
    def factory(params: Mapping[str, Any]) -> MigrationPolicy:
        if params:
            raise PlanError(f"policy {name!r} takes no parameters, got {sorted(params)}")
        return make()

    return factory


def _batched(params: Mapping[str, Any]) -> MigrationPolicy:
    unknown = set(params) - {"per_worker"}
    if unknown:
        raise PlanError(f"policy 'batched' has unknown fields {sorted(unknown)}")
    return Batched(params.get("per_worker", 1))


register_policy("all-at-once", _no_params("all-at-once", AllAtOnce))
register_policy("fluid", _no_params("fluid", Fluid))
register_policy("batched", _batched)
register_policy("custom", _no_params("custom", Fluid))  # an in-process callable, after a restart


def policy_from_spec(spec: Any) -> MigrationPolicy:
    """Build the policy a plan names; a malformed spec is a :class:`PlanError`.

    Names: ``all-at-once``, ``fluid``, ``batched`` (``per_worker``) and ``deadline`` (see
    :class:`~megaphone.plans.deadline.DeadlinePolicy` for its fields), and any name added with
    :func:`register_policy`. ``custom`` stands for a callable handed to ``migrate`` in
    process; after a restart it resumes as ``fluid``.
    """
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise PlanError(f"policy must be an object with a string 'name', got {spec!r}")
    factory = _FACTORIES.get(spec["name"])
    if factory is None:
        names = [n for n in _FACTORIES if n != "custom"]
        raise PlanError(f"unknown policy {spec['name']!r}; expected {', '.join(names)} or custom")
    return factory({k: v for k, v in spec.items() if k != "name"})


def plan_policy(plan: MigrationPlan) -> MigrationPolicy | None:
    """The policy an adaptive plan names, built (a :class:`PlanError` if its spec is bad);
    ``None`` for a fixed plan."""
    return policy_from_spec(plan.policy) if plan.adaptive else None


__all__ = [
    "AllAtOnce",
    "Batched",
    "EpochView",
    "Fluid",
    "MigrationPolicy",
    "PolicyFactory",
    "StepDecision",
    "checked_choice",
    "drive",
    "plan_policy",
    "policy_from_spec",
    "policy_name",
    "register_policy",
]
