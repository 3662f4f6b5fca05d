"""Offline migration: apply a plan to the state directory of a stopped pipeline.

This is the CLI's path and the pause-and-restart baseline: steps run one after another, each
moving its bins worker to worker in bounded chunks and committing before the next starts.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

from megaphone.migrator.plan_queue import MigrationHandle
from megaphone.migrator.recovery import check_and_recover
from megaphone.migrator.statedir import StateDir
from megaphone.plans.plan import MigrationPlan, PlanError
from megaphone.state_backends import DEFAULT_CHUNK_BYTES
from megaphone.state_backends.encoding import payload_bytes
from megaphone.state_backends.remote import default_local_dir, release_stores
from megaphone.state_backends.worker_store import WorkerStore


def migrate_offline(
    state_dir: str,
    plan: MigrationPlan,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    on_step: Callable[[int, int], None] | None = None,
) -> MigrationHandle:
    """Apply ``plan`` to a stopped pipeline's ``state_dir``, committing step by step.

    The plan is validated first: a bad plan raises ``PlanError`` and nothing changes.
    ``on_step(step_index, bytes_moved)`` is called after each committed step (progress bars).
    """
    state = StateDir.open(state_dir)
    if state.manifest.get("checkpoint") is not None:
        raise PlanError(f"{state_dir} keeps a durable copy at {state.manifest['checkpoint']}; "
                        "offline migration does not write it yet: migrate it live "
                        "(Pipeline.migrate) instead")
    state.lock()
    release_stores(default_local_dir(), str(state.path))  # a crashed pipeline's, if still open
    try:
        return _migrate_locked(state, plan, chunk_bytes, on_step)
    finally:
        state.unlock()


def _migrate_locked(
    state: StateDir,
    plan: MigrationPlan,
    chunk_bytes: int,
    on_step: Callable[[int, int], None] | None,
) -> MigrationHandle:
    commit = state.read_commit()
    check_and_recover(state, commit)  # a crashed run's leftovers are discarded first
    table = state.load_routing()
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
    kind, key_type, num_bins = state.manifest["backend"], table.fingerprint.key_type, \
        table.num_bins
    handle = MigrationHandle(plan)
    epoch = max(commit.epoch + 1, table.latest_epoch)

    def open_worker(worker: int, cache: dict[int, WorkerStore]) -> WorkerStore:
        if worker not in cache:
            cache[worker] = WorkerStore.open(kind, state.worker_path(worker), key_type, num_bins)
        return cache[worker]

    _drop(state, commit.pending_drops, open_worker)
    commit.pending_drops = []
    for i, step in enumerate(plan.steps):
        opened: dict[int, WorkerStore] = {}
        moved = 0
        try:
            for m in step.moves:
                src, dst = open_worker(m.src, opened), open_worker(m.dst, opened)
                dst.drop_bins([m.bin])
                for chunk in src.backend.export_bins([m.bin], chunk_bytes):
                    moved += payload_bytes(chunk)
                    dst.backend.import_chunk(chunk)
                dst.join(commit.epoch)  # a new worker joins at the commit
        finally:
            for store in opened.values():
                store.close()
        table.apply_step(step.moves, epoch)
        table.save(state.routing_path)
        commit.state_version = table.version
        commit.pending_drops = [[m.bin, m.src] for m in step.moves]
        state.write_commit(commit)  # the step's commit point: the new owners hold the bins
        _drop(state, commit.pending_drops, open_worker)
        commit.pending_drops = []
        state.write_commit(commit)
        handle._step_committed(epoch, len(step.moves), moved)
        if on_step is not None:
            on_step(i, moved)
    live = set(table.workers())
    for worker in state.worker_ids():
        if worker not in live:  # scale in: release the storage of workers left without bins
            shutil.rmtree(state.worker_path(worker))
    return handle


def _drop(state: StateDir, pending: list[list[int]], open_worker) -> None:
    by_worker: dict[int, list[int]] = {}
    for b, w in pending:
        by_worker.setdefault(w, []).append(b)
    opened: dict[int, WorkerStore] = {}
    try:
        for w, bins in by_worker.items():
            if state.worker_path(w).exists():
                open_worker(w, opened).drop_bins(bins)
    finally:
        for store in opened.values():
            store.close()
