"""DS2 autoscaling arithmetic: the policy, the window of epochs a decision looks at, and the
worker count DS2 proposes for it (pure: metrics records in, numbers out).

The runtime's controller loop around it (``DS2Controller``, in the migrator package) takes the
epochs recorded since its last evaluation (the *window*), leaves out the warm-up epochs that
follow a rescale, and asks a decision rule for the number of workers; the decision itself is
:func:`megaphone.plans.scale_decision.decide`. Two adaptations of DS2 (:mod:`.ds2`) to
micro-batches, both visible in every decision's numbers:

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

Windows hold :class:`~megaphone.records.EpochMetrics` records (the runtime converts the stored
dicts once), so a user's ``source_rate`` callable is given records too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from megaphone.plans.ds2 import optimal_workers, rates_from_metrics
from megaphone.plans.strategies import FLUID, STRATEGIES
from megaphone.plans.targets import BALANCE_MODES
from megaphone.records import EpochMetrics
from megaphone.snailtrail import EpochTrace

#: The largest share of an input interval the epoch-overhead correction assumes is lost. Past
#: it more workers cannot help (the epochs are too short for their fixed cost), so DS2 is not
#: asked to make up for more.
MAX_OVERHEAD = 0.5
#: Settled epochs (at the current configuration) the epoch-overhead share is the median of:
#: it is a property of the configuration, and one epoch's share is noisy (scheduling jitter,
#: a cold start, a GC pause), so one window's epochs alone make the decision flicker.
OVERHEAD_EPOCHS = 10
#: ``source_rate(window_epochs) -> records/s``: a user's measure of the input rate.
SourceRate = Callable[[Sequence[EpochMetrics]], float]


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
    * ``min_epochs``: fewer epochs (after warm-up) in a window give no decision;
    * ``bound_by_slots``: keep the target within the task slots of the hosts known (never
      below the current count). Off by default: with Spark's dynamic allocation (or a cluster
      that grows on demand) executors are added when tasks queue, and an epoch's tasks queue
      only when there are more workers than slots, so a target beyond the known slots is how
      the pipeline asks for another host; bounded, it would never get one. Either way the
      decision says when the target exceeds the known slots (docs/placement.md).
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
    bound_by_slots: bool = False

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

    def plan_options(self) -> dict[str, Any]:
        """How a rescale plan is made for this policy: the planner's keyword arguments."""
        return {"strategy": self.strategy, "gap": self.gap, "balance": self.balance,
                "per_worker": self.per_worker, "target_latency": self.target_latency}


@dataclass(frozen=True)
class Window:
    """The epochs a decision is based on.

    ``epochs``: the metrics records counted (warm-up left out), oldest first; ``previous``: the
    record just before the first of them (its end marks where the window's input begins), if
    known; ``skipped``: warm-up epochs left out; ``seen_through``: the last epoch looked at;
    ``history``: up to :data:`OVERHEAD_EPOCHS` settled epochs since the last rescale, ending
    with the window's last (what the epoch overhead is measured over; the window if empty);
    ``traces``: SnailTrail traces of recent epochs, which DS2 reads useful times from.
    """

    epochs: tuple[EpochMetrics, ...]
    previous: EpochMetrics | None = None
    skipped: int = 0
    seen_through: int = -1
    history: tuple[EpochMetrics, ...] = ()
    traces: tuple[EpochTrace, ...] = ()

    @property
    def span(self) -> tuple[int, int] | None:
        """``(first, last)`` epoch counted, or ``None`` for an empty window."""
        return (self.epochs[0].epoch, self.epochs[-1].epoch) if self.epochs else None


@dataclass(frozen=True)
class Proposal:
    """A decision rule's answer: the worker count it wants and the numbers behind it."""

    workers: int
    source_rate: float | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


# -- windows and rates ----------------------------------------------------------------------


def last_move_epoch(metrics: Sequence[EpochMetrics]) -> int | None:
    """The last recorded epoch that moved state (``bins_moved > 0``), if any."""
    for m in reversed(metrics):
        if (m.bins_moved or 0) > 0:
            return m.epoch
    return None


def _warm(m: EpochMetrics, moved: EpochMetrics | None, policy: Policy) -> bool:
    """True if epoch ``m`` is within the warm-up after the state-moving epoch ``moved``."""
    if moved is None:
        return False
    if m.epoch <= moved.epoch + policy.warmup_epochs:
        return True
    return float(m.started or 0) < float(moved.finished or 0) + policy.warmup_s


def _window(metrics: Sequence[EpochMetrics], candidates: list[EpochMetrics], policy: Policy,
            history_after: int = -1) -> Window:
    moved_epoch = last_move_epoch(metrics)
    moved = next((m for m in metrics if m.epoch == moved_epoch), None)
    counted = [m for m in candidates if not _warm(m, moved, policy)]
    previous = None
    history: list[EpochMetrics] = []
    if counted:
        first, last = counted[0].epoch, counted[-1].epoch
        previous = next((m for m in metrics if m.epoch == first - 1), None)
        history = [m for m in metrics if history_after < m.epoch <= last
                   and not _warm(m, moved, policy)][-OVERHEAD_EPOCHS:]
    seen = max((m.epoch for m in candidates), default=-1)
    return Window(tuple(counted), previous, len(candidates) - len(counted), seen,
                  tuple(history))


def select_window(metrics: Sequence[EpochMetrics], after_epoch: int, now: float,
                  policy: Policy, history_after: int = -1) -> Window:
    """The epochs after ``after_epoch`` that finished by ``now``, warm-up left out.

    The window's ``history`` starts after ``history_after`` (e.g. the epoch at which the
    controller started, so a cold start before it is not measured).
    """
    candidates = [m for m in metrics if m.epoch > after_epoch and float(m.finished or 0) <= now]
    return _window(metrics, candidates, policy, history_after)


def last_window(metrics: Sequence[EpochMetrics], policy: Policy) -> Window:
    """The epochs that finished in the last ``policy.interval_s`` of the record, warm-up out.

    What ``megaphone plan --ds2`` decides on: the most recent policy window of a recorded run.
    """
    if not metrics:
        return Window(())
    end = max(float(m.finished or 0) for m in metrics)
    candidates = [m for m in metrics if float(m.finished or 0) > end - policy.interval_s]
    return _window(metrics, candidates, policy)


def _event_end(m: EpochMetrics) -> float | None:
    """The largest event time (seconds) an epoch's records carried, if recorded."""
    times = [wm.max_event_time for wm in m.per_worker.values() if wm.max_event_time is not None]
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
    records = float(sum(m.records_in or 0 for m in epochs))
    if start is not None:
        ends = [_event_end(m) for m in (start, epochs[-1])]
        if None not in ends and ends[1] > ends[0]:  # type: ignore[operator]
            return records, len(epochs), ends[1] - ends[0], "event-time"  # type: ignore[operator]
        wall = float(epochs[-1].finished) - float(start.finished)
        if wall > 0:
            return records, len(epochs), wall, "wall-time"
    duration = sum(float(m.duration_s or 0) for m in epochs)
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
        useful = [float(wm.useful_s or 0) for wm in m.per_worker.values() if (wm.useful_s or 0) > 0]
        mean = sum(useful) / len(useful) if useful else 0.0
        lost.append(max(0.0, float(m.duration_s or 0) - mean))
    if not lost or interval_s <= 0:
        return 0.0
    return min(MAX_OVERHEAD, statistics.median(lost) / interval_s)


def ds2_proposal(window: Window, policy: Policy,
                 source_rate: float | SourceRate | None = None) -> Proposal:
    """DS2's worker count for ``window``, with every number behind it.

    ``source_rate`` is a number, a callable given the window's epochs, or ``None`` to measure
    it (:func:`input_span`). Raises ``ValueError`` when the window cannot be measured.
    """
    rates = rates_from_metrics(window.epochs, window.traces)
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
    latencies = [m.latency_s for m in window.epochs if m.latency_s is not None]
    numbers = {
        **rates.to_dict(),
        "source": method,
        "epochs_per_s": round(n / seconds, 4),
        "overhead": round(overhead, 4),
        "traced_epochs": len({t.epoch for t in window.traces} & {m.epoch for m in window.epochs}),
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


__all__ = [
    "MAX_OVERHEAD",
    "OVERHEAD_EPOCHS",
    "Policy",
    "Proposal",
    "SourceRate",
    "Window",
    "ds2_proposal",
    "epoch_overhead",
    "input_span",
    "last_move_epoch",
    "last_window",
    "select_window",
]
