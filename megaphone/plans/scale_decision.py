"""The autoscaling decision: DS2's proposal bounded, classified and explained -- one function
(:func:`decide`) shared by the controller loop and ``megaphone plan --ds2``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from megaphone.plans.autoscale import (
    Policy,
    Proposal,
    SourceRate,
    Window,
    ds2_proposal,
    last_window,
)
from megaphone.records import EpochMetrics
from megaphone.routing.placement import hosts_needed
from megaphone.snailtrail import EpochTrace


@dataclass(frozen=True)
class ScaleDecision:
    """One evaluation of the policy: what was seen, what was decided and what was done.

    ``action`` is one of ``scale`` (a plan was submitted), ``hold`` (the target is the current
    count), ``pending`` (a new count, not yet held for ``activation`` windows),
    ``ignore-down-by-one``, ``in-flight`` (a plan is running; no decision), ``warmup`` (only
    warm-up epochs in the window), ``no-data``, ``nothing-to-move`` or ``error``. ``proposed``
    is the decision rule's raw answer, ``target`` after the policy's bounds. With the hosts
    known, ``numbers`` also holds ``hosts_known``, ``slots_known`` (task slots of those hosts,
    ``None`` when unknown) and ``hosts_needed`` (:func:`capacity`).
    """

    time: float
    action: str
    current: int
    target: int | None = None
    proposed: int | None = None
    epochs: tuple[int, int] | None = None
    skipped: int = 0
    source_rate: float | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    plan: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The decision as plain JSON-serializable data."""
        return asdict(self)

    def describe(self) -> str:
        """One line with the action and the numbers behind it, as the logger prints it."""
        span = f"epochs {self.epochs[0]}..{self.epochs[1]}" if self.epochs else "no epochs"
        parts = [f"{self.action}: {self.current} -> {self.target} workers" if self.target
                 is not None else f"{self.action}: {self.current} workers", span]
        if self.skipped:
            parts.append(f"{self.skipped} warm-up epoch(s) left out")
        if self.source_rate is not None:
            parts.append(f"source {self.source_rate:.1f} rec/s")
        for name in ("per_instance_rate", "demand", "overhead", "latency_s", "hosts_needed"):
            if self.numbers.get(name) is not None:
                parts.append(f"{name} {self.numbers[name]}")
        if self.reason:
            parts.append(self.reason)
        return "; ".join(parts)


def bounded(workers: int, policy: Policy, num_bins: int | None = None) -> int:
    """``workers`` within the policy's bounds (and at most one worker per bin)."""
    high = policy.max_workers if policy.max_workers is not None else num_bins
    target = max(policy.min_workers, workers)
    return min(target, high) if high is not None else target


def classify(target: int, current: int, policy: Policy) -> str:
    """``hold``, ``ignore-down-by-one`` or ``change`` for a bounded target (no activation)."""
    if target == current:
        return "hold"
    if policy.ignore_down_by_one and target == current - 1:
        return "ignore-down-by-one"
    return "change"


def capacity(target: int, current: int, hosts: Mapping[str, int | None], policy: Policy
             ) -> tuple[int, dict[str, Any], str]:
    """The ``target`` against the ``hosts`` known (each with its task slots, ``None`` where
    unknown): the target (at most the known slots, but never below ``current``, with
    ``policy.bound_by_slots``), the numbers (``hosts_known``, ``slots_known``,
    ``hosts_needed``) and a note when the target exceeds the known slots or they are unknown.

    A worker is one task per epoch: workers beyond a host's slots share its cores, so adding
    them adds no capacity until a host joins."""
    known = [n for n in hosts.values() if n is not None]
    if not hosts or len(known) < len(hosts):
        return target, {"hosts_known": len(hosts), "slots_known": None,
                        "hosts_needed": None}, \
            f"task slots of the {len(hosts)} known host(s) unknown" if hosts else ""
    slots = sum(known)
    numbers = {"hosts_known": len(hosts), "slots_known": slots,
               "hosts_needed": hosts_needed(target, {h: n for h, n in hosts.items() if n})}
    if target <= slots:
        return target, numbers, ""
    note = (f"{target} workers exceed the {slots} task slots of the {len(hosts)} known "
            f"host(s): the new workers would share cores, adding no capacity until a host "
            f"joins ({numbers['hosts_needed']} hosts needed)")
    if policy.bound_by_slots:
        bound = max(current, slots)
        return bound, numbers, f"{note}; bounded to {bound}"
    return target, numbers, note


def decide(
    window: Window,
    current: int,
    policy: Policy,
    propose: Callable[[Window], Proposal],
    *,
    now: float,
    in_flight: int = 0,
    num_bins: int | None = None,
    hosts: Mapping[str, int | None] | None = None,
) -> ScaleDecision:
    """The decision on ``window`` at time ``now``: the one rule the controller and
    ``megaphone plan --ds2`` share.

    Nothing is decided while ``in_flight`` plans run or with fewer than ``policy.min_epochs``
    epochs; otherwise ``propose`` (e.g. :func:`ds2_proposal`) gives the worker count, which is
    bounded (:func:`bounded`), set against the ``hosts`` known and their task slots when given
    (:func:`capacity`: its note is in ``reason`` and ``numbers["capacity"]``) and classified
    (:func:`classify`). ``action`` ``scale`` means the count should change to ``target``; the
    controller applies its activation period on top.
    """
    base: dict[str, Any] = {"time": now, "current": current, "epochs": window.span,
                            "skipped": window.skipped}
    if in_flight:
        return ScaleDecision(action="in-flight", **base, reason=f"{in_flight} plan(s) in flight")
    if len(window.epochs) < policy.min_epochs:
        return ScaleDecision(action="warmup" if window.skipped else "no-data", **base,
                             reason=f"{len(window.epochs)} epoch(s) to decide on")
    try:
        proposal = propose(window)
    except ValueError as exc:
        return ScaleDecision(action="error", **base, reason=str(exc))
    target, numbers, note = bounded(proposal.workers, policy, num_bins), {}, ""
    if hosts is not None:
        target, numbers, note = capacity(target, current, hosts, policy)
        numbers["capacity"] = note
    kind = classify(target, current, policy)
    return ScaleDecision(action="scale" if kind == "change" else kind, **base, target=target,
                         proposed=proposal.workers, source_rate=proposal.source_rate,
                         numbers={**proposal.numbers, **numbers},
                         reason="; ".join(r for r in (proposal.reason, note) if r))


def decide_once(
    metrics: Sequence[EpochMetrics],
    current: int,
    policy: Policy,
    *,
    source_rate: float | SourceRate | None = None,
    num_bins: int | None = None,
    in_flight: int = 0,
    traces: Sequence[EpochTrace] = (),
    hosts: Mapping[str, int | None] | None = None,
) -> ScaleDecision:
    """The decision DS2 would take now on the last window of ``metrics`` (a dry run), with
    useful times from ``traces`` for the epochs they cover, against the ``hosts`` known.

    No activation period applies (there is one window) and nothing is submitted: ``action``
    ``scale`` means DS2 would rescale to ``target`` workers. ``megaphone plan --ds2`` prints it.
    """
    now = max((float(m.finished or 0) for m in metrics), default=0.0)
    window = replace(last_window(metrics, policy), traces=tuple(traces))
    return decide(window, current, policy,
                  lambda w: ds2_proposal(w, policy, source_rate), now=now, in_flight=in_flight,
                  num_bins=num_bins, hosts=hosts)


def explain(decision: ScaleDecision) -> str:
    """A multi-line account of a DS2 decision and the numbers behind it."""
    d, n = decision, decision.numbers
    head = f"{d.current} -> {d.target} workers" if d.target is not None else \
        f"{d.current} workers"
    lines = [f"decision    {d.action}: {head}"]
    if d.epochs:
        lines.append(f"window      epochs {d.epochs[0]}..{d.epochs[1]}"
                     + (f" ({d.skipped} warm-up epoch(s) after a rescale left out)"
                        if d.skipped else ""))
    elif d.skipped:
        lines.append(f"window      only warm-up epochs ({d.skipped}) after a rescale")
    if d.source_rate is not None and n:
        lines += [
            f"source      {d.source_rate:.1f} records/s ({n['source']})",
            f"workers     {n['instances']} instance(s) processed {n['records_in']:.0f} "
            f"records in {n['useful_s']:.2f} s of useful time: {n['processing_rate']:.1f} "
            f"records/s, {n['per_instance_rate']:.1f} per instance",
            f"demand      {n['demand']:.1f} records/s (source x (1 + {n['headroom']:g} "
            f"headroom) / (1 - {n['overhead']:.3f} epoch overhead))",
            f"DS2         ceil({n['demand']:.1f} / {n['per_instance_rate']:.1f}) = "
            f"{d.proposed} worker(s)" + (f", bounded to {d.target}" if d.proposed != d.target
                                         else ""),
        ]
        if n.get("latency_s") is not None:
            lines.append(f"latency     {n['latency_s']:.3f} s (last epoch of the window)")
    if n.get("hosts_known") == 0:
        lines.append("hosts       none known yet (no task has reported its host's store)")
    elif n.get("hosts_known") is not None:
        lines.append(f"hosts       {n['hosts_known']} known, task slots unknown (set "
                     "slots_per_host)" if n["slots_known"] is None else
                     f"hosts       {n['hosts_known']} known with {n['slots_known']} task "
                     f"slot(s); {d.target} workers need {n['hosts_needed']} host(s)")
    if d.action == "ignore-down-by-one":
        lines.append("note        a scale-down by one worker is ignored (within measurement "
                     "noise)")
    elif d.reason and d.source_rate is None:
        lines.append(f"note        {d.reason}")
    if n.get("capacity"):
        lines.append(f"capacity    {n['capacity']}")
    return "\n".join(lines)


__all__ = ["ScaleDecision", "bounded", "capacity", "classify", "decide", "decide_once",
           "explain"]
