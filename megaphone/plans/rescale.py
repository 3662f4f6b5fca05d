"""``rescale``: plan a migration to ``N`` workers (or to an explicit target) for a pipeline.

Reads what the planner needs -- the routing table, per-bin sizes from the state backends'
counters (``bin_stats``, ``O(num_bins)`` per worker) and, for ``balance="load"``, the recorded
per-epoch metrics -- then picks a target (:mod:`megaphone.plans.targets`) and orders the moves
into steps (:mod:`megaphone.plans.strategies`). :func:`plan_rescale` is the pure core (arrays
in, plan out); :func:`rescale` gathers its inputs from a ``Pipeline`` or a state directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from megaphone.plans.plan import MigrationPlan, PlanError
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
from megaphone.routing.table import RoutingTable

if TYPE_CHECKING:
    from megaphone.migrator.pipeline import Pipeline
    from megaphone.migrator.statedir import StateDir

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


def bin_sizes(state: StateDir, owners: np.ndarray) -> BinSizes:
    """Per-bin keys and bytes of ``state``, read read-only from every worker's backend.

    A bin's size is taken from its owner under ``owners``; if the owner does not hold it yet
    (a move not applied to state), from the lowest worker that does. Reading changes no file.
    """
    from megaphone.state_backends import open_backend

    if state.manifest.get("checkpoint") is not None:
        raise ValueError(
            f"{state.path} keeps its workers' state on the executors (checkpoint location "
            f"{state.manifest['checkpoint']}): read bin sizes from the running pipeline "
            "(Pipeline.bin_sizes, or rescale(pipeline, ...))")
    fp = state.fingerprint
    owners = np.asarray(owners)
    keys = np.zeros(fp.num_bins, np.int64)
    nbytes = np.zeros(fp.num_bins, np.int64)
    found = np.zeros(fp.num_bins, bool)
    kind = state.manifest.get("backend", "rocksdb")
    per_worker: dict[int, dict[int, Any]] = {}
    for w in state.worker_ids():
        backend = open_backend(kind, state.worker_path(w), fp.key_type, fp.num_bins,
                               read_only=True)
        try:
            per_worker[w] = backend.bin_stats()
        finally:
            backend.close()
    for w, stats in per_worker.items():  # owners first
        for b, s in stats.items():
            if owners[b] == w:
                keys[b], nbytes[b], found[b] = s.keys, s.bytes, True
    for _, stats in sorted(per_worker.items()):
        for b, s in stats.items():
            if not found[b]:
                keys[b], nbytes[b], found[b] = s.keys, s.bytes, True
    return BinSizes(keys, nbytes)


def committed_table(state: StateDir, state_version: int) -> RoutingTable:
    """``state``'s routing table as of its last commit (``state_version``).

    Versions past the commit are what a crash left behind; the pipeline discards them when it
    next opens the directory (and offline migration before it starts), so plans must start
    from the committed version. A table *behind* the commit is damage, reported as an error.
    """
    table = state.load_routing()
    if table.version == state_version:
        return table
    if table.version < state_version:
        raise PlanError(
            f"{state.routing_path} holds routing version {table.version}, but the last commit "
            f"says the state is at version {state_version}"
        )
    data = table.to_dict()
    data["versions"] = data["versions"][:state_version]
    return RoutingTable.from_dict(data, state.fingerprint)


def observed_load(
    table: RoutingTable, keys: np.ndarray, metrics: Iterable[dict[str, Any]],
    last: int = LOAD_EPOCHS,
) -> np.ndarray | None:
    """Estimated records per epoch of every bin, from the last ``last`` epochs of metrics.

    Metrics record records per *worker*, not per bin, so each worker's ``records_in`` of an
    epoch is spread over the bins it owned at that epoch in proportion to their keys today
    (evenly if they hold no keys). This is exact when a worker's traffic follows its key
    counts and an approximation otherwise (hot keys make a bin busier than its size says).
    Returns ``None`` when no epoch was recorded.
    """
    records = [m for m in metrics if isinstance(m.get("per_worker"), dict)][-last:]
    if not records:
        return None
    keys = np.asarray(keys, dtype=np.float64)
    load = np.zeros(keys.size, dtype=np.float64)
    for m in records:
        owners = table.owners(int(m.get("epoch", table.latest_epoch)))
        for w_str, wm in m["per_worker"].items():
            n = float(wm.get("records_in", 0) or 0)
            if n <= 0:
                continue
            mine = np.flatnonzero(owners == int(w_str))
            if mine.size == 0:
                continue
            share = keys[mine]
            total = share.sum()
            load[mine] += n * (share / total if total > 0 else 1.0 / mine.size)
    return load / len(records)


def transfer_rate(metrics: Iterable[dict[str, Any]]) -> tuple[float, int]:
    """``(bytes per second, epochs measured)`` from epochs that moved state.

    The rate is the bytes moved over the wall time of those epochs (which also processed
    records, so it is a conservative estimate). With no such epoch the rate is
    :data:`DEFAULT_TRANSFER_RATE` and the count is 0.
    """
    moved = [m for m in metrics if (m.get("bytes_moved") or 0) > 0 and
             (m.get("duration_s") or 0) > 0]
    if not moved:
        return DEFAULT_TRANSFER_RATE, 0
    return sum(m["bytes_moved"] for m in moved) / sum(m["duration_s"] for m in moved), len(moved)


def _weights(balance: str, sizes: BinSizes, load: np.ndarray | None) -> np.ndarray:
    if balance == "keys":
        return sizes.keys.astype(np.float64)
    if balance == "bytes":
        return sizes.bytes.astype(np.float64)
    if load is None:
        raise PlanError("balance='load' needs recorded epoch metrics, and none were found; "
                        "run some epochs first or balance by keys or bytes")
    return np.asarray(load, dtype=np.float64)


def _per_worker(owners: np.ndarray, sizes: BinSizes, load: np.ndarray | None,
                workers: Iterable[int]) -> dict[str, dict[str, float | int]]:
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
    values = [float(per_worker[str(w)][field]) for w in live]
    mean = sum(values) / len(values) if values else 0.0
    return round(max(values) / mean, 4) if mean > 0 else 1.0


def plan_rescale(
    table: RoutingTable,
    sizes: BinSizes,
    workers: int | None = None,
    *,
    target: TargetSpec | str | os.PathLike[str] | None = None,
    strategy: str = FLUID,
    gap: int = 0,
    balance: str = "keys",
    per_worker: int = 1,
    load: np.ndarray | None = None,
    target_latency: float | None = None,
) -> MigrationPlan:
    """The pure planner: a plan from ``table``'s newest version to ``workers`` or ``target``.

    ``sizes`` are the per-bin keys and bytes; ``load`` the per-bin records (needed for
    ``balance="load"``); ``target_latency`` (seconds) is for ``strategy="deadline"``.
    ``plan.meta`` summarizes it: bins, keys and bytes moved, steps, the largest step in
    bytes, and bins/keys/bytes (and records) per worker before and after. A plan with no
    steps means nothing needs to move.
    """
    if (workers is None) == (target is None):
        raise PlanError("give exactly one of workers=N or target=")
    if balance not in BALANCE_MODES:
        raise PlanError(f"unknown balance {balance!r}; expected one of {', '.join(BALANCE_MODES)}")
    owners = np.asarray(table.owners(), dtype=np.int64)
    if target is not None:
        if isinstance(target, (str, os.PathLike)):
            target = read_target_file(target)
        new_owners = explicit_target(owners, target)
        mode = "explicit"
    else:
        new_owners = balanced_target(owners, _weights(balance, sizes, load), check_workers(workers))
        mode = balance
    moves = target_moves(owners, new_owners)
    plan = make_plan(table, moves, strategy, gap, per_worker, target_latency)
    step_bytes = [int(sum(int(sizes.bytes[m.bin]) for m in s.moves)) for s in plan.steps]
    before_live = sorted({int(w) for w in owners})
    after_live = sorted({int(w) for w in new_owners})
    shown = set(before_live) | set(after_live)
    before = _per_worker(owners, sizes, load, shown)
    after = _per_worker(new_owners, sizes, load, shown)
    skew_field = {"keys": "keys", "bytes": "bytes", "load": "records"}.get(mode, "keys")
    if skew_field == "records" and load is None:
        skew_field = "keys"
    moved_bins = [m.bin for m in moves]
    meta: dict[str, Any] = {
        "balance": mode,
        "strategy": strategy,
        "gap": gap,
        "per_worker": per_worker,
        "workers_before": before_live,
        "workers_after": after_live,
        "bins_moved": len(moves),
        "keys_moved": int(sizes.keys[moved_bins].sum()) if moves else 0,
        "bytes_moved": int(sizes.bytes[moved_bins].sum()) if moves else 0,
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
    }
    return replace(plan, meta=meta)


def rescale(
    pipeline_or_state_dir: Pipeline | StateDir | str | os.PathLike[str],
    workers: int | None = None,
    strategy: str = FLUID,
    gap: int = 0,
    balance: str = "keys",
    per_worker: int = 1,
    target: TargetSpec | str | os.PathLike[str] | None = None,
    target_latency: float | None = None,
) -> MigrationPlan:
    """Plan moving a pipeline's bins onto ``workers`` workers (or onto ``target``).

    ``pipeline_or_state_dir`` is a ``Pipeline`` (its live routing table is used) or a state
    directory path (a pipeline with that id and directory open in this process is used
    instead). ``target`` is a ``{bin: worker}`` map, a list of owners or a JSON file of
    either. The plan starts from the newest routing version, so ``megaphone.migrate(plan)``
    accepts it unchanged; ``plan.meta`` also holds a duration estimate from the measured
    transfer rate. Raises :class:`PlanError` (a ``ValueError``) for bad arguments or while
    another plan is still in flight. ``strategy="deadline"`` with ``target_latency=L``
    (seconds) gives an adaptive plan: each epoch moves what still lets it finish within L.
    ``balance="load"`` uses the records per bin the pipeline measured, when it has run.

    >>> plan = megaphone.plans.rescale(pipe, workers=4, strategy="batched")  # doctest: +SKIP
    >>> megaphone.migrate(plan, pipe).wait()  # doctest: +SKIP
    """
    from megaphone.migrator.statedir import StateDir

    pipeline = _as_pipeline(pipeline_or_state_dir)
    if pipeline is not None:
        try:
            state = pipeline.state_dir
        except RuntimeError as exc:
            raise PlanError(str(exc)) from None
        table = pipeline.routing
        in_flight = len(pipeline.in_flight)
        metrics = pipeline.metrics()
    else:
        state = pipeline_or_state_dir if isinstance(pipeline_or_state_dir, StateDir) else \
            StateDir.open(pipeline_or_state_dir)
        commit = state.read_commit()
        in_flight = len(commit.plans)
        table = committed_table(state, commit.state_version)
        metrics = state.read_metrics()
    if in_flight:
        raise PlanError(
            f"pipeline {table.fingerprint.pipeline_id} has {in_flight} plan(s) in flight; "
            "plan the next migration once they finish"
        )
    owners = table.owners()
    if target is not None:  # check the target before reading any state
        if isinstance(target, (str, os.PathLike)):
            target = read_target_file(target)
        explicit_target(owners, target)
    elif workers is not None:
        check_workers(workers)
    if balance not in BALANCE_MODES:
        raise PlanError(f"unknown balance {balance!r}; expected one of {', '.join(BALANCE_MODES)}")
    sizes = pipeline.bin_sizes(owners) if pipeline is not None else bin_sizes(state, owners)
    measured = pipeline.bin_load() if pipeline is not None else None
    load = measured if measured is not None and measured.any() else \
        observed_load(table, sizes.keys, metrics)
    plan = plan_rescale(table, sizes, workers, target=target, strategy=strategy, gap=gap,
                        balance=balance, per_worker=per_worker, load=load,
                        target_latency=target_latency)
    rate, measured = transfer_rate(metrics)
    plan.meta["estimate"] = {
        "rate_bytes_per_s": round(rate, 1),
        "rate_source": f"measured over {measured} epoch(s) that moved state" if measured
        else "default rate: no epoch has moved state yet",
        "transfer_s": round(plan.meta["bytes_moved"] / rate, 3),
    }
    return plan


def _as_pipeline(obj: Any) -> Pipeline | None:
    """The Pipeline behind ``obj``: itself, or one open in this process on that directory."""
    from megaphone.migrator.pipeline import Pipeline, running_pipeline
    from megaphone.migrator.statedir import StateDir

    if isinstance(obj, Pipeline):
        return obj
    if isinstance(obj, StateDir):
        path = obj.path
    elif isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        if not StateDir.exists(path):
            return None
        obj = StateDir.open(path)
    else:
        raise TypeError(f"rescale needs a Pipeline or a state directory, got {type(obj).__name__}")
    running = running_pipeline(obj.fingerprint.pipeline_id)
    if running is not None and running.state_dir.path.resolve() == path.resolve():
        return running
    return None


__all__ = [
    "DEFAULT_TRANSFER_RATE",
    "LOAD_EPOCHS",
    "BinSizes",
    "bin_sizes",
    "committed_table",
    "observed_load",
    "plan_rescale",
    "rescale",
    "transfer_rate",
]
