"""Autoscaling a running pipeline with DS2: measure, decide, migrate, repeat.

Every policy interval the controller takes the epochs recorded since its last evaluation (the
*window*), leaves out the warm-up epochs that follow a rescale, and asks a decision rule for
the number of workers. :class:`DS2Controller`'s rule is DS2 (:mod:`megaphone.plans.ds2`): the
workers' true processing rate (records per second of useful time) against the source rate.
A decision to change the worker count must repeat for ``activation`` consecutive windows, a
scale-down by exactly one worker is ignored (it is within the noise of the measurement, and
acting on it invites oscillation), and nothing is submitted while a plan is in flight. Then the
controller plans the rescale with :func:`megaphone.plans.rescale` (``balance="load"`` by
default, so new owners get equal traffic) and submits it with ``pipe.migrate(plan)``: the
state moves live, by the chosen strategy, while the pipeline keeps processing.

Two adaptations of DS2 to micro-batches, both visible in every decision's numbers:

* **source rate.** Unless the user gives one, it is measured from the window: records over
  the *event-time* span the window's epochs cover, when the pipeline has an ``event_time``
  column (exact even when the pipeline is behind and epochs queue up), otherwise records over
  the window's wall time (exact when every micro-batch takes all input that arrived since the
  previous one, as Structured Streaming does; an underestimate when the harness queues
  fixed-size epochs behind a slow one).
* **epoch overhead.** An epoch takes longer than its workers' mean useful time: fixed costs
  outside any worker (job launch, shuffle, commit) and the wait for the slowest worker
  (``duration_s`` minus the mean ``useful_s``). Of each input interval, that fraction ``f`` is
  not available for processing, so with ``Policy.epoch_overhead`` DS2 is asked to sustain
  ``source_rate / (1 - f)``. Sized exactly, a pipeline keeps up but never drains a backlog;
  ``Policy.headroom`` provisions for ``(1 + headroom)`` times the rate (as the target
  utilization of Flink's DS2-based autoscaler does) so a backlog built while deciding drains.

Every evaluation produces a :class:`Decision` (kept in ``controller.decisions`` and logged on
the ``megaphone.autoscale`` logger, at INFO when a decision was taken and at DEBUG while a plan
runs or the window is empty) with the window, the rates, the current and target worker counts
and the action taken. ``step(now)`` evaluates once, deterministically (tests drive it);
``start()`` runs it every ``Policy.interval_s`` in a daemon thread.

>>> controller = pipe.autoscale(Policy(interval_s=10, activation=2))  # doctest: +SKIP
>>> controller.decisions[-1].action  # doctest: +SKIP
'hold'
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from megaphone.migrator.planning import pipeline_source, plan_from
from megaphone.plans.ds2 import optimal_workers, rates_from_metrics
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.strategies import FLUID, STRATEGIES
from megaphone.plans.targets import BALANCE_MODES

if TYPE_CHECKING:
    from megaphone.migrator.controller import MigrationHandle

log = logging.getLogger("megaphone.autoscale")

#: The largest share of an input interval the epoch-overhead correction assumes is lost. Past
#: it more workers cannot help (the epochs are too short for their fixed cost), so DS2 is not
#: asked to make up for more.
MAX_OVERHEAD = 0.5
#: Settled epochs (at the current configuration) the epoch-overhead share is the median of:
#: it is a property of the configuration, and one epoch's share is noisy (scheduling jitter,
#: a cold start, a GC pause), so one window's epochs alone make the decision flicker.
OVERHEAD_EPOCHS = 10
#: Decisions a controller keeps (the oldest are dropped): about a day at a 10 s interval.
MAX_DECISIONS = 10_000
#: Evaluations that took no decision (logged at DEBUG; the others at INFO).
_NO_DECISION = ("in-flight", "warmup", "no-data")

Metrics = Mapping[str, Any]
#: ``source_rate(window_epochs) -> records/s``: a user's measure of the input rate.
SourceRate = Callable[[Sequence[Metrics]], float]
#: ``planner(pipe, workers) -> MigrationPlan``: how a decision becomes a plan.
Planner = Callable[[Any, int], MigrationPlan]


@dataclass(frozen=True)
class Policy:
    """When and how the controller rescales.

    * ``interval_s``: seconds between evaluations (the policy interval);
    * ``warmup_epochs`` / ``warmup_s``: after the last epoch that moved state, this many epochs
      and seconds are left out of every window (rates right after a rescale are not steady);
    * ``activation``: consecutive windows that must reach the same new worker count before
      it is acted on (1 acts on the first);
    * ``min_workers`` / ``max_workers``: bounds of the target (``None``: the number of bins);
    * ``strategy``, ``gap``, ``per_worker``, ``balance``, ``target_latency``: passed to
      ``rescale`` for the plan (``strategy="deadline"`` needs ``target_latency``, seconds);
    * ``ignore_down_by_one``: do not act on a decision to remove exactly one worker;
    * ``epoch_overhead``: correct the source rate for the per-epoch fixed cost (see module);
    * ``headroom``: provision for ``(1 + headroom)`` times the source rate;
    * ``min_epochs``: fewer epochs (after warm-up) in a window give no decision.
    """

    interval_s: float = 10.0
    warmup_epochs: int = 2
    warmup_s: float = 0.0
    activation: int = 2
    min_workers: int = 1
    max_workers: int | None = None
    strategy: str = FLUID
    gap: int = 0
    per_worker: int = 1
    balance: str = "load"
    target_latency: float | None = None
    ignore_down_by_one: bool = True
    epoch_overhead: bool = True
    headroom: float = 0.0
    min_epochs: int = 1

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        for name in ("warmup_epochs", "gap"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("activation", "min_workers", "per_worker", "min_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_s < 0 or self.headroom < 0:
            raise ValueError("warmup_s and headroom must be >= 0")
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError(f"max_workers {self.max_workers} < min_workers {self.min_workers}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; expected one of {STRATEGIES}")
        if (self.strategy == "deadline") != (self.target_latency is not None):
            raise ValueError("target_latency is needed by, and only used by, strategy 'deadline'")
        if self.balance not in BALANCE_MODES:
            raise ValueError(f"unknown balance {self.balance!r}; expected one of "
                             f"{BALANCE_MODES}")


@dataclass(frozen=True)
class Window:
    """The epochs a decision is based on.

    ``epochs``: the metrics records counted (warm-up left out), oldest first; ``previous``: the
    record just before the first of them (its end marks where the window's input begins), if
    known; ``skipped``: warm-up epochs left out; ``seen_through``: the last epoch looked at;
    ``history``: up to :data:`OVERHEAD_EPOCHS` settled epochs since the last rescale, ending
    with the window's last (what the epoch overhead is measured over; the window if empty).
    """

    epochs: tuple[Metrics, ...]
    previous: Metrics | None = None
    skipped: int = 0
    seen_through: int = -1
    history: tuple[Metrics, ...] = ()

    @property
    def span(self) -> tuple[int, int] | None:
        """``(first, last)`` epoch counted, or ``None`` for an empty window."""
        return (int(self.epochs[0]["epoch"]), int(self.epochs[-1]["epoch"])) \
            if self.epochs else None


@dataclass(frozen=True)
class Proposal:
    """A decision rule's answer: the worker count it wants and the numbers behind it."""

    workers: int
    source_rate: float | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    """One evaluation of the policy: what was seen, what was decided and what was done.

    ``action`` is one of ``scale`` (a plan was submitted), ``hold`` (the target is the current
    count), ``pending`` (a new count, not yet held for ``activation`` windows),
    ``ignore-down-by-one``, ``in-flight`` (a plan is running; no decision), ``warmup`` (only
    warm-up epochs in the window), ``no-data``, ``nothing-to-move`` or ``error``. ``proposed``
    is the decision rule's raw answer, ``target`` after the policy's bounds.
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
        for name in ("per_instance_rate", "demand", "overhead", "latency_s"):
            if self.numbers.get(name) is not None:
                parts.append(f"{name} {self.numbers[name]}")
        if self.reason:
            parts.append(self.reason)
        return "; ".join(parts)


# -- windows and rates (pure) ---------------------------------------------------------------


def last_move_epoch(metrics: Sequence[Metrics]) -> int | None:
    """The last recorded epoch that moved state (``bins_moved > 0``), if any."""
    for m in reversed(metrics):
        if (m.get("bins_moved") or 0) > 0:
            return int(m["epoch"])
    return None


def _warm(m: Metrics, moved: Metrics | None, policy: Policy) -> bool:
    """True if epoch ``m`` is within the warm-up after the state-moving epoch ``moved``."""
    if moved is None:
        return False
    if int(m["epoch"]) <= int(moved["epoch"]) + policy.warmup_epochs:
        return True
    return float(m.get("started") or 0) < float(moved.get("finished") or 0) + policy.warmup_s


def _window(metrics: Sequence[Metrics], candidates: list[Metrics], policy: Policy,
            history_after: int = -1) -> Window:
    moved_epoch = last_move_epoch(metrics)
    moved = next((m for m in metrics if int(m["epoch"]) == moved_epoch), None)
    counted = [m for m in candidates if not _warm(m, moved, policy)]
    previous = None
    history: list[Metrics] = []
    if counted:
        first, last = int(counted[0]["epoch"]), int(counted[-1]["epoch"])
        previous = next((m for m in metrics if int(m["epoch"]) == first - 1), None)
        history = [m for m in metrics if history_after < int(m["epoch"]) <= last
                   and not _warm(m, moved, policy)][-OVERHEAD_EPOCHS:]
    seen = max((int(m["epoch"]) for m in candidates), default=-1)
    return Window(tuple(counted), previous, len(candidates) - len(counted), seen,
                  tuple(history))


def select_window(metrics: Sequence[Metrics], after_epoch: int, now: float,
                  policy: Policy, history_after: int = -1) -> Window:
    """The epochs after ``after_epoch`` that finished by ``now``, warm-up left out.

    The window's ``history`` starts after ``history_after`` (e.g. the epoch at which the
    controller started, so a cold start before it is not measured).
    """
    candidates = [m for m in metrics if int(m["epoch"]) > after_epoch
                  and float(m.get("finished") or 0) <= now]
    return _window(metrics, candidates, policy, history_after)


def last_window(metrics: Sequence[Metrics], policy: Policy) -> Window:
    """The epochs that finished in the last ``policy.interval_s`` of the record, warm-up out.

    What ``megaphone plan --ds2`` decides on: the most recent policy window of a recorded run.
    """
    if not metrics:
        return Window(())
    end = max(float(m.get("finished") or 0) for m in metrics)
    candidates = [m for m in metrics if float(m.get("finished") or 0) > end - policy.interval_s]
    return _window(metrics, candidates, policy)


def _event_end(m: Metrics) -> float | None:
    """The largest event time (seconds) an epoch's records carried, if recorded."""
    times = [wm.get("max_event_time") for wm in (m.get("per_worker") or {}).values()
             if isinstance(wm, Mapping) and wm.get("max_event_time") is not None]
    return max(times) / 1e6 if times else None


def input_span(window: Window) -> tuple[float, int, float, str]:
    """``(records, epochs, seconds, method)``: the input the window's epochs cover.

    With event times (``method="event-time"``) the seconds are the event-time span from the
    end of the epoch before the window to the end of its last epoch; otherwise
    (``"wall-time"``) the wall time between those epochs' completions. Without a previous
    epoch the window's first epoch serves as the start and its records are not counted; a
    lone epoch falls back to its own duration. Raises ``ValueError`` for an empty window.
    """
    epochs = list(window.epochs)
    if not epochs:
        raise ValueError("the window holds no epochs")
    start = window.previous
    if start is None and len(epochs) > 1:
        start, epochs = epochs[0], epochs[1:]
    records = float(sum(m.get("records_in") or 0 for m in epochs))
    if start is not None:
        ends = [_event_end(m) for m in (start, epochs[-1])]
        if None not in ends and ends[1] > ends[0]:  # type: ignore[operator]
            return records, len(epochs), ends[1] - ends[0], "event-time"  # type: ignore[operator]
        wall = float(epochs[-1]["finished"]) - float(start["finished"])
        if wall > 0:
            return records, len(epochs), wall, "wall-time"
    duration = sum(float(m.get("duration_s") or 0) for m in epochs)
    if duration <= 0:
        raise ValueError("the window's epochs have no duration to measure a rate over")
    return records, len(epochs), duration, "duration"


def epoch_overhead(window: Window, interval_s: float) -> float:
    """Share of an epoch's input interval its workers are not useful, on average.

    Per epoch the overhead is ``duration_s`` minus the mean ``useful_s`` of the workers that
    had useful time: fixed costs (job launch, shuffle, commit) plus waiting for the slowest
    worker. The result is the median over ``window.history`` (the window's epochs if that is
    empty) divided by ``interval_s``, the input time one epoch covers; the median, so one slow
    epoch does not move it. Capped at :data:`MAX_OVERHEAD`.
    """
    lost = []
    for m in window.history or window.epochs:
        useful = [float(wm.get("useful_s") or 0) for wm in (m.get("per_worker") or {}).values()
                  if isinstance(wm, Mapping) and (wm.get("useful_s") or 0) > 0]
        mean = sum(useful) / len(useful) if useful else 0.0
        lost.append(max(0.0, float(m.get("duration_s") or 0) - mean))
    if not lost or interval_s <= 0:
        return 0.0
    return min(MAX_OVERHEAD, statistics.median(lost) / interval_s)


def ds2_proposal(window: Window, policy: Policy,
                 source_rate: float | SourceRate | None = None) -> Proposal:
    """DS2's worker count for ``window``, with every number behind it.

    ``source_rate`` is a number, a callable given the window's epochs, or ``None`` to measure
    it (:func:`input_span`). Raises ``ValueError`` when the window cannot be measured.
    """
    rates = rates_from_metrics(window.epochs)
    records, n, seconds, method = input_span(window)
    if source_rate is None:
        rate = records / seconds
    else:
        rate = float(source_rate(window.epochs) if callable(source_rate) else source_rate)
        method = "given"
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"source rate must be a finite number >= 0, got {rate!r}")
    overhead = epoch_overhead(window, seconds / n) if policy.epoch_overhead else 0.0
    demand = rate * (1 + policy.headroom) / (1 - overhead)
    workers = optimal_workers(rates, demand)
    latencies = [m["latency_s"] for m in window.epochs if m.get("latency_s") is not None]
    numbers = {
        **rates.to_dict(),
        "source": method,
        "epochs_per_s": round(n / seconds, 4),
        "overhead": round(overhead, 4),
        "headroom": policy.headroom,
        "demand": round(demand, 3),
        "latency_s": round(latencies[-1], 3) if latencies else None,
    }
    reason = (f"ceil({demand:.1f} / {rates.per_instance_rate:.1f}) = {workers}: "
              f"{rates.instances} instance(s) at {rates.processing_rate:.1f} rec/s of useful "
              f"time; source {rate:.1f} rec/s ({method})"
              + (f", {overhead:.0%} epoch overhead" if overhead else "")
              + (f", {policy.headroom:.0%} headroom" if policy.headroom else ""))
    return Proposal(workers, rate, numbers, reason)


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


def decide_once(
    metrics: Sequence[Metrics],
    current: int,
    policy: Policy,
    *,
    source_rate: float | SourceRate | None = None,
    num_bins: int | None = None,
    in_flight: int = 0,
) -> Decision:
    """The decision DS2 would take now on the last window of ``metrics`` (a dry run).

    No activation period applies (there is one window) and nothing is submitted: ``action``
    ``scale`` means DS2 would rescale to ``target`` workers. ``megaphone plan --ds2`` prints it.
    """
    window = last_window(metrics, policy)
    now = max((float(m.get("finished") or 0) for m in metrics), default=0.0)
    base: dict[str, Any] = {"time": now, "current": current, "epochs": window.span,
                            "skipped": window.skipped}
    if in_flight:
        return Decision(action="in-flight", **base, reason=f"{in_flight} plan(s) in flight")
    if len(window.epochs) < policy.min_epochs:
        return Decision(action="warmup" if window.skipped else "no-data", **base,
                        reason=f"{len(window.epochs)} epoch(s) to decide on")
    try:
        proposal = ds2_proposal(window, policy, source_rate)
    except ValueError as exc:
        return Decision(action="error", **base, reason=str(exc))
    target = bounded(proposal.workers, policy, num_bins)
    kind = classify(target, current, policy)
    return Decision(action="scale" if kind == "change" else kind, **base, target=target,
                    proposed=proposal.workers, source_rate=proposal.source_rate,
                    numbers=proposal.numbers, reason=proposal.reason)


def explain(decision: Decision) -> str:
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
    if d.action == "ignore-down-by-one":
        lines.append("note        a scale-down by one worker is ignored (within measurement "
                     "noise)")
    elif d.reason and d.source_rate is None:
        lines.append(f"note        {d.reason}")
    return "\n".join(lines)


# -- the controller -------------------------------------------------------------------------


class Autoscaler:
    """The policy loop around a decision rule; subclasses implement :meth:`propose`.

    ``pipe`` is a :class:`~megaphone.Pipeline` (or anything with ``metrics()``, ``routing``,
    ``in_flight`` and ``migrate(plan)``); ``planner(pipe, workers)`` builds the plan (default:
    ``rescale`` with the policy's strategy and balance); ``clock`` gives the time when
    :meth:`step` is called without ``now``.
    """

    def __init__(
        self,
        pipe: Any,
        policy: Policy | None = None,
        *,
        planner: Planner | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pipe = pipe
        self.policy = policy or Policy()
        self.decisions: list[Decision] = []
        self.handles: list[MigrationHandle] = []
        self._planner = planner or self._rescale
        self._clock = clock
        self._seen = -1
        self._since = -1  # epochs up to this one predate the controller (see start())
        self._streak: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def propose(self, window: Window, current: int) -> Proposal:
        """The worker count the rule wants for ``window`` (raise ``ValueError`` if it can't)."""
        raise NotImplementedError

    # -- one evaluation --------------------------------------------------------------------

    def step(self, now: float | None = None) -> Decision:
        """Evaluate the policy once over the epochs since the last evaluation; may submit."""
        now = self._clock() if now is None else float(now)
        with self._lock:
            metrics = self.pipe.metrics()
            current = len(self.pipe.routing.workers())
            window = select_window(metrics, self._seen, now, self.policy, self._since)
            self._seen = max(self._seen, window.seen_through)
            base = {"time": now, "current": current, "epochs": window.span,
                    "skipped": window.skipped}
            in_flight = len(self.pipe.in_flight)
            if in_flight:
                return self._record(Decision(action="in-flight", **base,
                                             reason=f"{in_flight} plan(s) in flight"))
            if len(window.epochs) < self.policy.min_epochs:
                action = "warmup" if window.skipped else "no-data"
                return self._record(Decision(action=action, **base,
                                             reason=f"{len(window.epochs)} epoch(s) to decide on"))
            try:
                proposal = self.propose(window, current)
            except ValueError as exc:
                return self._record(Decision(action="error", **base, reason=str(exc)))
            num_bins = getattr(self.pipe.routing, "num_bins", None)
            target = bounded(proposal.workers, self.policy, num_bins)
            base.update(target=target, proposed=proposal.workers,
                        source_rate=proposal.source_rate, numbers=proposal.numbers)
            kind = classify(target, current, self.policy)
            if kind != "change":
                self._streak = []
                return self._record(Decision(action=kind, **base, reason=proposal.reason))
            self._streak = [*self._streak, target] if self._streak[-1:] == [target] else [target]
            if len(self._streak) < self.policy.activation:
                return self._record(Decision(
                    action="pending", **base, reason=f"{proposal.reason}; held "
                    f"{len(self._streak)}/{self.policy.activation} windows"))
            return self._record(self._submit(base, target, proposal.reason))

    def _submit(self, base: dict[str, Any], target: int, reason: str) -> Decision:
        """Plan ``target`` workers and submit it, between epochs (under the pipeline's lock)."""
        self._streak = []
        with getattr(self.pipe, "_lock", None) or contextlib.nullcontext():
            if self.pipe.in_flight:
                return Decision(action="in-flight", **base, reason="a plan was submitted "
                                "meanwhile")
            try:
                plan = self._planner(self.pipe, target)
                if not plan.steps:
                    return Decision(action="nothing-to-move", **base, reason=reason)
                handle = self.pipe.migrate(plan)
            except (PlanError, ValueError, RuntimeError) as exc:
                return Decision(action="error", **base, reason=f"planning failed: {exc}")
        self.handles.append(handle)
        meta = plan.meta or {}
        summary = {"steps": len(plan.steps), "strategy": plan.strategy,
                   **{k: meta[k] for k in ("bins_moved", "keys_moved", "bytes_moved")
                      if k in meta}}
        return Decision(action="scale", **base, reason=reason, plan=summary)

    def _rescale(self, pipe: Any, workers: int) -> MigrationPlan:
        p = self.policy
        return plan_from(pipeline_source(pipe), workers=workers, strategy=p.strategy, gap=p.gap,
                         balance=p.balance, per_worker=p.per_worker,
                         target_latency=p.target_latency)

    def _record(self, decision: Decision) -> Decision:
        self.decisions.append(decision)
        del self.decisions[:-MAX_DECISIONS]
        level = logging.DEBUG if decision.action in _NO_DECISION else logging.INFO
        log.log(level, "%s %s", type(self).__name__, decision.describe())
        return decision

    # -- the thread ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the policy thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Autoscaler:
        """Evaluate every ``policy.interval_s`` seconds in a daemon thread; returns ``self``."""
        if self.running:
            return self
        self._stop.clear()
        self._seen = max((int(m["epoch"]) for m in self.pipe.metrics()), default=-1)
        self._since = self._seen
        self._thread = threading.Thread(target=self._loop, name="megaphone-autoscale",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the thread (a plan already submitted keeps running)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.policy.interval_s):
            try:
                self.step()
            except Exception:  # keep the loop alive; the pipeline may be between states
                log.exception("%s: evaluation failed", type(self).__name__)


class DS2Controller(Autoscaler):
    """Autoscaling by DS2: workers = ceil(demand / true rate of one worker).

    ``source_rate`` overrides the measured input rate: a number or a callable given the
    window's epochs (e.g. the producer rate of the topic the stream reads).
    """

    def __init__(self, pipe: Any, policy: Policy | None = None, *,
                 source_rate: float | SourceRate | None = None,
                 planner: Planner | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(pipe, policy, planner=planner, clock=clock)
        self.source_rate = source_rate

    def propose(self, window: Window, current: int) -> Proposal:
        """DS2 over the window (see :func:`ds2_proposal`)."""
        return ds2_proposal(window, self.policy, self.source_rate)


__all__ = [
    "MAX_DECISIONS",
    "MAX_OVERHEAD",
    "OVERHEAD_EPOCHS",
    "Autoscaler",
    "DS2Controller",
    "Decision",
    "Policy",
    "Proposal",
    "SourceRate",
    "Window",
    "bounded",
    "classify",
    "decide_once",
    "ds2_proposal",
    "epoch_overhead",
    "explain",
    "input_span",
    "last_move_epoch",
    "last_window",
    "select_window",
]
