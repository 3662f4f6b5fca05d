"""Hand a plan to a pipeline running in another process, through its state directory.

``megaphone migrate`` cannot call into another process, so it drops the plan (JSON) into
``STATE_DIR/inbox/``; the running pipeline picks it up between two epochs, submits it as if
``migrate(plan)`` had been called, and answers with a status file. Progress is then read from
``commit.json`` like any other reader of the directory.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from megaphone._io import atomic_write_bytes, atomic_write_json, read_json
from megaphone.migrator.statedir.directory import StateDir
from megaphone.paths import PLAN_SUFFIX, plan_status_path, status_plan_path
from megaphone.plans.plan import MigrationPlan, PlanError


def post_plan(state: StateDir, plan: MigrationPlan) -> Path:
    """Drop ``plan`` into the inbox; return the path its status will be written to."""
    state.paths.inbox.mkdir(exist_ok=True)
    plan_path = state.paths.inbox_plan(f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}")
    atomic_write_bytes(plan_path, plan.to_json().encode())
    return plan_status_path(plan_path)


def take_plans(state: StateDir, submit: Callable[[MigrationPlan], Any]) -> None:
    """Submit every plan waiting in the inbox (oldest first), between epochs; answer each with
    a status file."""
    inbox = state.paths.inbox
    if not inbox.is_dir():
        return
    for path in sorted(inbox.glob(f"*{PLAN_SUFFIX}")):
        status_path = plan_status_path(path)
        try:
            plan = MigrationPlan.load(path)
            submit(plan)
            status = {"status": "accepted", "end_version": plan.end_version}
        except PlanError as exc:
            status = {"status": "rejected", "error": str(exc)}
        atomic_write_json(status_path, status)
        path.unlink()


def wait_status(status_path: Path, timeout: float) -> dict[str, Any]:
    """Wait for the running pipeline's answer to a posted plan (a ``PlanError`` if none came)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if status_path.exists():
            status = read_json(status_path, "plan status")
            status_path.unlink()
            return status
        time.sleep(0.2)
    status_plan_path(status_path).unlink(missing_ok=True)
    raise PlanError(
        f"the pipeline holding {status_path.parent.parent} did not pick up the plan within "
        f"{timeout:.0f} s (it reads its inbox between epochs; is it processing batches?)"
    )
