"""Hand a plan to a pipeline running in another process, through the inbox of its state
directory (``megaphone migrate``) or of its checkpoint's driver copy (a stream on a Spark
Connect server; README, "What it does"): the poster checks the plan against the last commit,
posts it (:meth:`PlanInbox.post`) and follows it (:class:`PostedHandle`); whoever runs the
epochs takes it between two epochs (:meth:`PlanInbox.take`) and answers with a status file,
answering a plan it holds already instead of submitting it twice.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow.fs as pafs

from megaphone.migrator.statedir.commit import Commit
from megaphone.migrator.statedir.directory import StateDir, committed_routing
from megaphone.migrator.statedir.driver_copy import DriverCopy, Files
from megaphone.paths import INBOX, PLAN_SUFFIX, ROUTING, STATUS_SUFFIX
from megaphone.plans.handle import MigrationHandle, Progress
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.plan_queue import PlanQueue
from megaphone.routing.table import RoutingTable

#: The ``meta`` key of a posted plan's inbox name.
POSTED = "posted"
#: ``committed() -> (commit, routing)``: the last commit record and the routing as of it.
Committed = Callable[[], tuple[Commit, RoutingTable]]


def copy_committed(copy: DriverCopy) -> tuple[Commit, RoutingTable]:
    """The last commit record in a checkpoint's driver copy and the routing table as of it
    (read again while a commit lands in between, so the two match); a ``PlanError`` while it
    holds no commit."""
    if copy.manifest() is None:
        raise PlanError(f"the checkpoint {copy.uri} holds no commit of the pipeline yet")
    while True:
        commit = copy.latest_commit()
        table = RoutingTable.from_dict(json.loads(copy.read(ROUTING)))
        if DriverCopy(copy.uri).latest_commit()["seq"] == commit["seq"]:
            done = Commit.from_dict(commit)
            return done, committed_routing(table, done.state_version, f"{copy.uri} ({ROUTING})")
        copy = DriverCopy(copy.uri)


def dir_committed(state: StateDir) -> tuple[Commit, RoutingTable]:
    """The last commit record of a state directory and its routing table as of it (the routing
    is saved before an epoch's commit: read after the commit, it holds every version it
    names)."""
    commit = state.read_commit()
    return commit, state.routing_as_of(commit.state_version)


class PlanInbox:
    """The ``inbox/`` folder of ``files``: a state directory's or a checkpoint's driver copy."""

    def __init__(self, files: Files) -> None:
        self.files = files

    @classmethod
    def of_state_dir(cls, state: StateDir) -> PlanInbox:
        """The inbox of a state directory, for ``megaphone migrate`` from another process."""
        return cls(Files(pafs.LocalFileSystem(), str(state.path), str(state.path)))

    def post(self, plan: MigrationPlan, committed: Committed) -> MigrationHandle:
        """Check ``plan`` against the last commit (a ``PlanError`` posts nothing) and post it;
        its handle. An empty plan is done at once, not posted."""
        commit, table = committed()
        queue = PlanQueue(table)
        queue.restore(commit.plans)
        handle = queue.submit(plan, commit.epoch + 1)
        if plan.empty:
            return handle
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        plan = dataclasses.replace(plan, meta={**plan.meta, POSTED: name})
        self.files.put(plan.to_json().encode(), INBOX, name + PLAN_SUFFIX)
        return PostedHandle(plan, self, name, committed)

    def take(self, in_flight: Iterable[dict[str, Any]],
             submit: Callable[[MigrationPlan], Any]) -> None:
        """Submit every plan posted and not answered (oldest first); answer each with a status
        file. ``in_flight`` are the pipeline's plans in flight (``PlanQueue.to_list``): a posted
        plan among them is answered, not submitted again."""
        held = {p["plan"].get("meta", {}).get(POSTED) for p in in_flight}
        names = self.files.names(INBOX)
        for plan_name in (n for n in names if n.endswith(PLAN_SUFFIX)):
            name = plan_name.removesuffix(PLAN_SUFFIX)
            if name + STATUS_SUFFIX not in names:
                status: dict[str, Any] = {"status": "accepted"}
                if name not in held:
                    try:
                        submit(MigrationPlan.from_json(self.files.read(INBOX, plan_name).decode()))
                    except PlanError as exc:
                        status = {"status": "rejected", "error": str(exc)}
                self.files.put(json.dumps(status).encode(), INBOX, name + STATUS_SUFFIX)
            self.files.delete(INBOX, plan_name)

    def answer(self, name: str) -> dict[str, Any] | None:
        """The pipeline's answer to the plan posted as ``name``, read once (``None`` before)."""
        if name + STATUS_SUFFIX not in self.files.names(INBOX):
            return None
        status = json.loads(self.files.read(INBOX, name + STATUS_SUFFIX))
        self.files.delete(INBOX, name + STATUS_SUFFIX)
        return status


class PostedHandle(MigrationHandle):
    """Follow a plan posted to a pipeline running elsewhere: its answer from the inbox, then its
    steps as the commits reach their routing versions (``bytes_moved`` is not followed: the
    epochs' metrics hold it). A rejected plan fails with the pipeline's ``PlanError``."""

    def __init__(self, plan: MigrationPlan, inbox: PlanInbox, name: str,
                 committed: Committed) -> None:
        super().__init__(plan)
        self._inbox, self._name, self._committed = inbox, name, committed
        self.accepted = False
        self._seen = 0  # routing versions of the plan committed so far

    def _refresh(self) -> None:
        if self._done.is_set():
            return
        if not self.accepted:
            status = self._inbox.answer(self._name)
            if status is None:
                return
            if status["status"] != "accepted":
                self._fail(PlanError(status.get("error", "the pipeline rejected the plan")))
                return
            self.accepted = True
        commit, table = self._committed()
        base, reached = self.plan.base_version, commit.state_version
        while self._seen < min(self.plan.end_version, reached) - base:
            self._seen += 1
            version = table.versions[base + self._seen]
            self.step_committed(version.epoch, len(version.moves), 0)
        while reached >= self.plan.end_version and \
                self._progress.steps_done < self._progress.steps_total:
            self.step_committed(commit.epoch, 0, 0)  # a step that moves nothing

    def answered(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the pipeline to take the plan; if it did not,
        take the plan back and raise a ``PlanError``, as for a plan it rejected."""
        deadline = time.time() + timeout
        while not (self.done or self.accepted) and time.time() < deadline:
            time.sleep(0.2)
        if self.error is not None:
            raise self.error
        if not (self.accepted or self.done):
            self._inbox.files.delete(INBOX, self._name + PLAN_SUFFIX)  # taken back
            raise PlanError(f"the pipeline at {self._inbox.files.uri} did not take the plan "
                            f"within {timeout:.0f} s (it reads its inbox between epochs; is it "
                            "processing batches?)")

    @property
    def done(self) -> bool:
        """True once every step is committed (or the plan was rejected)."""
        self._refresh()
        return super().done

    @property
    def progress(self) -> Progress:
        """A snapshot of the plan's progress, as the last commit has it."""
        self._refresh()
        return super().progress

    def wait(self, timeout: float | None = None) -> bool:
        """Poll the commits until the plan is done or ``timeout`` seconds pass; True if done.
        Raises the pipeline's ``PlanError`` if it rejected the plan."""
        deadline = None if timeout is None else time.time() + timeout
        while not self.done and (deadline is None or time.time() < deadline):
            time.sleep(0.2)
        return super().wait(0)
