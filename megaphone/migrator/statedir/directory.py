"""The state directory: a pipeline's manifest, routing, commits, metrics, traces, kept outputs
and (without a checkpoint location) its workers' state; layout: README, "State directory".
With a checkpoint location all but ``workers/`` is also kept there, written first
(:mod:`megaphone.migrator.statedir.driver_copy`).
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa

from megaphone._io import (
    ChunkedLog,
    atomic_write_bytes,
    atomic_write_json,
    create_once,
    read_json,
)
from megaphone.errors import MegaphoneError
from megaphone.migrator.statedir.commit import Commit
from megaphone.migrator.statedir.driver_copy import DriverCopy, DriverCopyError
from megaphone.paths import MANIFEST, OUTPUTS, ROUTING, StateDirPaths, outputs_epoch_of, worker_of
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import RoutingTable
from megaphone.snailtrail import EpochTrace
from megaphone.state_backends.network import new_secret

MANIFEST_FORMAT = "megaphone.statedir/1"
#: Writes an epoch's outputs file while the driver writes its commit record.
_WRITER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="megaphone-outputs")


class NotAStateDir(MegaphoneError, ValueError):
    """Raised when a path is not (or not a readable) megaphone state directory."""


class StateDirLocked(MegaphoneError, ValueError):
    """Raised when another process (or pipeline) already has the state directory open."""


class StateMismatch(MegaphoneError, ValueError):
    """The state directory does not match its commit record (not something a crash leaves)."""


def committed_routing(table: RoutingTable, state_version: int, where: object) -> RoutingTable:
    """``table`` (saved at ``where``) as of the commit whose state is at ``state_version``.

    Versions past the commit are what a crash left behind, discarded when the pipeline next
    opens the directory, so they are cut off here; a table *behind* the commit is damage, a
    :class:`StateMismatch`.
    """
    if table.version < state_version:
        raise StateMismatch(f"{where} holds routing version {table.version}, but the last "
                            f"commit says the state is at version {state_version}")
    return table.truncated(state_version) if table.version > state_version else table


#: Epochs per metrics (and traces) file; the state directory keeps the current file and the one
#: before.
METRICS_CHUNK = TRACE_CHUNK = 250


class StateDir:
    """A pipeline's state directory: paths, manifest checks and metadata reads and writes."""

    def __init__(self, path: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
        self.path = Path(path)
        self.paths = StateDirPaths(self.path)
        self.manifest = manifest
        self.fingerprint = Fingerprint.from_dict(manifest["fingerprint"])
        self._lock_file: Any = None
        self._secret: str | None = None
        self._metrics_log = ChunkedLog(self.paths.metrics, self.paths.metrics_old,
                                       METRICS_CHUNK)
        self._trace_log = ChunkedLog(self.paths.traces, self.paths.traces_old, TRACE_CHUNK)

    @cached_property
    def durable(self) -> DriverCopy | None:
        """The driver's durable copy under the checkpoint location (``None`` without one)."""
        uri = self.manifest.get("checkpoint")
        return DriverCopy(uri) if uri else None

    def secret(self) -> str:
        """The pipeline's secret (hex), made at its first use and kept readable by its user
        only: what its tasks prove to other hosts' store services. Never in a log or record. Read
        once per object: every epoch of a checkpointed pipeline hands it on."""
        if self._secret is None:
            self._secret = create_once(self.paths.secret, new_secret)
        return self._secret

    def lock(self) -> StateDir:
        """Take the directory's exclusive lock for this object's lifetime (or :meth:`unlock`).

        A second process, or a second pipeline in this one, is refused with
        :class:`StateDirLocked`; the operating system releases the lock if the process dies.
        """
        if self._lock_file is not None:
            return self
        fh = open(self.paths.lock, "a")  # noqa: SIM115 - held open while locked
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise StateDirLocked(
                f"state directory {self.path} is in use by another pipeline or process; "
                "stop it first"
            ) from None
        self._lock_file = fh
        self._remove_torn_writes()
        return self

    def _remove_torn_writes(self) -> None:
        """Delete the ``.*.tmp`` files of atomic writes a killed lock holder left half done;
        only the lock holder writes them, so none is in progress now."""
        for directory in (self.path, self.paths.outputs):
            for tmp in directory.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)

    @property
    def locked(self) -> bool:
        """True while this object holds the directory's lock (:meth:`lock`)."""
        return self._lock_file is not None

    def unlock(self) -> None:
        """Release the lock taken by :meth:`lock`."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    # -- opening -------------------------------------------------------------------------

    @staticmethod
    def exists(path: str | os.PathLike[str]) -> bool:
        """True if ``path`` holds a megaphone manifest."""
        return StateDirPaths(path).manifest.is_file()

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        fingerprint: Fingerprint,
        workers: int,
        settings: dict[str, Any],
    ) -> StateDir:
        """Create a new state directory with version 0 routing over ``workers`` workers."""
        root = Path(path)
        if cls.exists(root):
            raise ValueError(f"{root} already holds a megaphone state directory")
        paths = StateDirPaths(root)
        paths.workers.mkdir(parents=True, exist_ok=True)
        paths.lock.touch()
        manifest = {
            "format": MANIFEST_FORMAT,
            "fingerprint": fingerprint.to_dict(),
            "initial_workers": workers,
            **settings,
        }
        state = cls(root, manifest)
        if state.durable is not None:
            state.durable.write_manifest(manifest)
        RoutingTable.initial(fingerprint, workers).save(state.paths.routing)
        state.write_commit(Commit())
        atomic_write_json(paths.manifest, manifest)  # written last: the dir is ready
        return state

    @classmethod
    def restore(cls, path: str | os.PathLike[str], copy: DriverCopy,
                check: Callable[[dict[str, Any]], None]) -> bool:
        """Bring the state directory at ``path`` to the last commit point of ``copy`` (a
        checkpoint's driver copy) if it is missing or behind; True if anything changed.

        ``check(manifest)`` sees the kept manifest first and may raise: a checkpoint of another
        pipeline or configuration changes nothing. A missing directory is built aside and
        renamed into place; one behind gets the outputs and metrics it lacks, then the commit
        record. A directory ahead of the copy is refused (the copy is always written first).
        """
        root = Path(path)
        local = cls.open(root) if cls.exists(root) else None
        manifest = copy.manifest()
        if manifest is None:
            return False
        check(manifest)
        commit = Commit.from_dict(copy.latest_commit())
        if local is not None:
            try:
                at = local.read_commit().seq
            except ValueError:  # not synced here: a power loss can leave it torn
                at = -1
            if at > commit.seq:
                raise DriverCopyError(
                    f"{root} is at commit {at}, past the copy in its checkpoint {copy.uri} (at "
                    f"{commit.seq}): that checkpoint is not this state directory's")
            if at == commit.seq:
                return False
        kept = [e for e in copy.output_epochs() if e <= commit.epoch]
        metrics = copy.metrics()
        if local is None:
            root.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.restoring-", dir=root.parent))
            try:
                state = cls(staging, manifest)
                state.paths.workers.mkdir()
                state.paths.lock.touch()
                state._restore_files(copy, kept, metrics)
                state.write_commit(commit, durable=False)
                atomic_write_json(state.paths.manifest, manifest)
                os.rename(staging, root)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            return True
        last = max((int(m["epoch"]) for m in local.read_metrics()), default=-1)
        local._restore_files(copy, [e for e in kept if e not in local.output_epochs()],
                             [m for m in metrics if int(m.get("epoch", -1)) > last])
        local.write_commit(commit, durable=False)  # last: the directory is at the commit now
        return True

    def _restore_files(self, copy: DriverCopy, outputs: list[int],
                       metrics: list[dict[str, Any]]) -> None:
        self.paths.outputs.mkdir(exist_ok=True)
        for epoch in outputs:
            path = self.paths.outputs_file(epoch)
            atomic_write_bytes(path, copy.read(OUTPUTS, path.name))
        atomic_write_bytes(self.paths.routing, copy.read(ROUTING))
        with open(self.paths.metrics, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(m, separators=(",", ":")) + "\n" for m in metrics)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> StateDir:
        """Open an existing state directory; anything else is a :class:`NotAStateDir`."""
        root = Path(path)
        if not root.is_dir():
            raise NotAStateDir(f"not a megaphone state directory: {root} does not exist")
        if not cls.exists(root):
            raise NotAStateDir(f"not a megaphone state directory: {root} has no {MANIFEST}")
        try:
            manifest = read_json(StateDirPaths(root).manifest, "state directory manifest")
            if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"manifest format is not {MANIFEST_FORMAT}")
            return cls(root, manifest)
        except ValueError as exc:
            raise NotAStateDir(f"{root}: {exc}") from None

    def set_manifest(self, name: str, value: Any) -> None:
        """Record a setting learned after creation (e.g. the value type), atomically."""
        self.manifest[name] = value
        if self.durable is not None:
            self.durable.write_manifest(self.manifest)
        atomic_write_json(self.paths.manifest, self.manifest)

    # -- paths ---------------------------------------------------------------------------

    def worker_ids(self) -> list[int]:
        """Workers that currently have a state directory."""
        found = (worker_of(child.name) for child in self.paths.workers.glob("w*"))
        return sorted(w for w in found if w is not None)

    def output_epochs(self) -> list[int]:
        """The epochs whose outputs are kept, in order."""
        root = self.paths.outputs
        found = (outputs_epoch_of(p.name) for p in root.iterdir()) if root.is_dir() else ()
        return sorted(e for e in found if e is not None)

    def write_outputs(self, epoch: int, outputs: pa.Table) -> None:
        """Keep the outputs of ``epoch``, atomically and durably (before its commit point)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, outputs.schema) as writer:
            writer.write_table(outputs)
        data, path = sink.getvalue().to_pybytes(), self.paths.outputs_file(epoch)
        if self.durable is not None:
            self.durable.put(data, OUTPUTS, path.name)
        self.paths.outputs.mkdir(exist_ok=True)
        # With a driver's copy, that one is durable: this one need not be synced too.
        atomic_write_bytes(path, data, sync=self.durable is None)

    def read_outputs(self, epoch: int) -> pa.Table:
        """The kept outputs of ``epoch``; a ``ValueError`` when they are gone or unreadable."""
        path = self.paths.outputs_file(epoch)
        try:
            with pa.memory_map(str(path)) as source:
                return pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            raise ValueError(f"outputs of epoch {epoch} are no longer kept ({path})") from None
        except (OSError, pa.ArrowInvalid) as exc:
            if self.durable is not None and epoch in self.durable.output_epochs():
                # not synced here (a power loss can leave it torn): the driver's copy is
                return pa.ipc.open_file(pa.BufferReader(
                    self.durable.read(OUTPUTS, path.name))).read_all()
            raise ValueError(f"outputs of epoch {epoch} at {path} are corrupt: {exc}") from None

    def drop_outputs(self, epochs: list[int]) -> None:
        """Delete the kept outputs of ``epochs``."""
        for path in map(self.paths.outputs_file, epochs):
            path.unlink(missing_ok=True)
            if self.durable is not None:
                self.durable.delete(OUTPUTS, path.name)

    # -- metadata ------------------------------------------------------------------------

    def load_routing(self) -> RoutingTable:
        """The routing table, checked against this directory's fingerprint."""
        return RoutingTable.load(self.paths.routing, self.fingerprint)

    def routing_as_of(self, state_version: int) -> RoutingTable:
        """The routing table as of the commit whose state is at ``state_version``
        (:func:`committed_routing`: a crash's versions past it cut off)."""
        return committed_routing(self.load_routing(), state_version, self.paths.routing)

    def read_commit(self) -> Commit:
        """The last commit record."""
        return Commit.from_dict(read_json(self.paths.commit, "commit record"))

    def write_commit(self, commit: Commit, after: Callable[[], Any] | None = None, *,
                     durable: bool = True) -> None:
        """Atomically replace the commit record: the commit point of an epoch (fsynced).

        ``after`` (if given) is what must be durable before the commit point; it is called
        once the record's own bytes are synced, just before the rename, so both are written
        at the same time. If it raises, nothing is committed. With a checkpoint location the
        record (numbered: ``commit.seq`` is set here) is written there first, and that write is
        the commit point: a driver lost after it restarts from the checkpoint at this commit.
        """
        from megaphone.migrator.statedir.faults import crash_point

        if durable:
            commit.seq = self.read_commit().seq + 1 if self.paths.commit.exists() \
                else 1

        def before_rename() -> None:
            if after is not None:
                after()
            crash_point("commit", commit.epoch)
            if durable and self.durable is not None:
                self.durable.write_commit(commit.to_dict(), self.paths.routing)

        atomic_write_json(self.paths.commit, commit.to_dict(), before_rename,
                          sync=self.durable is None)  # with a driver's copy, that is synced

    def commit_epoch(self, commit: Commit, outputs: pa.Table) -> None:
        """Commit an epoch: its ``outputs`` kept (written while the commit record's bytes are
        synced: the two fsyncs overlap), then its commit record (:meth:`write_commit`)."""
        kept = _WRITER.submit(self.write_outputs, commit.epoch, outputs)
        try:
            self.write_commit(commit, after=kept.result)
        finally:
            concurrent.futures.wait([kept])

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one epoch's metrics as a JSON line. A full file (:data:`METRICS_CHUNK`
        lines) first replaces ``metrics.old.jsonl``: disk keeps one or two chunks of epochs."""
        self._metrics_log.append(json.dumps(record, separators=(",", ":")))
        if self.durable is not None:
            self.durable.pending_metrics.append(record)

    def read_metrics(self, last: int | None = None) -> list[dict[str, Any]]:
        """The recorded per-epoch metrics, oldest first (the ``last`` N when given): the
        :data:`METRICS_CHUNK` to twice that many newest epochs. Torn lines are skipped."""
        records = self._metrics_log.read(json.loads)
        return records[-last:] if last else records

    def append_trace(self, trace: EpochTrace) -> None:
        """Keep one epoch's SnailTrail trace (:mod:`~megaphone.migrator.trace`) as a JSON line,
        in chunks as the metrics (:data:`TRACE_CHUNK`)."""
        self._trace_log.append(trace.to_json())

    def read_traces(self) -> list[EpochTrace]:
        """The kept traces, oldest first; torn or malformed lines are skipped, and of an epoch
        kept twice (rolled back and run again) the last."""
        traces = {t.epoch: t for t in self._trace_log.read(EpochTrace.from_json)}
        return sorted(traces.values(), key=lambda t: t.epoch)
