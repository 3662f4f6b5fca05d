"""The pure rescale planner: planning inputs in, a :class:`MigrationPlan` out.

:class:`PlanningInputs` is what planning needs to know about a pipeline -- its routing table,
per-bin sizes, per-bin load and recent epoch metrics -- as plain data; the runtime or a state
directory supplies it as a :class:`PlanningSource`, read once :func:`plan_from` has checked
the request (the migrator's ``plan_inputs`` module). :func:`plan_rescale` picks a
target (:mod:`megaphone.plans.targets`) and orders the moves into steps
(:mod:`megaphone.plans.strategies`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.relief import relief_steps, worker_loads
from megaphone.plans.report import skew
from megaphone.plans.strategies import FLUID, make_plan
from megaphone.plans.targets import (
    BALANCE_MODES,
    TargetSpec,
    balanced_target,
    check_workers,
    explicit_target,
    read_target_file,
    target_moves,
)
from megaphone.records import EpochMetrics
from megaphone.routing.bins import bin_of
from megaphone.routing.table import RoutingTable
from megaphone.snailtrail import EpochTrace

#: Transfer rate assumed for duration estimates when no epoch has moved state yet (bytes/s).
DEFAULT_TRANSFER_RATE = 50.0 * 2**20
#: How many recent epochs of metrics ``balance="load"`` averages over.
LOAD_EPOCHS = 50


@dataclass(frozen=True)
class BinSizes:
    """Keys and bytes of every bin (arrays indexed by bin), as the state backends count them."""

    keys: np.ndarray
    bytes: np.ndarray

    @classmethod
    def zeros(cls, num_bins: int) -> BinSizes:
        """Sizes of an empty pipeline."""
        return cls(np.zeros(num_bins, np.int64), np.zeros(num_bins, np.int64))

    @classmethod
    def at(cls, per_worker: Mapping[int, Mapping[int, tuple[int, int]]], owners: np.ndarray
           ) -> BinSizes:
        """Per-bin keys and bytes from the workers' bin statistics (``{worker: {bin: (keys,
        bytes)}}``): a bin's are its owner's under ``owners`` or, if the owner does not hold
        it yet (a move not applied to state), those of the lowest worker that does."""
        owners = np.asarray(owners)
        keys = np.zeros(len(owners), np.int64)
        nbytes = np.zeros(len(owners), np.int64)
        found = np.zeros(len(owners), bool)
        for w, stats in per_worker.items():  # owners first
            for b, (k, n) in stats.items():
                if owners[b] == w:
                    keys[b], nbytes[b], found[b] = k, n, True
        for _, stats in sorted(per_worker.items()):
            for b, (k, n) in stats.items():
                if not found[b]:
                    keys[b], nbytes[b], found[b] = k, n, True
        return cls(keys, nbytes)


@dataclass(frozen=True)
class PlanningInputs:
    """What the planner knows about a pipeline: its routing ``table`` (planning starts from its
    newest version), per-bin ``sizes``, the measured records per bin (``load``, ``None`` when
    not measured), recent epoch ``metrics`` (oldest first) and the plans ``in_flight``."""

    table: RoutingTable
    sizes: BinSizes
    load: np.ndarray | None = None
    metrics: tuple[EpochMetrics, ...] = ()
    in_flight: int = 0


def observed_load(
    table: RoutingTable, keys: np.ndarray, metrics: Sequence[EpochMetrics],
    last: int = LOAD_EPOCHS,
) -> np.ndarray | None:
    """Estimated records per epoch of every bin, from the last ``last`` epochs of metrics.

    Metrics record records per *worker*, not per bin. The records of an epoch's watched hot
    keys (its ``hot_keys``, when the pipeline watches them: each key's count less its error,
    a count the key surely had) go to their bins; the rest of each worker's ``records_in`` is
    spread over the bins it owned at that epoch in proportion to their keys today (evenly if
    they hold no keys). Exact when the traffic beyond the hot keys follows the key counts, an
    approximation otherwise (an unwatched hot key makes its bin busier than its size says).
    Returns ``None`` when no epoch was recorded.
    """
    records = list(metrics)[-last:]
    if not records:
        return None
    keys = np.asarray(keys, dtype=np.float64)
    load = np.zeros(keys.size, dtype=np.float64)
    for m in records:
        owners = table.owners(m.epoch)
        hot = _hot_records(m, keys.size)
        for w, wm in m.per_worker.items():
            mine = np.flatnonzero(owners == w)
            if mine.size == 0:
                continue
            known = hot[mine]
            load[mine] += known
            n = float(wm.records_in or 0) - float(known.sum())
            if n <= 0:
                continue
            share = keys[mine]
            total = share.sum()
            load[mine] += n * (share / total if total > 0 else 1.0 / mine.size)
    return load / len(records)


def _hot_records(m: EpochMetrics, num_bins: int) -> np.ndarray:
    """Per bin, the records epoch ``m``'s watched hot keys surely had (count less error)."""
    out = np.zeros(num_bins, dtype=np.float64)
    for key, count, error in m.hot_keys:
        out[int(bin_of(key, num_bins))] += max(float(count) - float(error), 0.0)
    return out


def transfer_rate(metrics: Iterable[EpochMetrics]) -> tuple[float, int]:
    """``(bytes per second, epochs measured)`` from epochs that moved state.

    The rate is the bytes moved over the wall time of those epochs (which also processed
    records, so it is a conservative estimate). With no such epoch the rate is
    :data:`DEFAULT_TRANSFER_RATE` and the count is 0.
    """
    moved = [m for m in metrics if (m.bytes_moved or 0) > 0 and (m.duration_s or 0) > 0]
    if not moved:
        return DEFAULT_TRANSFER_RATE, 0
    return sum(m.bytes_moved for m in moved) / sum(m.duration_s for m in moved), len(moved)


def _weights(balance: str, sizes: BinSizes, load: np.ndarray | None) -> np.ndarray:
    if balance == "keys":
        return sizes.keys.astype(np.float64)
    if balance == "bytes":
        return sizes.bytes.astype(np.float64)
    if load is None:
        raise PlanError("balance='load' needs recorded epoch metrics, and none were found; "
                        "run some epochs first or balance by keys or bytes")
    return np.asarray(load, dtype=np.float64)


def per_worker_table(owners: np.ndarray, sizes: BinSizes, load: np.ndarray | None,
                     workers: Iterable[int]) -> dict[str, dict[str, float | int]]:
    """Bins, keys and bytes (and records, when ``load`` is known) each of ``workers`` holds
    under ``owners``, keyed by the worker's number as text (as plans and ``inspect`` show it)."""
    out: dict[str, dict[str, float | int]] = {}
    for w in sorted(set(workers)):
        mine = owners == w
        row: dict[str, float | int] = {
            "bins": int(mine.sum()),
            "keys": int(sizes.keys[mine].sum()),
            "bytes": int(sizes.bytes[mine].sum()),
        }
        if load is not None:
            row["records"] = round(float(load[mine].sum()), 1)
        out[str(w)] = row
    return out


def _skew(per_worker: dict[str, dict[str, float | int]], field: str, live: list[int]) -> float:
    return round(skew([float(per_worker[str(w)][field]) for w in live]), 4)


def check_request(
    table: RoutingTable,
    in_flight: int,
    workers: int | None,
    target: TargetSpec | str | os.PathLike[str] | None,
    balance: str,
) -> TargetSpec | None:
    """Check a rescale request before any state is read; return the target, read from its file.

    Raises :class:`PlanError` while plans are in flight, unless exactly one of ``workers`` and
    ``target`` is given, for a bad target or worker count, or an unknown ``balance``.
    """
    if in_flight:
        raise PlanError(
            f"pipeline {table.fingerprint.pipeline_id} has {in_flight} plan(s) in flight; "
            "plan the next migration once they finish"
        )
    if (workers is None) == (target is None):
        raise PlanError("give exactly one of workers=N or target=")
    if target is not None:
        if isinstance(target, (str, os.PathLike)):
            target = read_target_file(target)
        explicit_target(table.owners(), target)
    else:
        check_workers(workers)
    if balance not in BALANCE_MODES:
        raise PlanError(f"unknown balance {balance!r}; expected one of {', '.join(BALANCE_MODES)}")
    return target


def plan_rescale(
    inputs: PlanningInputs,
    workers: int | None = None,
    *,
    target: TargetSpec | str | os.PathLike[str] | None = None,
    strategy: str = FLUID,
    gap: int = 0,
    balance: str = "keys",
    per_worker: int = 1,
    target_latency: float | None = None,
    order: str | None = None,
) -> MigrationPlan:
    """The pure planner: a plan from ``inputs.table``'s newest version to ``workers`` or
    ``target``.

    ``balance="load"`` weighs bins by ``inputs.load`` when it was measured, else by the load
    :func:`observed_load` estimates from ``inputs.metrics``; ``target_latency`` (seconds) is
    for ``strategy="deadline"``. ``order`` (``relief`` or ``bins``; default relief when a load
    is known) picks which steps go first (:mod:`megaphone.plans.relief`). ``plan.meta``
    summarizes the plan: bins, keys and bytes moved, steps, the largest step in bytes,
    bins/keys/bytes (and records) per worker before and after, a duration estimate from the
    measured transfer rate, the order and, with load, each step's records moved and the
    largest worker load after it (``relief``). A plan with no steps
    means nothing needs to move. Raises :class:`PlanError` as :func:`check_request` does.
    """
    table, sizes = inputs.table, inputs.sizes
    target = check_request(table, inputs.in_flight, workers, target, balance)
    measured = inputs.load
    load = measured if measured is not None and measured.any() else \
        observed_load(table, sizes.keys, inputs.metrics)
    owners = np.asarray(table.owners(), dtype=np.int64)
    if target is not None:
        new_owners = explicit_target(owners, target)
        mode = "explicit"
    else:
        new_owners = balanced_target(owners, _weights(balance, sizes, load), check_workers(workers))
        mode = balance
    moves = target_moves(owners, new_owners)
    plan = make_plan(table, moves, strategy, gap, per_worker, target_latency, order=order,
                     load=load)
    step_bytes = [int(sum(int(sizes.bytes[m.bin]) for m in s.moves)) for s in plan.steps]
    before_live = sorted({int(w) for w in owners})
    after_live = sorted({int(w) for w in new_owners})
    shown = set(before_live) | set(after_live)
    before = per_worker_table(owners, sizes, load, shown)
    after = per_worker_table(new_owners, sizes, load, shown)
    skew_field = {"keys": "keys", "bytes": "bytes", "load": "records"}.get(mode, "keys")
    if skew_field == "records" and load is None:
        skew_field = "keys"
    moved_bins = [m.bin for m in moves]
    bytes_moved = int(sizes.bytes[moved_bins].sum()) if moves else 0
    meta: dict[str, Any] = {
        "balance": mode,
        "strategy": strategy,
        "gap": gap,
        "per_worker": per_worker,
        "workers_before": before_live,
        "workers_after": after_live,
        "bins_moved": len(moves),
        "keys_moved": int(sizes.keys[moved_bins].sum()) if moves else 0,
        "bytes_moved": bytes_moved,
        "steps": len(plan.steps),
        "epochs": plan.steps[-1].epoch + 1 if plan.steps else 0,
        **({"target_latency_s": target_latency} if plan.adaptive else {}),
        "largest_step_bytes": max(step_bytes, default=0),
        "largest_step_bins": max((len(s.moves) for s in plan.steps), default=0),
        "skew_field": skew_field,
        "skew_before": _skew(before, skew_field, before_live),
        "skew_after": _skew(after, skew_field, after_live),
        "before": before,
        "after": after,
        "estimate": _estimate(bytes_moved, inputs.metrics),
        **plan.meta,
    }
    if load is not None and load.any() and moves and not plan.adaptive:
        meta["relief"] = {
            "max_load_before": round(float(worker_loads(owners, load, 1).max()), 1),
            "steps": relief_steps([s.moves for s in plan.steps], owners, load),
        }
    return replace(plan, meta=meta)


@dataclass(frozen=True)
class PlanningSource:
    """The cheap facts about a pipeline (routing, plans in flight, metrics and traces), and how
    to read the costly ones (bin sizes, measured load) once a request has been checked.
    ``hosts``: the hosts known and each one's task slots (``None`` where unknown), which DS2
    sets its target against; ``None`` when not known at all."""

    table: RoutingTable
    in_flight: int
    metrics: tuple[EpochMetrics, ...]
    read_sizes: Callable[[np.ndarray], BinSizes]
    read_load: Callable[[], np.ndarray | None]
    traces: tuple[EpochTrace, ...] = ()
    hosts: Mapping[str, int | None] | None = None

    def inputs(self) -> PlanningInputs:
        """Read the bin sizes (at the newest owners) and load: the planner's inputs."""
        return PlanningInputs(self.table, self.read_sizes(self.table.owners()), self.read_load(),
                              self.metrics, self.in_flight)


def plan_from(
    source: PlanningSource,
    workers: int | None = None,
    strategy: str = FLUID,
    gap: int = 0,
    balance: str = "keys",
    per_worker: int = 1,
    target: TargetSpec | str | os.PathLike[str] | None = None,
    target_latency: float | None = None,
    order: str | None = None,
) -> MigrationPlan:
    """Check the request, then read the state and plan (:func:`plan_rescale`)."""
    target = check_request(source.table, source.in_flight, workers, target, balance)
    return plan_rescale(source.inputs(), workers, target=target, strategy=strategy, gap=gap,
                        balance=balance, per_worker=per_worker, target_latency=target_latency,
                        order=order)


def _estimate(nbytes: int, metrics: Sequence[EpochMetrics]) -> dict[str, Any]:
    """How long moving ``nbytes`` takes at the transfer rate measured in ``metrics``."""
    rate, measured = transfer_rate(metrics)
    return {
        "rate_bytes_per_s": round(rate, 1),
        "rate_source": f"measured over {measured} epoch(s) that moved state" if measured
        else "default rate: no epoch has moved state yet",
        "transfer_s": round(nbytes / rate, 3),
    }


__all__ = [
    "DEFAULT_TRANSFER_RATE",
    "LOAD_EPOCHS",
    "BinSizes",
    "PlanningInputs",
    "PlanningSource",
    "check_request",
    "observed_load",
    "per_worker_table",
    "plan_from",
    "plan_rescale",
    "transfer_rate",
]
