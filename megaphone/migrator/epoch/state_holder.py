"""A pipeline's hold on its state directory (:class:`StateHolder`; docs/architecture.md, "A
Pipeline and its collaborators").
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.sql import SparkSession

from megaphone.migrator.epoch.config import PipelineConfig, check_config, check_restore
from megaphone.migrator.epoch.state_reader import (
    DurableRead,
    read_bin_stats,
    release_local_stores,
    worker_bin_stats,
)
from megaphone.migrator.statedir.commit import Commit
from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.statedir.driver_copy import DriverCopy
from megaphone.migrator.statedir.recovery import RecoveryReport, check_and_recover
from megaphone.migrator.statedir.registry import register, unregister
from megaphone.plans.handle import MigrationHandle
from megaphone.plans.plan import MigrationPlan
from megaphone.plans.plan_queue import PlanQueue
from megaphone.plans.planner import BinSizes
from megaphone.plans.policy import MigrationPolicy
from megaphone.records import EpochMetrics, epoch_records
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import RoutingTable
from megaphone.snailtrail import EpochTrace
from megaphone.state_backends.durable import claim_checkpoint

#: Newest epochs' metrics (and traces) an adaptive plan's policy sees.
POLICY_HISTORY = 50
#: Newest epochs' metrics kept in memory.
METRICS_KEPT = 10_000

_NO_STATE = "the pipeline has no state yet: process a batch or give key_type"


class StateHolder:
    """The state directory of one pipeline while it is open in this process, and what its
    committed epochs left: the commit record, the plan queue, their metrics and traces.
    ``owner``: the pipeline registered under its id; ``config``: as the state directory fixes
    it; ``lock``: one epoch at a time, guarding the commit and routing.
    """

    def __init__(self, spark: SparkSession, path: Path, config: PipelineConfig,
                 owner: object) -> None:
        self.spark = spark
        self.path = path
        self.config = config
        # Weakly: the pipeline owns this holder, and a pipeline dropped by its user must be
        # freed at once (its state directory's lock with it), not at the next garbage cycle.
        self._owner = weakref.ref(owner)
        self.lock = threading.RLock()
        self.state: StateDir | None = None
        self.queue: PlanQueue | None = None
        self.commit = Commit()
        self.recovery = RecoveryReport()  # what opening the state directory discarded
        self.metrics: collections.deque[EpochMetrics] = collections.deque(maxlen=METRICS_KEPT)
        self.traces: collections.deque[EpochTrace] = collections.deque(maxlen=POLICY_HISTORY)
        #: An epoch failed after workers may have applied it (:meth:`undo_uncommitted`).
        self.uncommitted = False
        # This session's run: an epoch a worker applied in another run (one that crashed or
        # failed before its commit point) is rolled back there, never replayed.
        self.run_id = uuid.uuid4().hex
        self._bin_stats: tuple[int, Any] | None = None  # (committed epoch, per-worker stats)

    # -- what is open --------------------------------------------------------------------

    @property
    def owner(self) -> Any:
        """The pipeline this holder serves (registered in the process under its id)."""
        return self._owner()

    @property
    def state_dir(self) -> StateDir:
        """The open state directory (a ``RuntimeError`` before there is one)."""
        if self.state is None:
            raise RuntimeError(_NO_STATE)
        return self.state

    @property
    def plans(self) -> PlanQueue:
        """The plan queue (a ``RuntimeError`` before there is state)."""
        if self.queue is None:
            raise RuntimeError(_NO_STATE)
        return self.queue

    @property
    def routing(self) -> RoutingTable:
        """The routing table in force and planned."""
        return self.plans.table

    @property
    def epoch(self) -> int:
        """The last committed epoch (-1 before the first)."""
        return self.commit.epoch

    @property
    def manifest(self) -> dict[str, Any]:
        """The state directory's manifest (empty before there is one)."""
        return self.state.manifest if self.state is not None else {}

    @property
    def key_type(self) -> str | None:
        """The keys' type, once known (given, or from the first batch)."""
        return self.config.key_type

    # -- opening and closing -------------------------------------------------------------

    def start(self) -> None:
        """Open the state directory at :attr:`path` if there is one (restored first from the
        checkpoint location, whose copy is the truth), or create it when the key type is
        known; else it is created at the first batch (:meth:`create`)."""
        uri = (StateDir.open(self.path).manifest.get("checkpoint")
               if StateDir.exists(self.path) else None) or self.config.checkpoint
        if uri is not None:
            self.restore(uri)
        if StateDir.exists(self.path):
            self.open(StateDir.open(self.path))
        elif self.config.key_type is not None:
            self.create(self.config.key_type)

    def restore(self, uri: str, owner: object | None = None) -> None:
        """Bring the state directory to the driver's copy at ``uri`` if it is missing or
        behind it; refused for another configuration or a pipeline open here (but ``owner``)."""
        StateDir.restore(self.path, DriverCopy(uri),
                         lambda m: check_restore(self.config, m, uri, owner))

    def open(self, state: StateDir) -> None:
        """Take ``state`` as the pipeline's: its configuration checked, locked, brought back to
        its commit; its routing, plans in flight and metrics loaded; registered in the process."""
        self.config = check_config(self.config, state.manifest, state.fingerprint,
                                   str(state.path))
        state.lock()
        commit = state.read_commit()
        self.recover(state, commit)
        self.state = state
        self.commit = commit
        self.queue = PlanQueue(state.load_routing())
        self.queue.restore(commit.plans)
        self.metrics.extend(epoch_records(state.read_metrics(last=self.metrics.maxlen)))
        self.traces.extend(state.read_traces())  # the deque keeps the newest
        register(state.fingerprint.pipeline_id, self.owner)

    def create(self, key_type: str) -> None:
        """Create the state directory (and claim the checkpoint location) and open it."""
        fp = Fingerprint(self.config.pipeline_id or uuid.uuid4().hex[:16], self.config.num_bins,
                         key_type)
        if self.config.checkpoint is not None:
            claim_checkpoint(self.config.checkpoint, fp.pipeline_id)
        self.config = dataclasses.replace(self.config, key_type=key_type)
        self.open(StateDir.create(self.path, fp, self.config.workers,
                                  self.config.manifest_settings()))

    def rejoin(self) -> None:
        """Bring this pipeline forward from the checkpoint after its stream ran on a Spark
        Connect server (the epochs, routing, plans and metrics the server committed)."""
        with self.lock:
            assert self.config.checkpoint is not None
            self.restore(self.config.checkpoint, self.owner)
            self.metrics.clear()
            self.open(StateDir.open(self.path))

    def step_aside(self) -> None:
        """Let a Spark Connect server open the state: its stores released, its lock freed."""
        with self.lock:
            state = self.state_dir
            release_local_stores(state, self.local_dir)
            state.unlock()

    def close(self) -> None:
        """Flush the last metrics, release the stores and the lock, leave the registry."""
        if self.state is None:
            return
        self.flush_metrics()  # the last epoch's metrics, into the driver's durable copy
        release_local_stores(self.state, self.local_dir)
        self.state.unlock()
        unregister(self.state.fingerprint.pipeline_id, self.owner)

    def recover(self, state: StateDir, commit: Commit) -> None:
        """Bring ``state`` back to ``commit`` (:func:`check_and_recover`). Its stores may still be
        open in the store service (a crashed run's, or a failed epoch's): it closes them first,
        since recovery opens them here; the next epoch's tasks open them there again."""
        release_local_stores(state, self.local_dir)
        self.recovery = check_and_recover(state, commit)

    @property
    def local_dir(self) -> str:
        """The host-local directory of the store service."""
        assert self.config.local_dir is not None
        return self.config.local_dir

    # -- commits -------------------------------------------------------------------------

    def failed(self, last: int) -> None:
        """An epoch run that would have committed up to ``last`` failed: if it did not, its
        workers may have applied past the commit (rolled back by :meth:`undo_uncommitted` or
        a reopen) and its rerun is a new run, which must not replay their outputs."""
        if self.commit.epoch < last:
            self.uncommitted = True
            self.run_id = uuid.uuid4().hex

    def undo_uncommitted(self) -> None:
        """Roll back what a failed epoch left past the last commit (workers that applied it),
        as reopening would, so the state read reflects the commit. The routing in force stays:
        the next epoch runs the failed one again, routed alike."""
        with self.lock:
            if not self.uncommitted:
                return
            self.recover(self.state_dir, self.commit)
            self.routing.save(self.state_dir.paths.routing)  # recovery truncated it
            self.uncommitted = False

    def submit_plan(self, plan: MigrationPlan, policy: MigrationPolicy | None = None
                    ) -> MigrationHandle:
        """Queue ``plan`` from the next epoch on and make it durable in the commit record
        (between epochs); an empty plan is done at once, never queued."""
        with self.lock:
            handle = self.plans.submit(plan, self.commit.epoch + 1, policy)
            if not handle.done:  # an empty plan is done already: nothing to make durable
                self.commit.plans = self.plans.to_list()
                self.state_dir.write_commit(self.commit)
        return handle

    def recorded(self, records: list[EpochMetrics], trace: EpochTrace | None) -> None:
        """Keep committed epochs' metrics ``records`` on disk and here, and their epoch's
        ``trace`` here (for policies: ``None`` for a group's). A crash before it loses these
        metrics lines only."""
        for record in records:
            self.state_dir.append_metrics(record.to_dict())
            self.metrics.append(record)
        if trace is not None:
            self.traces.append(trace)

    def flush_metrics(self) -> None:
        """Write the commit record again if the driver's durable copy has metrics pending."""
        with self.lock:
            durable = self.state_dir.durable
            if durable is not None and durable.pending_metrics:
                self.state_dir.write_commit(self.commit)

    # -- reading state -------------------------------------------------------------------

    def durable_read(self) -> DurableRead:
        """How a task reads the committed working copies with a checkpoint location."""
        assert self.config.checkpoint is not None
        return DurableRead.at(self.state_dir, self.commit, self.local_dir, self.run_id)

    def bin_sizes(self, owners: np.ndarray | None = None) -> BinSizes:
        """As :meth:`Pipeline.bin_sizes <megaphone.Pipeline.bin_sizes>`. The workers' statistics
        are read once per committed epoch: a plan made between two epochs and its policy's
        first decision share one read (reading them again opened every store and took 0.4 s of
        the billion-key move's first epoch; docs/transfer.md, "A plan's first move")."""
        owners = self.routing.owners() if owners is None else owners
        epoch = self.epoch
        if self._bin_stats is None or self._bin_stats[0] != epoch:
            if self.config.checkpoint is None:
                stats: Any = worker_bin_stats(self.state_dir)
            else:
                with self.lock:  # nothing committed yet: every bin is empty
                    stats = {} if epoch < 0 else read_bin_stats(
                        self.spark, self.durable_read(), self.routing.owners(epoch))
            self._bin_stats = (epoch, stats)
        return BinSizes.at(self._bin_stats[1], owners)


__all__ = ["POLICY_HISTORY", "StateHolder"]
