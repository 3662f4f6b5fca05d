"""Plans in flight: the queue of submitted plans (their handles: :mod:`megaphone.plans.handle`).

Engine-agnostic and thread-safe: ``submit`` may be called from any thread while the driver's
epoch loop calls :meth:`PlanQueue.steps_due` and :meth:`PlanQueue.committed`. A fixed plan's
steps take effect at their epochs; an adaptive plan's policy is asked before every epoch
which of its remaining moves start (:mod:`megaphone.plans.policy`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from megaphone.plans.handle import MigrationHandle
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.policy import (
    EpochView,
    MigrationPolicy,
    checked_choice,
    policy_from_spec,
    policy_name,
)
from megaphone.records import EpochMetrics
from megaphone.routing.table import Move, RoutingTable
from megaphone.snailtrail import EpochTrace

log = logging.getLogger("megaphone.plans")


@dataclass
class PolicyInputs:
    """What the driver knows before an epoch, for the policies of adaptive plans.

    ``history()``: recent per-epoch metrics records; ``traces()``: their epochs' traces;
    ``bin_bytes()``: size of every bin (read once
    when a plan becomes active); ``bin_records()``: recent records per bin; ``lag_s``: how
    long after the end of its input the epoch starts; ``parallelism``: task slots;
    ``homes`` / ``host_slots``: each worker's home and each host's task slots (the last
    commit's; empty when unknown).
    """

    history: Callable[[], Sequence[EpochMetrics]] = tuple
    traces: Callable[[], Sequence[EpochTrace]] = tuple
    bin_bytes: Callable[[], Mapping[int, int]] = dict
    bin_records: Callable[[], Mapping[int, float]] = dict
    lag_s: float = 0.0
    parallelism: int = 1
    homes: Mapping[int, str] = field(default_factory=dict)
    host_slots: Mapping[str, int] = field(default_factory=dict)


@dataclass
class _Active:
    handle: MigrationHandle
    epochs: list[int] | None = None  # absolute epoch of each step, set as the plan runs
    applied: int = 0  # steps applied to the routing table
    committed: int = 0  # steps whose epoch committed
    policy: MigrationPolicy | None = None  # adaptive plans: chooses the steps
    decided: list[list[Move]] = field(default_factory=list)  # adaptive: steps chosen so far
    idle: int = 0  # adaptive: epochs in a row without a new step
    sizes: Mapping[int, int] | None = None  # adaptive: bin sizes when it became active

    def step_moves(self, i: int) -> Sequence[Move]:
        return self.decided[i] if self.policy is not None else self.handle.plan.steps[i].moves

    def remaining(self) -> list[Move]:
        started = {m for step in self.decided for m in step}
        return [m for m in self.handle.plan.moves if m not in started]

    def all_applied(self) -> bool:
        if self.policy is not None:
            return not self.remaining()
        return self.applied == len(self.handle.plan.steps)


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

    def submit(self, plan: MigrationPlan, next_epoch: int,
               policy: MigrationPolicy | None = None) -> MigrationHandle:
        """Validate ``plan`` and queue it; a bad or stale plan raises and changes nothing.

        With nothing in flight the plan must start from the table's newest version; otherwise
        from the version the last queued plan ends at. ``policy`` (a callable) makes the plan
        adaptive with that policy: its moves start when the policy says so. An empty plan is
        checked alike (from either version) but never queued: its handle is done at once and
        the plans in flight are not disturbed.
        """
        with self.lock:
            table = self._table_for(plan)
            handle = MigrationHandle.adaptive(plan, policy)
            handle.plan.validate(table, next_epoch)
            if not plan.empty:
                self._plans.append(_Active(handle, policy=handle.policy))
            return handle

    def _table_for(self, plan: MigrationPlan) -> RoutingTable:
        """What ``plan`` is checked against. An empty plan: the table in force, or the table
        once the plans in flight have run when it starts where they end (unknown behind an
        adaptive plan, so then only the table in force). Any other plan: the table in force
        with nothing in flight, else the table once the plans in flight have run, which it
        must start from (a ``PlanError`` if it is stale, or if an adaptive plan is in flight,
        whose last version is not known yet)."""
        adaptive = any(a.handle.plan.adaptive for a in self._plans)
        if plan.empty:
            if plan.base_version == self.table.version or not self._plans or adaptive:
                return self.table
            return self._table_after_queue()
        if adaptive:
            raise PlanError("an adaptive plan is in flight and its last routing version is "
                            "not known yet; submit this plan once it is done")
        if not self._plans:
            return self.table
        end = self.end_version()
        if plan.base_version != end:
            raise PlanError(
                f"stale plan: it starts from routing version {plan.base_version}, but "
                f"the plans in flight end at version {end}; resubmit it from {end}"
            )
        return self._table_after_queue()

    def _table_after_queue(self) -> RoutingTable:
        scratch = RoutingTable.from_dict(self.table.to_dict())
        epoch = scratch.latest_epoch
        for active in self._plans:
            for step in active.handle.plan.steps[active.applied :]:
                epoch += 1
                scratch.apply_step(step.moves, epoch)
        return scratch

    def steps_due(self, epoch: int, inputs: PolicyInputs | None = None) -> list[Move]:
        """Apply to the routing table every step that takes effect at ``epoch``; return them.

        Called by the driver before it runs ``epoch``. A plan becomes active (its relative
        epochs are fixed) at the first epoch after the plans before it finished applying. An
        adaptive plan's policy is asked now, with ``inputs``; a policy that raises or picks a
        move not left fails its plan (the moves already made stay) and the epoch runs on.
        """
        moves: list[Move] = []
        with self.lock:
            for active in self._plans:
                plan = active.handle.plan
                if active.all_applied():
                    continue
                if active.policy is not None:
                    moves.extend(self._adaptive_step(active, epoch, inputs or PolicyInputs()))
                    break
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

    def upcoming(self, per_sender: int) -> dict[int, tuple[int, ...]]:
        """The bins each old owner is to send next: the active plan's moves not started yet,
        in plan order (a fixed plan's later steps, an adaptive plan's remaining moves), at most
        ``per_sender`` each. Their stores write them ahead (docs/transfer.md)."""
        with self.lock:
            active = next((a for a in self._plans if not a.all_applied()), None)
            if active is None:
                return {}
            if active.policy is not None:
                moves = active.remaining()
            else:
                moves = [m for step in active.handle.plan.steps[active.applied:]
                         for m in step.moves]
            out: dict[int, list[int]] = {}
            for m in moves:
                bins = out.setdefault(m.src, [])
                if len(bins) < per_sender:
                    bins.append(m.bin)
            return {w: tuple(b) for w, b in out.items()}

    def group_end(self, start: int, end: int,
                  adaptive: Callable[[MigrationPolicy], int] | None = None) -> int:
        """The last epoch, at most ``end``, of a group of epochs starting at ``start`` that no
        plan step falls inside: called after :meth:`steps_due` applied ``start``'s steps. A
        fixed plan's next step ends the group before it; a plan waiting to become active ends
        it at ``start``. An adaptive plan's policy decided at ``start``: if it moved bins
        there, the group is that epoch alone (its policy predicted one epoch), else it may last
        ``adaptive(policy)`` epochs (default 1: the policy decides before every epoch;
        docs/groups.md)."""
        with self.lock:
            for active in self._plans:
                if active.all_applied():
                    continue
                if active.epochs is None:  # not active yet: it starts after ``start``
                    return start
                if active.policy is not None:
                    if adaptive is None or active.epochs[-1:] == [start]:
                        return start
                    return max(start, min(end, start + adaptive(active.policy) - 1))
                return max(start, min(end, active.epochs[active.applied] - 1))
            return end

    def _adaptive_step(self, active: _Active, epoch: int, inputs: PolicyInputs) -> list[Move]:
        assert active.policy is not None
        if active.epochs is None:
            active.epochs = []
        if active.sizes is None:
            active.sizes = inputs.bin_bytes()
        remaining = active.remaining()
        view = EpochView(epoch, tuple(remaining), active.sizes, inputs.bin_records(),
                         tuple(inputs.history()), inputs.lag_s, active.idle, inputs.parallelism,
                         tuple(inputs.traces()), inputs.homes, inputs.host_slots)
        try:
            chosen = checked_choice(active.policy(view), set(remaining))
            if chosen:
                self.table.check_step(chosen, epoch)
        except Exception as exc:  # a user's policy: fail its plan, keep the pipeline running
            error = exc if isinstance(exc, PlanError) else \
                PlanError(f"policy {policy_name(active.policy)} failed: {exc!r}")
            log.error("plan failed at epoch %d: %s", epoch, error)
            active.handle._fail(error)
            self._plans.remove(active)
            return []
        if not chosen:
            active.idle += 1
            return []
        self.table.apply_step(chosen, epoch)
        active.decided.append(sorted(chosen))
        active.epochs.append(epoch)
        active.applied += 1
        active.idle = 0
        active.handle._step_started()
        return list(chosen)

    def committed(self, epoch: int, bytes_by_bin: dict[int, int]) -> None:
        """Record that ``epoch`` committed; steps applied at it count as done."""
        with self.lock:
            for active in list(self._plans):
                while active.committed < active.applied and active.epochs is not None:
                    if active.epochs[active.committed] > epoch:
                        break
                    step = active.step_moves(active.committed)
                    nbytes = sum(bytes_by_bin.get(m.bin, 0) for m in step)
                    active.handle.step_committed(epoch, len(step), nbytes)
                    active.committed += 1
                if active.committed == active.applied and active.all_applied():
                    self._plans.remove(active)

    def restore(self, saved: list[dict[str, Any]]) -> list[MigrationHandle]:
        """Re-queue plans saved by :meth:`to_list` (after a restart); return their new handles.

        An adaptive plan resumes with the policy its JSON names; one whose policy was a
        callable given in process (``custom``) resumes as ``fluid``.
        """
        with self.lock:
            for item in saved:
                plan = MigrationPlan.from_dict(item["plan"])
                active = _Active(MigrationHandle(plan), item["epochs"], item["applied"],
                                 item["committed"])
                if plan.adaptive:
                    assert plan.policy is not None
                    active.decided = [[Move(*m) for m in step] for step in item["decided"]]
                    active.idle = item.get("idle", 0)
                    active.policy = policy_from_spec(plan.policy)  # "custom": fluid
                    if plan.policy["name"] == "custom":
                        log.warning("plan resumed after a restart: its in-process policy is "
                                    "gone, the remaining moves continue as fluid")
                    active.handle.policy = active.policy
                    active.handle._progress.steps_total = len(active.decided)
                for i in range(active.committed):
                    step = active.step_moves(i)
                    active.handle.step_committed(active.epochs[i], len(step), 0)
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
                    **({"decided": [[list(m) for m in step] for step in a.decided],
                        "idle": a.idle} if a.policy is not None else {}),
                }
                for a in self._plans
            ]
