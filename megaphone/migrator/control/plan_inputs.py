"""Planning inputs from the runtime: what :mod:`megaphone.plans` needs, read from a running
``Pipeline`` or from a state directory on disk.

The planner itself is pure (:func:`megaphone.plans.planner.plan_rescale`); this module reads
the routing table, the plans in flight, the recorded metrics (as
:class:`~megaphone.records.EpochMetrics`), per-bin sizes from the state backends and the
measured per-bin load, and hands them over as :class:`~megaphone.plans.planner.PlanningInputs`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from megaphone.migrator.epoch.state_reader import bin_sizes
from megaphone.migrator.statedir.directory import StateDir
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.planner import BinSizes, PlanningInputs, check_request, plan_rescale
from megaphone.plans.strategies import FLUID
from megaphone.plans.targets import TargetSpec
from megaphone.records import EpochMetrics, epoch_records
from megaphone.routing.table import RoutingTable
from megaphone.snailtrail import EpochTrace


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


def committed_table(state: StateDir, state_version: int) -> RoutingTable:
    """``state``'s routing table as of its last commit (``state_version``).

    Versions past the commit are what a crash left behind; the pipeline discards them when it
    next opens the directory (and offline migration before it starts), so plans must start
    from the committed version. A table *behind* the commit is damage, reported as an error.
    """
    table = state.load_routing()
    if table.version < state_version:
        raise PlanError(
            f"{state.routing_path} holds routing version {table.version}, but the last commit "
            f"says the state is at version {state_version}"
        )
    return table.truncated(state_version) if table.version > state_version else table


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
    order: str | None = None,
) -> MigrationPlan:
    """Check the request, then read the state and plan (:func:`plan_rescale`)."""
    target = check_request(source.table, source.in_flight, workers, target, balance)
    return plan_rescale(source.inputs(), workers, target=target, strategy=strategy, gap=gap,
                        balance=balance, per_worker=per_worker, target_latency=target_latency,
                        order=order)


__all__ = [
    "LivePipeline",
    "PlanningSource",
    "committed_table",
    "pipeline_source",
    "plan_from",
    "state_dir_source",
]
