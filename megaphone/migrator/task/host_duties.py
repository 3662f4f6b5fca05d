"""What a task does for its host before its work: it checks once that the host sees the
pipeline's state (a misconfiguration fails loudly), and, with homes (docs/placement.md), asks
the host's store services to delete copies of workers that are at home elsewhere, so that the
cluster keeps one working copy per worker.
"""

from __future__ import annotations

import socket

from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.task.spec import EpochSpec
from megaphone.state_backends.durable import check_checkpoint
from megaphone.state_backends.host import host_id
from megaphone.state_backends.remote import prune_copies

#: ``(state_dir, pipeline_id)`` pairs this Python worker has found on its host.
_SEEN_STATE_DIRS: set[tuple[str, str]] = set()


def check_state_dir(spec: EpochSpec) -> None:
    """Fail loudly unless this host sees the pipeline's state directory (its manifest, with the
    pipeline's id): an executor that cannot see it would otherwise create state of its own
    under the same path, and outputs would be quietly wrong."""
    if spec.pipeline_id is None or (spec.state_dir, spec.pipeline_id) in _SEEN_STATE_DIRS:
        return
    host = socket.gethostname()
    if spec.checkpoint is not None:  # executors need only the checkpoint location
        try:
            check_checkpoint(spec.checkpoint, spec.pipeline_id)
        except ValueError as exc:
            raise RuntimeError(f"on host {host}: {exc}") from None
    else:
        try:
            found = StateDir.open(spec.state_dir).fingerprint.pipeline_id
        except (ValueError, KeyError) as exc:  # NotAStateDir, or a manifest without fingerprint
            raise RuntimeError(
                f"the state directory {spec.state_dir} is not readable on host {host} ({exc}). "
                "Worker state lives under it, so every executor must reach it: on a cluster put "
                "it on storage all executors mount (README: State directory)") from None
        if found != spec.pipeline_id:
            raise RuntimeError(
                f"the state directory {spec.state_dir} on host {host} belongs to pipeline "
                f"{found!r}, not {spec.pipeline_id!r}: this executor sees another directory "
                "under the same path")
    _SEEN_STATE_DIRS.add((spec.state_dir, spec.pipeline_id))


#: Per pipeline, the ``(run, epoch)`` this Python worker last pruned its host's copies at.
_PRUNED: dict[str, tuple[str, int]] = {}


def prune_away_copies(spec: EpochSpec) -> list[int]:
    """Once per Python worker and epoch: delete this host's copies of the workers whose home
    is another host (:func:`~megaphone.state_backends.remote.prune_copies`); those deleted."""
    pipeline = spec.pipeline_id or ""
    if not spec.homes or _PRUNED.get(pipeline) == (spec.run_id, spec.epoch):
        return []
    _PRUNED[pipeline] = (spec.run_id, spec.epoch)
    here = host_id(spec.local_dir)
    return prune_copies(spec.local_dir, pipeline,
                        sorted(w for w, (home, _) in spec.homes.items() if home != here))
