"""The handle users follow a submitted plan with (:class:`MigrationHandle`) and its
:class:`Progress`; the plan queue (:mod:`megaphone.plans.plan_queue`) and offline migration
count its steps."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.policy import MigrationPolicy, policy_from_spec


@dataclass
class Progress:
    """How far a plan has got: steps and bins done, bytes moved, and the epochs used."""

    steps_done: int = 0
    steps_total: int = 0
    bins_done: int = 0
    bins_total: int = 0
    bytes_moved: int = 0
    epochs: list[int] = field(default_factory=list)


class MigrationHandle:
    """Follow a submitted plan: ``done``, ``progress`` and ``wait(timeout)``.

    ``policy`` is the policy choosing an adaptive plan's steps (None for a fixed plan); the
    deadline policy explains each epoch's choice in ``handle.policy.decisions``. The handle of
    an empty plan (one that moves no bin) is done from the start, at 0 of 0 steps and bins.
    """

    def __init__(self, plan: MigrationPlan, policy: MigrationPolicy | None = None) -> None:
        self.plan = plan
        self.policy = policy
        self._progress = Progress(
            # an adaptive plan's steps are counted as its policy starts them
            steps_total=0 if plan.empty or policy is not None else len(plan.steps),
            bins_total=sum(len(s.moves) for s in plan.steps),
        )
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        if plan.empty:
            self._done.set()

    @classmethod
    def adaptive(cls, plan: MigrationPlan, policy: MigrationPolicy | None = None
                 ) -> MigrationHandle:
        """The handle of ``plan`` as submitted: ``policy`` (a callable) makes it adaptive with
        that policy (its spec, or ``custom``, recorded in the plan); an adaptive plan without
        one gets the policy its spec names (:func:`~megaphone.plans.policy.policy_from_spec`)."""
        if policy is not None:
            if not callable(policy):
                raise PlanError(f"policy must be callable, got {policy!r}")
            spec = getattr(policy, "spec", None)
            plan = dataclasses.replace(
                plan, policy=dict(spec) if isinstance(spec, dict) else {"name": "custom"})
        elif plan.adaptive:
            policy = policy_from_spec(plan.policy)
        return cls(plan, policy)

    @property
    def done(self) -> bool:
        """True once every step is committed (or the plan failed; see ``error``)."""
        return self._done.is_set()

    @property
    def progress(self) -> Progress:
        """A snapshot of the plan's progress."""
        with self._lock:
            p = self._progress
            return Progress(p.steps_done, p.steps_total, p.bins_done, p.bins_total,
                            p.bytes_moved, list(p.epochs))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the plan is done or ``timeout`` seconds pass; True if done.

        Raises the plan's error if it failed.
        """
        finished = self._done.wait(timeout)
        if self.error is not None:
            raise self.error
        return finished

    def _step_started(self) -> None:  # adaptive plans: the policy chose one more step
        with self._lock:
            self._progress.steps_total += 1

    def step_committed(self, epoch: int, bins: int, nbytes: int) -> None:
        """Count a step of the plan as committed at ``epoch``: ``bins`` moved, ``nbytes``
        shipped. Called by whoever runs the plan's epochs: the live plan queue, or offline
        migration (:func:`~megaphone.migrator.control.offline.migrate_offline`)."""
        with self._lock:
            p = self._progress
            p.steps_done += 1
            p.bins_done += bins
            p.bytes_moved += nbytes
            p.epochs.append(epoch)
            finished = p.steps_done == p.steps_total and p.bins_done == p.bins_total
        if finished:
            self._done.set()

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self._done.set()

    def __repr__(self) -> str:
        p = self.progress
        return (
            f"MigrationHandle(steps {p.steps_done}/{p.steps_total}, bins {p.bins_done}/"
            f"{p.bins_total}, bytes {p.bytes_moved}, done={self.done})"
        )


__all__ = ["MigrationHandle", "Progress"]
