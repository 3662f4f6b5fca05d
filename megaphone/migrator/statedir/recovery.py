"""Recovery: bring a state directory back to its last commit before it runs again.

What a crash left past ``commit.json`` is discarded: uncommitted routing versions, outputs and
worker state (rolled back with its undo record; with a checkpoint location, by the store
service of the host that runs the worker's next task). What no crash explains (a worker behind
the commit or missing, or two epochs ahead) is reported precisely, never repaired.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megaphone.migrator.statedir.commit import Commit
from megaphone.migrator.statedir.directory import StateDir, StateMismatch, committed_routing
from megaphone.state_backends.worker_store import WorkerStore


@dataclass
class RecoveryReport:
    """What recovery discarded: routing versions, rolled-back workers, epochs' outputs."""

    routing_versions_dropped: int = 0
    workers_rolled_back: list[int] = field(default_factory=list)
    outputs_dropped: list[int] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when nothing beyond the last commit had to be discarded."""
        return not (self.routing_versions_dropped or self.workers_rolled_back
                    or self.outputs_dropped)


def check_and_recover(state: StateDir, commit: Commit) -> RecoveryReport:
    """Verify ``state`` against ``commit``, then discard what a crash left after it.

    Every check runs (read-only) before anything is changed, so a directory that does not
    match its commit is reported and left exactly as it was.
    """
    table = state.load_routing()
    committed = committed_routing(table, commit.state_version, state.paths.routing)
    # With a checkpoint location the working copies live on the executors: each is checked
    # and brought to the commit by the store service of the host that runs its next task.
    ahead = [] if state.manifest.get("checkpoint") else _check_workers(state, commit, committed)
    report = RecoveryReport()
    if table.version > commit.state_version:
        report.routing_versions_dropped = table.version - commit.state_version
        committed.save(state.paths.routing)
    report.outputs_dropped = [e for e in state.output_epochs() if e > commit.epoch]
    state.drop_outputs(report.outputs_dropped)
    kind, fp = state.manifest["backend"], state.fingerprint
    for worker in ahead:
        with WorkerStore.open(kind, state.paths.worker(worker), fp.key_type, fp.num_bins) as store:
            store.rollback_to(commit.epoch)  # a group's epochs newest first (docs/groups.md)
        report.workers_rolled_back.append(worker)
    return report


def _check_workers(state: StateDir, commit: Commit, table) -> list[int]:
    """Check every worker against the commit; return those one epoch ahead (to roll back)."""
    live = set(table.workers(commit.epoch)) if commit.epoch >= 0 else set()
    present = set(state.worker_ids())
    missing = sorted(live - present)
    if missing:
        raise StateMismatch(
            f"worker directories missing for workers {missing} that own bins at committed "
            f"epoch {commit.epoch} (expected {[str(state.paths.worker(w)) for w in missing]})"
        )
    kind, fp = state.manifest["backend"], state.fingerprint
    ahead = []
    for worker in sorted(present):
        with WorkerStore.open(kind, state.paths.worker(worker), fp.key_type, fp.num_bins,
                              read_only=True) as store:
            at, back = store.epoch, store.can_roll_back_to(commit.epoch)
        if at > commit.epoch and back:  # one epoch, or several of a group, past the commit
            ahead.append(worker)
        elif at > commit.epoch:
            raise StateMismatch(
                f"worker {worker} state is at epoch {at}, past the last commit "
                f"({commit.epoch}) without undo records back to it; it belongs to another run"
            )
        elif at < commit.epoch and worker in live:
            raise StateMismatch(
                f"worker {worker} state is at epoch {at}, but the last commit is epoch "
                f"{commit.epoch}: the worker directory does not match the commit"
            )
    return ahead
