"""Cameo-style migration: a latency target decides how much state moves at each epoch.

Cameo (Xu et al., NSDI 2021) runs work by deadline, ``ddl = t_MF + L - C_OM - C_path``: the
time the input was complete plus the latency target, minus the cost still ahead. For
migration, the epoch whose input ended at ``t_MF`` must finish by ``t_MF + L``; it starts
``lag`` seconds after ``t_MF``. Before each epoch the :class:`DeadlinePolicy` predicts the
epoch's duration from a :class:`~megaphone.plans.cost_model.CostModel` learned online from the
per-epoch metrics, and
starts the moves that keep the prediction within the deadline. An epoch is one Spark job of
two stages, the senders' exports (map) and then every worker's install and processing
(reduce), so::

    lag + margin * (overhead + stage(export_w) + stage(processing_w + install_w)) <= L
    stage(x) = max over hosts h of max(max_{w at h} x_w, sum_{w at h} x_w / slots_h)

where a worker is at its home and a new worker where it would be homed, so a move onto a busy
host is predicted slower than one onto an idle host; with homes or slots unknown
(``EpochView.homes``, ``host_slots``), the stage is ``max(max_w x_w, sum_w x_w / parallelism)``
over all workers (:class:`~megaphone.plans.cost_model.Slots`). ``export_w`` is the export of
the bins ``w`` sends, ``install_w`` the shipping and install of
those it receives, ``processing_w`` its records (plus the records of the bins it receives).

The model checks itself: for the recent epochs that moved state it predicts each one's
duration from what the epoch did (records, bytes sent and received per worker) and scales its
predictions by the 90th percentile of measured / predicted (never below 1), so a model that
underestimates large moves corrects itself, also for a new plan or after a restart. It learns
that from the epochs that ran as the next one will, with a store compacting or without
(:func:`~megaphone.plans.cost_model.calibration`): a compaction makes moves two to three times
as slow for a minute or more. The first epoch after a store starts compacting moves at most
half the bins of the last moving epoch, until two moving epochs measured while compacting
tell how much slower.

So the policy moves more while there is slack, nothing while the pipeline is behind, and
never lets a move push an epoch past its deadline by prediction -- except a bin that does not
fit even into an epoch with full slack, which moves after ``patience`` such epochs with the
bins the slack holds (over by a moving job's fixed cost once) and says so, and, if the
pipeline stays behind for ``max_behind`` epochs in a row (the target is missed even without
migrating: an overloaded pipeline that needs this very rescale), the smallest bin alone, so
the plan still makes progress; both are logged as warnings.

Relief per second of transfer: when the per-bin load is known (``bin_records``), a pipeline
that is behind needs the moves that shrink its backlog fastest per second of transfer. An epoch
lasts as long as its busiest worker, so only records taken off that worker shrink the backlog,
and a transfer's time is the model's export (none for a bin written ahead) and install of its
bytes. So the forced move of a ``stalled`` pipeline is the one that takes the most records per
epoch per second of transfer off the busiest worker (the newest epoch's most records in), not
merely the smallest, and ``priority="relief"`` tries every epoch's moves in that order (then
records per second from the other workers, then plan order), filling the slack with the most
relief it can buy (:func:`relief_first`). Without load both fall back to the smallest bin.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from megaphone.plans import cost_model
from megaphone.plans.cost_model import APPLY, EXPORT, CostModel, Slots, Work
from megaphone.plans.plan import PlanError
from megaphone.plans.policy import EpochView, StepDecision, register_policy
from megaphone.plans.relief import relief_first
from megaphone.routing.table import Move

log = logging.getLogger("megaphone.deadline")

#: Predictions within this many seconds of the budget count as fitting (float rounding).
EPSILON_S = 1e-9
#: Pending compaction bytes above which a worker receives no more bins for now.
DEFAULT_COMPACTION_DEBT = 1 << 30
#: Level-0 files a receiver may reach with this epoch's bins (each ingested bin can add one).
DEFAULT_MAX_L0_FILES = 8
#: Epochs a plan's first move waits for a bin written ahead (docs/transfer.md).
DEFAULT_AHEAD_WAIT = 2
#: The policy's integer parameters, their least values, and those that may be ``None``.
_COUNT_MIN = {"patience": 1, "window": 1, "min_history": 1, "max_behind": 1,
              "max_compaction_debt": 0, "max_l0_files": 1, "ahead_wait": 0}
_OPTIONAL = {"max_behind", "max_compaction_debt", "max_l0_files"}
PRIORITIES = ("auto", "largest", "smallest", "hottest", "relief")
"""Built-in orders in which the deadline policy tries bins (see :class:`DeadlinePolicy`)."""


Priority = Callable[[Move, EpochView], Any]
"""A sort key for moves: the deadline policy tries bins in ascending key order."""


class DeadlinePolicy:
    """Start, each epoch, the moves whose predicted cost still meets the latency target.

    ``target_latency_s`` is L; ``margin`` multiplies every prediction (safety); ``priority``
    orders the bins tried: ``auto`` (largest first while the largest fits, else smallest
    first to fill small slack), ``largest``, ``smallest``, ``hottest`` (most recent records
    first), ``relief`` (most records off the busiest worker per second of transfer first,
    see the module) or a callable ``key(move, view)``. ``patience``: epochs with slack but
    nothing fitting before an oversized bin moves (with the bins the slack holds).
    ``max_behind``: epochs behind in a row before one bin moves anyway (the most relief per
    second when the load is known, else the smallest; ``None``: never). ``window``: epochs
    the cost model learns from; ``min_history``: epochs measured before the first move.
    ``max_compaction_debt``: a worker whose store reports more pending compaction bytes than
    this receives no bins until its background compactions catch up (``None``: no limit), so
    installs never pile work onto a store whose compactions would then compete with the
    epochs for the CPU.
    ``max_l0_files``: likewise, a worker receives at most as many bins in an epoch as its store
    lacks level-0 files to this many (``None``: no limit). The cheapest single move, which the
    probe, a stall and an oversized wait make, is a bin written ahead where there is one
    (docs/transfer.md), else the smallest; until an export is measured, only bins written
    ahead move, then the smallest other alone; ``ahead_wait``: epochs the probe waits for one
    where the stores write bins ahead (a plan's first epoch names the bins, its idle time
    writes them, the next commit reports them; after the first, only while some are still
    to write). An epoch moves at most twice the most bins an epoch of the ``window`` moved
    (:func:`~megaphone.plans.cost_model.fixed_and_per_byte`).
    """

    def __init__(self, target_latency_s: float, margin: float = 1.2,
                 priority: str | Priority = "auto", patience: int = 3, window: int = 20,
                 min_history: int = 2, max_behind: int | None = 20,
                 max_compaction_debt: int | None = DEFAULT_COMPACTION_DEBT,
                 max_l0_files: int | None = DEFAULT_MAX_L0_FILES,
                 ahead_wait: int = DEFAULT_AHEAD_WAIT) -> None:
        def number(name: str, value: Any, low: float, integer: bool = False) -> None:
            ok = isinstance(value, int if integer else (int, float)) and \
                not isinstance(value, bool) and math.isfinite(value) and value >= low
            if not ok:
                kind = "an integer" if integer else "a number"
                raise PlanError(f"deadline policy: {name} must be {kind} >= {low}, got {value!r}")

        number("target_latency_s", target_latency_s, 0.0)
        if target_latency_s <= 0:
            raise PlanError(f"deadline policy: target_latency_s must be > 0, got "
                            f"{target_latency_s!r}")
        number("margin", margin, 1.0)
        counts = {"patience": patience, "window": window, "min_history": min_history,
                  "max_behind": max_behind, "max_compaction_debt": max_compaction_debt,
                  "max_l0_files": max_l0_files, "ahead_wait": ahead_wait}
        for name, value in counts.items():
            if value is not None or name not in _OPTIONAL:
                number(name, value, _COUNT_MIN[name], integer=True)
        if isinstance(priority, str) and priority not in PRIORITIES:
            raise PlanError(f"deadline policy: unknown priority {priority!r}; expected one of "
                            f"{', '.join(PRIORITIES)} or a callable")
        if not isinstance(priority, str) and not callable(priority):
            raise PlanError(f"deadline policy: priority must be a name or a callable, got "
                            f"{priority!r}")
        self.target_latency_s, self.margin = float(target_latency_s), float(margin)
        self.priority, self.patience, self.window = priority, patience, window
        self.min_history, self.max_behind, self.ahead_wait = min_history, max_behind, ahead_wait
        self.max_compaction_debt, self.max_l0_files = max_compaction_debt, max_l0_files
        self.spec: dict[str, Any] = {
            "name": "deadline", "target_latency_s": self.target_latency_s, "margin": self.margin,
            "priority": priority if isinstance(priority, str) else "custom", **counts}
        self.decisions: deque[StepDecision] = deque(maxlen=10_000)
        self.model: CostModel | None = None
        self.calibration = 1.0
        self._starved = self._behind = 0
        self._ahead: frozenset[int] = frozenset()  # bins written ahead at the last commit
        self._probed: int | None = None  # the first probe's epoch: not learned from
        self._prepared = 0  # epochs the probe waited for a bin written ahead
        self._export_probed = False  # a bin not written ahead moved to measure its export
        self._idle_s = 0.0  # the model's epoch without moves, for this decision

    @classmethod
    def from_spec(cls, params: Mapping[str, Any]) -> DeadlinePolicy:
        """The policy of a plan's ``{"name": "deadline", ...}`` (without ``name``)."""
        known = {"target_latency_s", "margin", "priority", *_COUNT_MIN}
        unknown = set(params) - known
        if unknown:
            raise PlanError(f"deadline policy has unknown fields {sorted(unknown)}")
        if "target_latency_s" not in params:
            raise PlanError("deadline policy needs target_latency_s (seconds)")
        priority = params.get("priority", "auto")
        if priority == "custom":  # a callable given in process; not stored
            priority = "auto"
        if not isinstance(priority, str):
            raise PlanError(f"deadline policy: priority must be a string, got {priority!r}")
        return cls(**{**params, "priority": priority})

    def __call__(self, view: EpochView) -> list[Move]:
        """The moves to start before ``view.epoch``; the reason is appended to ``decisions``."""
        if not view.remaining:
            return []
        par = Slots(view.parallelism, view.homes, view.host_slots)
        self._ahead = cost_model.written_ahead(view.history)
        # The first moving epoch also pays the transfer path's one-off costs: not learned from.
        fit = [m for m in view.history if m.epoch != self._probed]
        model = CostModel.fit(fit, par, self.window, view.traces)
        if not model.export_s_per_byte and self.model is not None:
            # Epochs whose bins all went written ahead measure no export: keep the last rate.
            model = replace(model, export_s_per_byte=self.model.export_s_per_byte)
        self.model = model
        compacting = bool(view.history) and cost_model.compacting(view.history[-1])
        self.calibration, measured = cost_model.calibration(model, fit, par, self.window,
                                                            compacting)
        budget = self.target_latency_s - view.lag_s
        if model.epochs_seen < self.min_history:
            return self._decide(view, "warm-up", [], 0.0, budget)
        indebted = cost_model.indebted(view.history, self.max_compaction_debt,
                                       self.max_l0_files)
        movable = [m for m in view.remaining if m.dst not in indebted]
        if not movable:
            return self._decide(view, "compaction", [], 0.0, budget,
                                f"workers {sorted(indebted)} owe more than "
                                f"{self.max_compaction_debt} bytes of compaction or hold "
                                f"{self.max_l0_files} level-0 files or more")
        if len(movable) < len(view.remaining):
            view = replace(view, remaining=tuple(movable))
        workers = {int(w) for m in view.history[-self.window:] for w in m.per_worker}
        workers |= {w for m in view.remaining for w in (m.src, m.dst)}
        base = {(APPLY, w): model.processing_s(w) for w in workers}
        self._idle_s = model.epoch_s(base, par)
        idle = self._predict(model, base, par)
        size = {m: view.bin_bytes.get(m.bin, 0) for m in view.remaining}
        # The cheapest single move: a bin written ahead if there is one (docs/transfer.md).
        smallest = min(view.remaining, key=lambda m: (m.bin not in self._ahead, size[m], m))
        if not self._fits(idle, budget):
            self._behind += 1
            if self.max_behind is None or self._behind < self.max_behind:
                return self._decide(view, "behind", [], idle, budget,
                                    f"lag {view.lag_s:.2f} s + predicted {idle:.2f} s leave no "
                                    "slack")
            self._behind = 0
            forced = relief_first(view, self._transfer_us(model, view, size))[0] \
                if view.bin_records else smallest
            why = "the most relief per second" if view.bin_records else "the smallest"
            note = (f"behind for {self.max_behind} epochs in a row (the target is missed even "
                    f"without migrating); moving {why} bin {forced.bin} alone")
            log.warning("deadline policy, epoch %d: %s", view.epoch, note)
            return self._decide(view, "stalled", [forced],
                                self._alone_s(model, base, forced, size, view, par),
                                budget, note)
        self._behind = 0
        if model.transfers_seen == 0:
            pending = cost_model.ahead_pending(view.history)
            if self._probed is None and self._prepared < self.ahead_wait and \
                    pending is not None and (pending or not self._prepared) and \
                    not self._ahead & {m.bin for m in view.remaining}:
                self._prepared += 1
                return self._decide(view, "prepare", [], idle, budget,
                                    f"no bin written ahead yet: waiting {self._prepared}/"
                                    f"{self.ahead_wait} before the probe")
            self._probed = view.epoch if self._probed is None else self._probed
            return self._decide(view, "probe", [smallest],
                                self._alone_s(model, base, smallest, size, view, par), budget,
                                "no transfer measured yet: the smallest bin alone")
        if not model.export_s_per_byte and not self._export_probed:
            # Every bin moved so far was written ahead: a bin that is not costs an export never
            # measured (0 s to the model), so only bins written ahead move, until one that is
            # not has moved alone.
            ahead = tuple(m for m in view.remaining if m.bin in self._ahead)
            if not ahead:  # so ``smallest`` is the smallest bin, none being written ahead
                self._export_probed = True
                return self._decide(view, "probe", [smallest],
                                    self._alone_s(model, base, smallest, size, view, par),
                                    budget, "no export measured yet: the smallest bin alone")
            view = replace(view, remaining=ahead)
        chosen: list[Move] = []
        work = dict(base)
        room = cost_model.l0_room(view.history, self.max_l0_files)
        most = max((m.bins_moved for m in view.history[-self.window:]), default=0)
        cap, note = 2 * most or None, ""
        if compacting and measured < cost_model.REGIME_EPOCHS:
            last = next((m.bins_moved for m in reversed(view.history) if m.bins_moved), 0)
            if last:
                cap = max(1, last // 2)
                note = (f"a store is compacting: at most {cap} bins until "
                        f"{cost_model.REGIME_EPOCHS} moving epochs are measured while it does")
        work = self._fill(view, model, base, size, budget, par, chosen, work, room, cap,
                          lambda predicted: self._fits(predicted, budget))
        if chosen:
            self._starved = 0
            return self._decide(view, "fit", chosen, self._predict(model, work, par), budget,
                                note)
        self._starved += 1
        alone = self._alone_s(model, base, smallest, size, view, par)
        if self._starved < self.patience:
            return self._decide(view, "wait", [], idle, budget,
                                f"smallest remaining bin {smallest.bin} needs {alone:.2f} s "
                                f"(x{self.margin:g} margin); waiting {self._starved}/"
                                f"{self.patience}")
        self._starved = 0
        # What no slack holds (a moving job's fixed cost) is paid once; the slack takes more.
        forced, slack = [smallest], max(0.0, budget / self.margin - idle)
        if smallest.dst in room:
            room[smallest.dst] -= 1
        work = self._fill(view, model, base, size, budget, par, forced, self._with(
            model, base, smallest, size[smallest], view), room, cap,
            lambda predicted: predicted <= alone + slack + EPSILON_S)
        more = f"with {len(forced) - 1} more bins (slack {slack:.2f} s)" if forced[1:] else "alone"
        note = (f"bin {smallest.bin} ({size[smallest]:,} bytes) is predicted to take {alone:.2f} "
                f"s x{self.margin:g} margin, over the {budget:.2f} s budget even with full "
                f"slack; moving it {more} after {self.patience} epochs")
        log.warning("deadline policy, epoch %d: %s", view.epoch, note)
        return self._decide(view, "oversized", forced, self._predict(model, work, par), budget,
                            note)

    def _fill(self, view: EpochView, model: CostModel, base: Work, size: Mapping[Move, int],
              budget: float, par: Slots, chosen: list[Move], work: Work,
              room: dict[int, int], cap: int | None, fits: Callable[[float], bool]) -> Work:
        """Add to ``chosen`` (and ``work``, returned) the moves, in :meth:`_order`, whose epoch
        still ``fits``: at most ``cap`` in all, none to a receiver out of level-0 ``room``."""
        for move in self._order(view, model, base, size, budget, par):
            if cap is not None and len(chosen) >= cap:
                break
            if move in chosen or room.get(move.dst, 1) <= 0:
                continue
            trial = self._with(model, work, move, size[move], view)
            if fits(self._predict(model, trial, par)):
                work = trial
                chosen.append(move)
                if move.dst in room:
                    room[move.dst] -= 1
        return work

    def _fits(self, predicted: float, budget: float) -> bool:
        """Whether ``predicted`` seconds, with the margin, stay within ``budget``."""
        return self.margin * predicted <= budget + EPSILON_S

    def _predict(self, model: CostModel, work: Work, parallelism: Slots) -> float:
        """The model's epoch duration for ``work``: the epoch without moves as the model has it,
        plus what the moves add, calibrated by its measured error (:meth:`_calibrate`)."""
        return self._idle_s + self.calibration * max(0.0, model.epoch_s(work, parallelism)
                                                     - self._idle_s)

    def _transfer_us(self, model: CostModel, view: EpochView,
                     size: Mapping[Move, int]) -> dict[Move, int]:
        """Each remaining move's predicted transfer in microseconds, its export (none for a bin
        written ahead, a tenth of the cost: docs/transfer.md) and install."""
        return {m: round(1e6 * (model.export_s(m.src, 0 if m.bin in self._ahead else size[m])
                                + model.install_s(m.dst, size[m])))
                for m in view.remaining}

    def _alone_s(self, model: CostModel, base: Work, move: Move, size: Mapping[Move, int],
                 view: EpochView, par: Slots) -> float:
        """The predicted epoch with ``move`` its only move."""
        return self._predict(model, self._with(model, base, move, size[move], view), par)

    def _with(self, model: CostModel, work: Work, move: Move, nbytes: int,
              view: EpochView) -> dict[tuple[int, int], float]:
        """``work`` plus moving ``move``: export at the sender, install and records at the
        receiver (the sender's records are kept: a conservative prediction)."""
        out = dict(work)
        src, dst = (EXPORT, move.src), (APPLY, move.dst)
        scanned = 0 if move.bin in self._ahead else nbytes  # a file written ahead: its patch
        out[src] = out.get(src, 0.0) + model.export_s(move.src, scanned)
        records = view.bin_records.get(move.bin, 0.0)
        out[dst] = out.get(dst, 0.0) + model.install_s(move.dst, nbytes) + \
            model.record_s(move.dst) * records
        return out

    def _order(self, view: EpochView, model: CostModel, base: Work,
               size: Mapping[Move, int], budget: float, par: Slots) -> list[Move]:
        """The moves in the order they are tried: by :attr:`priority`; for the built-in
        orders but ``relief``, the bins whose files are written ahead first (they cost their
        sender almost nothing), each part in that order."""
        ordered = self._by_priority(view, model, base, size, budget, par)
        if callable(self.priority) or self.priority == "relief" or not self._ahead:
            return ordered
        return sorted(ordered, key=lambda m: m.bin not in self._ahead)  # stable

    def _by_priority(self, view: EpochView, model: CostModel, base: Work,
                     size: Mapping[Move, int], budget: float, par: Slots) -> list[Move]:
        moves = list(view.remaining)
        if callable(self.priority):
            return sorted(moves, key=lambda m: self.priority(m, view))
        if self.priority == "relief":
            return relief_first(view, self._transfer_us(model, view, size)) \
                if view.bin_records else sorted(moves, key=lambda m: (size[m], m))
        if self.priority == "hottest":
            return sorted(moves, key=lambda m: (-view.bin_records.get(m.bin, 0.0), -size[m], m))
        largest_first = sorted(moves, key=lambda m: (-size[m], m))
        if self.priority == "largest":
            return largest_first
        if self.priority == "smallest":
            return largest_first[::-1]
        big = largest_first[0]
        alone = self._predict(model, self._with(model, base, big, size[big], view), par)
        return largest_first if self._fits(alone, budget) else largest_first[::-1]

    def _decide(self, view: EpochView, action: str, moves: list[Move], predicted: float,
                budget: float, note: str = "") -> list[Move]:
        nbytes = sum(view.bin_bytes.get(m.bin, 0) for m in moves)
        self.decisions.append(StepDecision(view.epoch, action, len(moves), nbytes,
                                       round(predicted, 4), round(budget, 4), note,
                                       round(self.calibration, 3)))
        return moves


register_policy("deadline", DeadlinePolicy.from_spec)

__all__ = ["PRIORITIES", "DeadlinePolicy", "Priority", "StepDecision"]
