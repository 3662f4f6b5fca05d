"""Planning inputs from the runtime: what :mod:`megaphone.plans` needs, read from a running
``Pipeline`` or from a state directory on disk.

The planner itself is pure (:func:`megaphone.plans.planner.plan_rescale`); this module reads
the routing table, the plans in flight, the recorded metrics (as
:class:`~megaphone.records.EpochMetrics`), per-bin sizes from the state backends and the
measured per-bin load, and hands them over as :class:`~megaphone.plans.planner.PlanningInputs`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from megaphone.migrator.statedir import StateDir
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.planner import BinSizes, PlanningInputs, check_request, plan_rescale
from megaphone.plans.strategies import FLUID
from megaphone.plans.targets import TargetSpec
from megaphone.records import EpochMetrics
from megaphone.routing.table import RoutingTable
from megaphone.snailtrail import EpochTrace
from megaphone.state_backends import open_backend


class LivePipeline(Protocol):
    """What planning reads from a running :class:`~megaphone.Pipeline` (this module does not
    import the pipeline, which imports it)."""

    @property
    def state_dir(self) -> StateDir: ...
    @property
    def routing(self) -> RoutingTable: ...
    @property
    def in_flight(self) -> list[Any]: ...
    def metric_records(self, last: int | None = None) -> list[EpochMetrics]: ...
    def trace_records(self, last: int | None = None) -> list[EpochTrace]: ...
    def bin_sizes(self, owners: np.ndarray | None = None) -> BinSizes: ...
    def bin_load(self) -> np.ndarray: ...


def epoch_records(metrics: Iterable[Mapping[str, Any]]) -> tuple[EpochMetrics, ...]:
    """Stored per-epoch metrics (plain dicts) as records, for planning and policies."""
    return tuple(m if isinstance(m, EpochMetrics) else EpochMetrics.from_dict(dict(m))
                 for m in metrics)


def bin_sizes(state: StateDir, owners: np.ndarray) -> BinSizes:
    """Per-bin keys and bytes of ``state``, read read-only from every worker's backend.

    A bin's size is taken from its owner under ``owners``; if the owner does not hold it yet
    (a move not applied to state), from the lowest worker that does. Reading changes no file.
    """
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


def sizes_from_stats(stats: Iterable[tuple[int, int, int]], num_bins: int) -> BinSizes:
    """:class:`BinSizes` from ``(bin, keys, bytes)`` rows (the executors' bin statistics)."""
    keys = np.zeros(num_bins, np.int64)
    nbytes = np.zeros(num_bins, np.int64)
    for b, k, n in stats:
        keys[b], nbytes[b] = k, n
    return BinSizes(keys=keys, bytes=nbytes)


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


@dataclass(frozen=True)
class PlanningSource:
    """The cheap facts about a pipeline (routing, plans in flight, metrics and traces), and how
    to read the costly ones (bin sizes, measured load) once a request has been checked."""

    table: RoutingTable
    in_flight: int
    metrics: tuple[EpochMetrics, ...]
    read_sizes: Callable[[np.ndarray], BinSizes]
    read_load: Callable[[], np.ndarray | None]
    traces: tuple[EpochTrace, ...] = ()

    def inputs(self) -> PlanningInputs:
        """Read the bin sizes (at the newest owners) and load: the planner's inputs."""
        return PlanningInputs(self.table, self.read_sizes(self.table.owners()), self.read_load(),
                              self.metrics, self.in_flight)


def pipeline_source(pipeline: LivePipeline) -> PlanningSource:
    """What a live pipeline offers for planning: its live routing table, its metrics and its
    smoothed per-bin load."""
    try:
        pipeline.state_dir  # noqa: B018 -- raises RuntimeError for a pipeline without state
    except RuntimeError as exc:
        raise PlanError(str(exc)) from None
    return PlanningSource(pipeline.routing, len(pipeline.in_flight),
                          tuple(pipeline.metric_records()), pipeline.bin_sizes,
                          pipeline.bin_load, tuple(pipeline.trace_records()))


def state_dir_source(state: StateDir | str | os.PathLike[str]) -> PlanningSource:
    """What a state directory offers for planning: its committed routing table, recorded
    metrics and traces, and bin sizes read from its workers' backends (no measured load)."""
    state = state if isinstance(state, StateDir) else StateDir.open(state)
    commit = state.read_commit()
    return PlanningSource(committed_table(state, commit.state_version), len(commit.plans),
                          epoch_records(state.read_metrics()),
                          lambda owners: bin_sizes(state, owners), lambda: None,
                          tuple(state.traces.read()))


def plan_from(
    source: PlanningSource,
    workers: int | None = None,
    strategy: str = FLUID,
    gap: int = 0,
    balance: str = "keys",
    per_worker: int = 1,
    target: TargetSpec | str | os.PathLike[str] | None = None,
    target_latency: float | None = None,
) -> MigrationPlan:
    """Check the request, then read the state and plan (:func:`plan_rescale`)."""
    target = check_request(source.table, source.in_flight, workers, target, balance)
    return plan_rescale(source.inputs(), workers, target=target, strategy=strategy, gap=gap,
                        balance=balance, per_worker=per_worker, target_latency=target_latency)


__all__ = [
    "LivePipeline",
    "PlanningSource",
    "bin_sizes",
    "committed_table",
    "epoch_records",
    "pipeline_source",
    "plan_from",
    "sizes_from_stats",
    "state_dir_source",
]
