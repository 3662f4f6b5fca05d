"""How a :class:`~megaphone.migrator.pipeline.Pipeline` holds its state directory: opens it
(checked against the configuration, locked, brought back to its commit, registered in the
process), creates it, and releases the stores the store service keeps open for it.
"""

from __future__ import annotations

import collections
import threading
import uuid
from pathlib import Path
from typing import Any

from megaphone.migrator.commit import Commit
from megaphone.migrator.config import check_config, check_restore
from megaphone.migrator.plan_queue import PlanQueue
from megaphone.migrator.planning import epoch_records
from megaphone.migrator.recovery import RecoveryReport, check_and_recover
from megaphone.migrator.registry import register
from megaphone.migrator.statedir import StateDir
from megaphone.paths import local_stores_path
from megaphone.records import EpochMetrics
from megaphone.routing.fingerprint import Fingerprint
from megaphone.snailtrail import EpochTrace
from megaphone.state_backends.durable import claim_checkpoint
from megaphone.state_backends.remote import release_stores


class StateDirOwner:
    """The owner of a pipeline's state directory: a base of
    :class:`~megaphone.migrator.pipeline.Pipeline`, which holds the attributes declared here
    (and ``state_dir``, the directory once open)."""

    local_dir: str
    recovery: RecoveryReport
    _settings: dict[str, Any]
    _num_bins: int
    _workers: int
    _pipeline_id: str | None
    _key_type: str | None
    _path: Path
    _lock: threading.RLock
    _metrics: collections.deque[EpochMetrics]
    _traces: collections.deque[EpochTrace]
    _state: StateDir | None
    _queue: PlanQueue | None
    _commit: Commit

    def _check_restore(self, m: dict[str, Any], uri: str,
                       owner: StateDirOwner | None = None) -> None:
        """Refuse to restore from the driver's copy at ``uri`` for another configuration, or
        for a pipeline already open in this process (but ``owner``)."""
        check_restore(self._settings, m, uri, num_bins=self._num_bins,
                      pipeline_id=self._pipeline_id, key_type=self._key_type, owner=owner)

    def _open(self, state: StateDir) -> None:
        """Take ``state`` as the pipeline's: its configuration checked, locked, brought back to
        its commit; its routing, plans in flight and metrics loaded; registered in the process."""
        fp = state.fingerprint
        check_config(self._settings, state.manifest, fp, str(state.path),
                     num_bins=self._num_bins, pipeline_id=self._pipeline_id,
                     key_type=self._key_type)
        state.lock()
        commit = state.read_commit()
        self._recover(state, commit)
        self._state = state
        self._key_type = fp.key_type
        self._pipeline_id = fp.pipeline_id
        self._commit = commit
        self._queue = PlanQueue(state.load_routing())
        self._queue.restore(self._commit.plans)
        self._metrics.extend(epoch_records(state.read_metrics(last=self._metrics.maxlen)))
        self._traces.extend(state.traces.read())  # the deque keeps the newest
        register(fp.pipeline_id, self)

    def _create(self, key_type: str) -> None:
        """Create the state directory (and claim the checkpoint location) and open it."""
        fp = Fingerprint(self._pipeline_id or uuid.uuid4().hex[:16], self._num_bins, key_type)
        if self._settings["checkpoint"] is not None:
            claim_checkpoint(self._settings["checkpoint"], fp.pipeline_id)
        self._open(StateDir.create(self._path, fp, self._workers, self._settings))

    def _recover(self, state: StateDir, commit: Commit) -> None:
        """Bring ``state`` back to ``commit`` (:func:`check_and_recover`). Its stores may still be
        open in the store service (a crashed run's, or a failed epoch's): it closes them first,
        since recovery opens them here; the next epoch's tasks open them there again."""
        self._release_stores(state)
        self.recovery = check_and_recover(state, commit)

    def _release_stores(self, state: StateDir) -> None:
        """Close ``state``'s stores in this host's store service (working copies under the
        state directory, or this host's under ``local_dir`` with a checkpoint location)."""
        release_stores(self.local_dir, str(state.path))
        if self._settings["checkpoint"] is not None:
            release_stores(self.local_dir, str(
                local_stores_path(self.local_dir, state.fingerprint.pipeline_id)))

    def _flush_metrics(self) -> None:
        """Write the commit record again if the driver's durable copy has metrics pending."""
        with self._lock:
            durable = self.state_dir.durable
            if durable is not None and durable.has_pending_metrics:
                self.state_dir.write_commit(self._commit)
