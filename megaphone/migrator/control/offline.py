"""Offline migration: apply a plan to the state directory of a stopped pipeline (the CLI's path
and the pause-and-restart baseline).

Each step is an epoch without records run in this process through the live epoch's layout and
task code (:mod:`megaphone.migrator.task.local_epoch`), its commit record the step's commit
point; a last such epoch drops what left the old owners and releases idle workers
(docs/worker-store.md, "The design"). A crash leaves, and recovery discards, what a crashed
live epoch would.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
import uuid
from collections.abc import Callable

import pyarrow as pa

from megaphone.migrator.epoch.routing_operator import (
    commit_record,
    epoch_layout,
    epoch_spec,
)
from megaphone.migrator.epoch.state_reader import release_local_stores
from megaphone.migrator.statedir.commit import Commit
from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.statedir.recovery import check_and_recover
from megaphone.migrator.task.local_epoch import run_epoch_tasks
from megaphone.migrator.task.spec import shuffle_schema
from megaphone.migrator.task.updates import make_update
from megaphone.plans.handle import MigrationHandle
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.plans.policy import plan_policy
from megaphone.routing.keys import KEY_ARROW_TYPES
from megaphone.routing.table import RoutingTable
from megaphone.state_backends import DEFAULT_CHUNK_BYTES
from megaphone.state_backends.remote import default_local_dir

#: The update an epoch without records carries: it never runs.
_NO_RECORDS = make_update("count", None)


def migrate_offline(
    state_dir: str,
    plan: MigrationPlan,
    on_step: Callable[[int, int], None] | None = None,
) -> MigrationHandle:
    """Apply ``plan`` to a stopped pipeline's ``state_dir``, committing step by step.

    The plan is validated first: a bad plan raises ``PlanError`` and nothing changes. An
    empty plan (nothing to move) runs no epoch: its handle is done at once.
    ``on_step(step_index, bytes_moved)`` is called after each committed step (progress bars).
    """
    state = StateDir.open(state_dir)
    state.lock()
    local_dir = default_local_dir()
    release_local_stores(state, local_dir)  # a crashed pipeline's, if still open
    try:
        commit = state.read_commit()
        check_and_recover(state, commit)  # a crashed run's leftovers are discarded first
        table = state.load_routing()
        check_offline_plan(state, commit, table, plan)
        handle = MigrationHandle(plan)  # each step reported once committed
        if not plan.empty:  # an empty plan runs no epoch: the state stays as it is
            run = functools.partial(_run_epoch, state, table, local_dir, uuid.uuid4().hex)
            for i, step in enumerate(plan.steps):
                table.apply_step(step.moves, commit.epoch + 1)
                table.save(state.paths.routing)  # before the epoch, as a live epoch's admit does
                commit, moved = run(commit)
                handle.step_committed(commit.epoch, len(step.moves), moved)
                if on_step is not None:
                    on_step(i, moved)
            live = set(table.workers())
            if commit.pending_drops or (state.manifest.get("checkpoint") is None
                                        and any(w not in live for w in state.worker_ids())):
                commit, _ = run(commit)  # drops what left the old owners, releases the idle
        return handle
    finally:
        release_local_stores(state, local_dir)  # left closed, as a stopped pipeline's
        state.unlock()


def check_offline_plan(state: StateDir, commit: Commit, table: RoutingTable,
                       plan: MigrationPlan) -> None:
    """Raise ``PlanError`` unless ``plan`` can be applied offline to ``state`` at ``commit``
    (routing ``table``): no plan of a running pipeline in flight, every routing version
    applied to the state, and the plan (and its policy's spec) valid from the next epoch on."""
    if commit.plans:
        raise PlanError(
            f"{state.path} has a plan in flight from a running pipeline; open the pipeline to "
            "finish it first"
        )
    if commit.state_version != table.version:
        raise PlanError(
            f"{state.path} has routing versions not applied to its state yet "
            f"({commit.state_version} < {table.version}); open the pipeline to finish them"
        )
    plan.validate(table, commit.epoch + 1)
    plan_policy(plan)  # the policy does not run offline, but its spec must be valid


def _run_epoch(state: StateDir, table: RoutingTable, local_dir: str, run_id: str,
               commit: Commit) -> tuple[Commit, int]:
    """Run the epoch without records after ``commit`` on the locked ``state`` and commit it;
    return its commit and bytes moved."""
    layout = epoch_layout(table, commit, commit.epoch + 1, state)
    key = KEY_ARROW_TYPES[state.fingerprint.key_type]
    spec = epoch_spec(state, layout, commit, table, update=_NO_RECORDS,
                      output_schema=pa.schema([("key", key)]), chunk_bytes=DEFAULT_CHUNK_BYTES,
                      shuffle_schema=shuffle_schema(key, None, False), local_dir=local_dir,
                      run_id=run_id)
    with tempfile.TemporaryDirectory(prefix="megaphone-offline-") as spill:
        reports = run_epoch_tasks(spec, layout.partitions, spill)
    stream = commit.stream  # the last batch stays mapped to the epoch that ran it (a replay)
    if stream.batch_id is not None and stream.epoch is None:
        stream = dataclasses.replace(stream, epoch=commit.epoch)
    done = commit_record(layout, stream, [],
                         {r.worker: r.metrics for r in reports if r.metrics.token}, commit)
    state.write_commit(done)  # the epoch's commit point
    return done, sum(r.metrics.bytes_out or 0 for r in reports)

