"""Hand plans to a pipeline whose stream runs it on a Spark Connect server, through the inbox of
its checkpoint location's driver copy (``CHECKPOINT/driver/inbox/``): the client posts a plan
(:func:`post`) and follows it (:class:`PostedHandle`); whoever runs the epochs takes it between
two epochs (:func:`take`), answering a plan it already holds instead of submitting it twice
(README, "What it does").
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from megaphone.migrator.statedir.driver_copy import DriverCopy
from megaphone.paths import INBOX, PLAN_SUFFIX, ROUTING, STATUS_SUFFIX
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.plan_queue import MigrationHandle, PlanQueue, Progress
from megaphone.routing.table import RoutingTable

#: The ``meta`` key of a posted plan's inbox name.
POSTED = "posted"


def committed(copy: DriverCopy) -> tuple[dict[str, Any], RoutingTable]:
    """The copy's last commit record and the routing table as of it (read again while a
    commit lands in between, so the two match); a ``PlanError`` while it holds no commit."""
    if copy.manifest() is None:
        raise PlanError(f"the checkpoint {copy.uri} holds no commit of the pipeline yet")
    while True:
        commit = copy.latest_commit()
        table = RoutingTable.from_dict(json.loads(copy.read(ROUTING)))
        if DriverCopy(copy.uri).latest_commit()["seq"] == commit["seq"]:
            version = commit["state_version"]
            return commit, table.truncated(version) if table.version > version else table
        copy = DriverCopy(copy.uri)


def post(uri: str, plan: MigrationPlan) -> MigrationHandle:
    """Check ``plan`` against the last commit in the checkpoint at ``uri`` (a ``PlanError``
    posts nothing) and post it; its handle. An empty plan is done at once, not posted."""
    if plan.adaptive:
        raise PlanError("an adaptive plan cannot be posted to a pipeline running on a Spark "
                        "Connect server: submit it before start(), or stop() the stream first")
    commit, table = committed(DriverCopy(uri))
    queue = PlanQueue(table)
    queue.restore(commit["plans"])
    handle = queue.submit(plan, commit["epoch"] + 1)
    if plan.empty:
        return handle
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
    plan = dataclasses.replace(plan, meta={**plan.meta, POSTED: name})
    DriverCopy(uri).put(plan.to_json().encode(), INBOX, name + PLAN_SUFFIX)
    return PostedHandle(plan, uri, name)


def take(copy: DriverCopy, in_flight: Iterable[dict[str, Any]],
         submit: Callable[[MigrationPlan], Any]) -> None:
    """Submit every plan posted in ``copy``'s inbox and not answered (oldest first); answer each
    with a status file. ``in_flight`` are the pipeline's plans in flight (``PlanQueue.to_list``):
    a posted plan among them is answered, not submitted again."""
    held = {p["plan"].get("meta", {}).get(POSTED) for p in in_flight}
    names = copy.names(INBOX)
    for plan_name in (n for n in names if n.endswith(PLAN_SUFFIX)):
        name = plan_name.removesuffix(PLAN_SUFFIX)
        if name + STATUS_SUFFIX not in names:
            status: dict[str, Any] = {"status": "accepted"}
            if name not in held:
                try:
                    submit(MigrationPlan.from_json(copy.read(INBOX, plan_name).decode()))
                except PlanError as exc:
                    status = {"status": "rejected", "error": str(exc)}
            copy.put(json.dumps(status).encode(), INBOX, name + STATUS_SUFFIX)
        copy.delete(INBOX, plan_name)


class PostedHandle(MigrationHandle):
    """Follow a plan posted to a pipeline running elsewhere: its answer from the inbox, then its
    steps as the commits in the checkpoint reach their routing versions (``bytes_moved`` is not
    followed: the epochs' metrics hold it). A rejected plan fails with the pipeline's
    ``PlanError``."""

    def __init__(self, plan: MigrationPlan, uri: str, name: str) -> None:
        super().__init__(plan)
        self._uri, self._name, self._accepted = uri, name, False
        self._seen = 0  # routing versions of the plan committed so far

    def _refresh(self) -> None:
        if self._done.is_set():
            return
        copy = DriverCopy(self._uri)
        if not self._accepted:
            status_name = self._name + STATUS_SUFFIX
            if status_name not in copy.names(INBOX):
                return
            status = json.loads(copy.read(INBOX, status_name))
            copy.delete(INBOX, status_name)
            if status["status"] != "accepted":
                self._fail(PlanError(status.get("error", "the pipeline rejected the plan")))
                return
            self._accepted = True
        commit, table = committed(copy)
        base, reached = self.plan.base_version, commit["state_version"]
        while self._seen < min(self.plan.end_version, reached) - base:
            self._seen += 1
            version = table.versions[base + self._seen]
            self.step_committed(version.epoch, len(version.moves), 0)
        while reached >= self.plan.end_version and \
                self._progress.steps_done < self._progress.steps_total:
            self.step_committed(commit["epoch"], 0, 0)  # a step that moves nothing

    @property
    def done(self) -> bool:
        """True once every step is committed in the checkpoint (or the plan was rejected)."""
        self._refresh()
        return super().done

    @property
    def progress(self) -> Progress:
        """A snapshot of the plan's progress, as the checkpoint's last commit has it."""
        self._refresh()
        return super().progress

    def wait(self, timeout: float | None = None) -> bool:
        """Poll the checkpoint until the plan is done or ``timeout`` seconds pass; True if done.
        Raises the pipeline's ``PlanError`` if it rejected the plan."""
        deadline = None if timeout is None else time.time() + timeout
        while not self.done and (deadline is None or time.time() < deadline):
            time.sleep(0.2)
        return super().wait(0)
