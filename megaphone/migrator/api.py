"""``megaphone.migrate``: one call for a running pipeline or a stopped state directory."""

from __future__ import annotations

import os

from megaphone.migrator.controller import MigrationHandle
from megaphone.migrator.offline import migrate_offline
from megaphone.migrator.pipeline import Pipeline, running_pipeline
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.policy import MigrationPolicy


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
    nothing. Returns a handle with ``done``, ``progress`` and ``wait(timeout)``. ``policy``
    (live only) makes the plan adaptive: see :meth:`Pipeline.migrate`. Offline there is no
    stream to protect, so an adaptive plan's moves are made at once.

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
    return migrate_offline(os.fspath(state_dir), plan)
