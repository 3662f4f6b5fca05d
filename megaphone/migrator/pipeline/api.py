"""``megaphone.migrate`` and ``megaphone.rescale``: one call each for a running pipeline or a
stopped state directory."""

from __future__ import annotations

import os
from pathlib import Path

from megaphone.migrator.control.offline import migrate_offline
from megaphone.migrator.control.plan_inputs import pipeline_source, state_dir_source
from megaphone.migrator.pipeline.facade import Pipeline
from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.statedir.registry import running_pipeline
from megaphone.plans.handle import MigrationHandle
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.planner import plan_from
from megaphone.plans.policy import MigrationPolicy
from megaphone.plans.strategies import FLUID
from megaphone.plans.targets import TargetSpec


def migrate(
    plan: MigrationPlan,
    pipeline: Pipeline | None = None,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    policy: MigrationPolicy | None = None,
) -> MigrationHandle:
    """Apply ``plan``: live on ``pipeline`` (or the one in this process with the plan's id),
    else offline on ``state_dir``.

    Validates at once; a bad plan raises :class:`~megaphone.plans.plan.PlanError` and changes
    nothing. Returns a handle with ``done``, ``progress`` and ``wait(timeout)``; an empty plan
    (``rescale`` to the layout in place) is done at once, at 0 of 0 steps. ``policy``
    (live only) makes the plan adaptive: see :meth:`Pipeline.migrate`; offline it is refused
    (a ``ValueError``), since no epoch runs to ask it. Offline there is no stream to protect,
    so an adaptive plan's (``strategy="deadline"``) moves are made at once.

    >>> handle = megaphone.migrate(plan)  # doctest: +SKIP
    >>> handle.wait(); handle.progress.bins_done  # doctest: +SKIP
    """
    if pipeline is None:
        pipeline = running_pipeline(plan.fingerprint.pipeline_id)
    if pipeline is not None:
        return pipeline.migrate(plan, policy)
    if state_dir is None:
        raise PlanError(
            f"no pipeline {plan.fingerprint.pipeline_id!r} is running in this process and no "
            "state_dir was given"
        )
    if policy is not None:
        raise ValueError("policy= makes a plan adaptive while its pipeline runs; offline (on "
                         "state_dir) no epoch runs to ask it: migrate without it, or live")
    return migrate_offline(os.fspath(state_dir), plan)


def rescale(
    pipeline_or_state_dir: Pipeline | StateDir | str | os.PathLike[str],
    workers: int | None = None,
    strategy: str = FLUID,
    gap: int = 0,
    balance: str = "keys",
    per_worker: int = 1,
    target: TargetSpec | str | os.PathLike[str] | None = None,
    target_latency: float | None = None,
    order: str | None = None,
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
    ``balance="load"`` uses the records per bin the pipeline measured, when it has run;
    ``order="relief"`` (the default when that load is known) moves the load that hurts first,
    ``order="bins"`` keeps bin order.

    >>> plan = megaphone.rescale(pipe, workers=4, strategy="batched")  # doctest: +SKIP
    >>> megaphone.migrate(plan, pipe).wait()  # doctest: +SKIP
    """
    pipeline = _as_pipeline(pipeline_or_state_dir)
    source = pipeline_source(pipeline) if pipeline is not None else \
        state_dir_source(pipeline_or_state_dir)  # type: ignore[arg-type]
    return plan_from(source, workers, strategy, gap, balance, per_worker, target,
                     target_latency, order)


def _as_pipeline(obj: object) -> Pipeline | None:
    """The Pipeline behind ``obj``: itself, or one open in this process on that directory."""
    if isinstance(obj, Pipeline):
        return obj
    if isinstance(obj, StateDir):
        state = obj
    elif isinstance(obj, (str, os.PathLike)):
        if not StateDir.exists(Path(obj)):
            return None
        state = StateDir.open(obj)
    else:
        raise TypeError(f"rescale needs a Pipeline or a state directory, got {type(obj).__name__}")
    running = running_pipeline(state.fingerprint.pipeline_id)
    if running is not None and running.state_dir.path.resolve() == state.path.resolve():
        return running
    return None
