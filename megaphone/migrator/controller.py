"""Plans in flight: the queue of submitted plans and the handles users follow them with.

Engine-agnostic and thread-safe: ``submit`` may be called from any thread while the driver's
epoch loop calls :meth:`PlanQueue.steps_due` and :meth:`PlanQueue.committed`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.routing.table import Move, RoutingTable


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
    """Follow a submitted plan: ``done``, ``progress`` and ``wait(timeout)``."""

    def __init__(self, plan: MigrationPlan) -> None:
        self.plan = plan
        self._progress = Progress(
            steps_total=len(plan.steps), bins_total=sum(len(s.moves) for s in plan.steps)
        )
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None

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

    def _step_committed(self, epoch: int, bins: int, nbytes: int) -> None:
        with self._lock:
            p = self._progress
            p.steps_done += 1
            p.bins_done += bins
            p.bytes_moved += nbytes
            p.epochs.append(epoch)
            finished = p.steps_done == p.steps_total
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


@dataclass
class _Active:
    handle: MigrationHandle
    epochs: list[int] | None = None  # absolute epochs, fixed when the plan becomes active
    applied: int = 0  # steps applied to the routing table
    committed: int = 0  # steps whose epoch committed


class PlanQueue:
    """Submitted plans, the first one active, the rest waiting their turn."""

    def __init__(self, table: RoutingTable) -> None:
        self.table = table
        self._plans: list[_Active] = []
        self.lock = threading.RLock()

    @property
    def in_flight(self) -> list[MigrationHandle]:
        """Handles of plans not finished yet, the active one first."""
        with self.lock:
            return [a.handle for a in self._plans]

    def end_version(self) -> int:
        """The routing version in force once every queued plan has run."""
        with self.lock:
            return self._plans[-1].handle.plan.end_version if self._plans else self.table.version

    def submit(self, plan: MigrationPlan, next_epoch: int) -> MigrationHandle:
        """Validate ``plan`` and queue it; a bad or stale plan raises and changes nothing.

        With nothing in flight the plan must start from the table's newest version; otherwise
        from the version the last queued plan ends at.
        """
        with self.lock:
            if not self._plans:
                plan.validate(self.table, next_epoch)
            else:
                end = self.end_version()
                if plan.base_version != end:
                    raise PlanError(
                        f"stale plan: it starts from routing version {plan.base_version}, but "
                        f"the plans in flight end at version {end}; resubmit it from {end}"
                    )
                plan.validate(self._table_after_queue(), next_epoch)
            active = _Active(MigrationHandle(plan))
            self._plans.append(active)
            return active.handle

    def _table_after_queue(self) -> RoutingTable:
        scratch = RoutingTable.from_dict(self.table.to_dict())
        epoch = scratch.latest_epoch
        for active in self._plans:
            for step in active.handle.plan.steps[active.applied :]:
                epoch += 1
                scratch.apply_step(step.moves, epoch)
        return scratch

    def steps_due(self, epoch: int) -> list[Move]:
        """Apply to the routing table every step that takes effect at ``epoch``; return them.

        Called by the driver before it runs ``epoch``. A plan becomes active (its relative
        epochs are fixed) at the first epoch after the plans before it finished applying.
        """
        moves: list[Move] = []
        with self.lock:
            for active in self._plans:
                plan = active.handle.plan
                if active.applied == len(plan.steps):
                    continue
                if active.epochs is None:
                    active.epochs = plan.absolute_epochs(epoch)
                while active.applied < len(plan.steps) and active.epochs[active.applied] <= epoch:
                    step = plan.steps[active.applied]
                    try:
                        self.table.apply_step(step.moves, epoch)
                    except ValueError as exc:  # validated at submission: only on a bug
                        active.handle._fail(PlanError(f"step {active.applied}: {exc}"))
                        raise
                    moves.extend(step.moves)
                    active.applied += 1
                break  # later plans wait until this one has applied all its steps
            return moves

    def committed(self, epoch: int, bytes_by_bin: dict[int, int]) -> None:
        """Record that ``epoch`` committed; steps applied at it count as done."""
        with self.lock:
            for active in list(self._plans):
                plan = active.handle.plan
                while active.committed < active.applied and active.epochs is not None:
                    if active.epochs[active.committed] > epoch:
                        break
                    step = plan.steps[active.committed]
                    nbytes = sum(bytes_by_bin.get(m.bin, 0) for m in step.moves)
                    active.handle._step_committed(epoch, len(step.moves), nbytes)
                    active.committed += 1
                if active.committed == len(plan.steps):
                    self._plans.remove(active)

    def restore(self, saved: list[dict[str, Any]]) -> list[MigrationHandle]:
        """Re-queue plans saved by :meth:`to_list` (after a restart); return their new handles."""
        with self.lock:
            for item in saved:
                active = _Active(MigrationHandle(MigrationPlan.from_dict(item["plan"])),
                                 item["epochs"], item["applied"], item["committed"])
                for i in range(active.committed):
                    step = active.handle.plan.steps[i]
                    active.handle._step_committed(active.epochs[i], len(step.moves), 0)
                self._plans.append(active)
            return [a.handle for a in self._plans]

    def to_list(self) -> list[dict[str, Any]]:
        """Plans in flight as JSON (for commit.json and ``megaphone inspect``)."""
        with self.lock:
            return [
                {
                    "plan": a.handle.plan.to_dict(),
                    "epochs": a.epochs,
                    "applied": a.applied,
                    "committed": a.committed,
                }
                for a in self._plans
            ]
