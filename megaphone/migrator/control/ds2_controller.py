"""The autoscaling controller: measure, decide, migrate, repeat, in a thread beside the
pipeline.

Every policy interval the controller takes the epochs recorded since its last evaluation
(:func:`megaphone.plans.autoscale.select_window`) and decides with
:func:`megaphone.plans.scale_decision.decide`, the rule ``megaphone plan --ds2`` uses too
(its actions and the :class:`~megaphone.plans.autoscale.Policy` fields say when it scales).
A decision that holds for ``activation`` windows is planned (``balance="load"`` by default)
and submitted with ``pipe.migrate(plan)``: the state moves live. Every
:class:`~megaphone.plans.scale_decision.ScaleDecision` is kept in ``controller.decisions`` and
logged on the ``megaphone.autoscale`` logger.

>>> controller = pipe.autoscale(Policy(interval_s=10, activation=2))  # doctest: +SKIP
>>> controller.decisions[-1].action  # doctest: +SKIP
'hold'
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from megaphone.migrator.control.plan_inputs import pipeline_source
from megaphone.plans.autoscale import (
    Policy,
    Proposal,
    SourceRate,
    Window,
    ds2_proposal,
    select_window,
)
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.planner import plan_from
from megaphone.plans.scale_decision import ScaleDecision, decide

if TYPE_CHECKING:
    from megaphone.plans.handle import MigrationHandle

log = logging.getLogger("megaphone.autoscale")

#: Decisions a controller keeps (the oldest are dropped): about a day at a 10 s interval.
MAX_DECISIONS = 10_000
#: Evaluations that took no decision (logged at DEBUG; the others at INFO).
_NO_DECISION = ("in-flight", "warmup", "no-data")

#: ``planner(pipe, workers) -> MigrationPlan``: how a decision becomes a plan.
Planner = Callable[[Any, int], MigrationPlan]


class DS2Controller:
    """Autoscaling by DS2: workers = ceil(demand / true rate of one worker), in a policy loop.

    ``pipe`` is a :class:`~megaphone.Pipeline`; ``source_rate`` overrides the measured input
    rate: a number or a callable given the window's epochs as
    :class:`~megaphone.records.EpochMetrics` records (e.g. the producer rate of the topic the
    stream reads). ``planner(pipe, workers)`` builds the plan (default:
    :func:`~megaphone.plans.planner.plan_from` the pipeline's planning source, with the
    policy's strategy and balance); ``clock`` gives the time when :meth:`step` is called
    without ``now``. Another decision rule overrides :meth:`propose`.
    """

    def __init__(
        self,
        pipe: Any,
        policy: Policy | None = None,
        *,
        source_rate: float | SourceRate | None = None,
        planner: Planner | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pipe = pipe
        self.policy = policy or Policy()
        self.source_rate = source_rate
        self.decisions: list[ScaleDecision] = []
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
        """The worker count DS2 wants for ``window`` (:func:`ds2_proposal`; a ``ValueError``
        if it can't say)."""
        return ds2_proposal(window, self.policy, self.source_rate)

    # -- one evaluation --------------------------------------------------------------------

    def step(self, now: float | None = None) -> ScaleDecision:
        """Evaluate the policy once over the epochs since the last evaluation; may submit."""
        now = self._clock() if now is None else float(now)
        with self._lock:
            metrics = self.pipe.metric_records()
            current = len(self.pipe.routing.workers())
            window = replace(select_window(metrics, self._seen, now, self.policy, self._since),
                             traces=tuple(self.pipe.trace_records()))
            self._seen = max(self._seen, window.seen_through)
            decision = decide(window, current, self.policy, lambda w: self.propose(w, current),
                              now=now, in_flight=len(self.pipe.in_flight),
                              num_bins=getattr(self.pipe.routing, "num_bins", None),
                              hosts=self.pipe.host_slots() if hasattr(self.pipe, "host_slots")
                              else None)
            if decision.action in ("hold", "ignore-down-by-one"):
                self._streak = []
            if decision.action != "scale":
                return self._record(decision)
            target = decision.target
            self._streak = [*self._streak, target] if self._streak[-1:] == [target] else [target]
            if len(self._streak) < self.policy.activation:
                return self._record(replace(
                    decision, action="pending", reason=f"{decision.reason}; held "
                    f"{len(self._streak)}/{self.policy.activation} windows"))
            return self._record(self._submit(decision))

    def _submit(self, decision: ScaleDecision) -> ScaleDecision:
        """Plan ``decision.target`` workers and submit it, between epochs (under the
        pipeline's lock)."""
        self._streak = []
        with getattr(self.pipe, "_lock", None) or contextlib.nullcontext():
            if self.pipe.in_flight:
                return replace(decision, action="in-flight",
                               reason="a plan was submitted meanwhile")
            try:
                plan = self._planner(self.pipe, decision.target)
                if plan.empty:  # never submitted: it would be done at once
                    return replace(decision, action="nothing-to-move")
                handle = self.pipe.migrate(plan)
            except (PlanError, ValueError, RuntimeError) as exc:
                return replace(decision, action="error", reason=f"planning failed: {exc}")
        self.handles.append(handle)
        meta = plan.meta or {}
        summary = {"steps": len(plan.steps), "strategy": plan.strategy,
                   **{k: meta[k] for k in ("bins_moved", "keys_moved", "bytes_moved")
                      if k in meta}}
        return replace(decision, plan=summary)

    def _rescale(self, pipe: Any, workers: int) -> MigrationPlan:
        return plan_from(pipeline_source(pipe), workers=workers, **self.policy.plan_options())

    def _record(self, decision: ScaleDecision) -> ScaleDecision:
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

    def start(self) -> DS2Controller:
        """Evaluate every ``policy.interval_s`` seconds in a daemon thread; returns ``self``."""
        if self.running:
            return self
        self._stop.clear()
        self._seen = max((m.epoch for m in self.pipe.metric_records(last=1)), default=-1)
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


__all__ = ["MAX_DECISIONS", "DS2Controller", "Planner"]
