"""Planning inputs from the runtime: what the pure planner (:mod:`megaphone.plans.planner`)
needs, read from a running ``Pipeline`` or from a state directory on disk as a
:class:`~megaphone.plans.planner.PlanningSource`.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import numpy as np

from megaphone.migrator.epoch.state_reader import bin_sizes
from megaphone.migrator.statedir.directory import StateDir
from megaphone.plans.plan import PlanError
from megaphone.plans.planner import BinSizes, PlanningSource
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
    def host_slots(self) -> dict[str, int | None]: ...


def pipeline_source(pipeline: LivePipeline) -> PlanningSource:
    """What a live pipeline offers for planning: its live routing table, its metrics and its
    smoothed per-bin load."""
    try:
        pipeline.state_dir  # noqa: B018 -- raises RuntimeError for a pipeline without state
    except RuntimeError as exc:
        raise PlanError(str(exc)) from None
    return PlanningSource(pipeline.routing, len(pipeline.in_flight),
                          tuple(pipeline.metric_records()), pipeline.bin_sizes,
                          pipeline.bin_load, tuple(pipeline.trace_records()),
                          pipeline.host_slots())


def state_dir_source(state: StateDir | str | os.PathLike[str]) -> PlanningSource:
    """What a state directory offers for planning: its committed routing table, recorded
    metrics and traces, the hosts known with their task slots, and bin sizes read from its
    workers' backends (no measured load)."""
    state = state if isinstance(state, StateDir) else StateDir.open(state)
    commit = state.read_commit()
    return PlanningSource(state.routing_as_of(commit.state_version), len(commit.plans),
                          epoch_records(state.read_metrics()),
                          lambda owners: bin_sizes(state, owners), lambda: None,
                          tuple(state.read_traces()), commit.host_slots())


__all__ = [
    "LivePipeline",
    "pipeline_source",
    "state_dir_source",
]
