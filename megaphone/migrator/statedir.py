"""The state directory: where a pipeline keeps its manifest, routing, commits, metrics and state.

Layout::

    STATE_DIR/
      megaphone.json     manifest: fingerprint, backend, update and columns (written once)
      routing.json       the routing table (atomic rewrite on every change)
      commit.json        last committed epoch, state version, pending drops, plans in flight
      metrics.jsonl      one JSON line per committed epoch
      workers/w00007/    one state backend per worker
      outputs/e<N>.arrow each epoch's outputs (Arrow IPC file), the last few kept
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from megaphone._io import atomic_write_bytes, atomic_write_json, read_json
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import RoutingTable

MANIFEST_FORMAT = "megaphone.statedir/1"


class NotAStateDir(ValueError):
    """Raised when a path is not (or not a readable) megaphone state directory."""


class StateDirLocked(ValueError):
    """Raised when another process (or pipeline) already has the state directory open."""


@dataclass
class Commit:
    """What the last committed epoch left behind; rewritten atomically after every epoch.

    ``state_version`` is the routing version the workers' state reflects; ``pending_drops``
    are ``[bin, worker]`` pairs that moved away in that epoch, which the old owners delete in
    the next epoch (so a re-run of the epoch can still export them); ``stream`` remembers the
    last Structured Streaming batch id; ``plans`` are submitted plans not finished yet;
    ``tokens`` name, per worker, the attempt at the epoch whose results the driver took (a
    worker's copy of the epoch from any other attempt, on any host, is not this commit's state).
    """

    epoch: int = -1
    state_version: int = 0
    pending_drops: list[list[int]] = field(default_factory=list)
    stream: dict[str, Any] = field(default_factory=dict)
    plans: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any) -> Commit:
        """Parse commit.json; unknown or mistyped fields are a clear ``ValueError``."""
        if not isinstance(data, dict) or not set(data) <= set(cls.__dataclass_fields__):
            raise ValueError(f"commit.json is malformed: {data!r:.200}")
        commit = cls(**data)
        if not isinstance(commit.epoch, int) or not isinstance(commit.state_version, int):
            raise ValueError("commit.json is malformed: epoch and state_version must be integers")
        if not isinstance(commit.tokens, dict) or not all(
                isinstance(w, str) and w.isdigit() and isinstance(t, str)
                for w, t in commit.tokens.items()):
            raise ValueError("commit.json is malformed: tokens must map workers to strings")
        return commit

    def worker_tokens(self) -> dict[int, str]:
        """``tokens`` by worker number."""
        return {int(w): t for w, t in self.tokens.items()}


class StateDir:
    """A pipeline's state directory: paths, manifest checks and metadata reads and writes."""

    def __init__(self, path: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
        self.path = Path(path)
        self.manifest = manifest
        self.fingerprint = Fingerprint.from_dict(manifest["fingerprint"])
        self._lock_file: Any = None

    def lock(self) -> StateDir:
        """Take the directory's exclusive lock for this object's lifetime (or :meth:`unlock`).

        A second process, or a second pipeline in this one, is refused with
        :class:`StateDirLocked`; the operating system releases the lock if the process dies.
        """
        if self._lock_file is not None:
            return self
        fh = open(self.path / ".lock", "a")  # noqa: SIM115 - held open while locked
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise StateDirLocked(
                f"state directory {self.path} is in use by another pipeline or process; "
                "stop it first"
            ) from None
        self._lock_file = fh
        return self

    def unlock(self) -> None:
        """Release the lock taken by :meth:`lock`."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    # -- opening -------------------------------------------------------------------------

    @staticmethod
    def exists(path: str | os.PathLike[str]) -> bool:
        """True if ``path`` holds a megaphone manifest."""
        return (Path(path) / "megaphone.json").is_file()

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
        (root / "workers").mkdir(parents=True, exist_ok=True)
        (root / ".lock").touch()
        manifest = {
            "format": MANIFEST_FORMAT,
            "fingerprint": fingerprint.to_dict(),
            "initial_workers": workers,
            **settings,
        }
        state = cls(root, manifest)
        RoutingTable.initial(fingerprint, workers).save(state.routing_path)
        state.write_commit(Commit())
        atomic_write_json(root / "megaphone.json", manifest)  # written last: the dir is ready
        return state

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> StateDir:
        """Open an existing state directory; anything else is a :class:`NotAStateDir`."""
        root = Path(path)
        if not root.is_dir():
            raise NotAStateDir(f"not a megaphone state directory: {root} does not exist")
        if not cls.exists(root):
            raise NotAStateDir(f"not a megaphone state directory: {root} has no megaphone.json")
        try:
            manifest = read_json(root / "megaphone.json", "state directory manifest")
            if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"manifest format is not {MANIFEST_FORMAT}")
            return cls(root, manifest)
        except ValueError as exc:
            raise NotAStateDir(f"{root}: {exc}") from None

    def set_manifest(self, name: str, value: Any) -> None:
        """Record a setting learned after creation (e.g. the value type), atomically."""
        self.manifest[name] = value
        atomic_write_json(self.path / "megaphone.json", self.manifest)

    # -- paths ---------------------------------------------------------------------------

    @property
    def routing_path(self) -> Path:
        """Where the routing table lives."""
        return self.path / "routing.json"

    @property
    def metrics_path(self) -> Path:
        """The JSON-lines file of per-epoch metrics."""
        return self.path / "metrics.jsonl"

    def worker_path(self, worker: int) -> Path:
        """The state backend directory of ``worker``."""
        return self.path / "workers" / f"w{worker:05d}"

    def worker_ids(self) -> list[int]:
        """Workers that currently have a state directory."""
        out = []
        for child in (self.path / "workers").glob("w*"):
            if child.name[1:].isdigit():
                out.append(int(child.name[1:]))
        return sorted(out)

    def outputs_path(self, epoch: int) -> Path:
        """The file that keeps the outputs of ``epoch`` (for a stream's replay)."""
        return self.path / "outputs" / f"e{epoch:09d}.arrow"

    def output_epochs(self) -> list[int]:
        """The epochs whose outputs are kept, in order."""
        root = self.path / "outputs"
        names = (p.name.removesuffix(".arrow")[1:] for p in root.glob("e*.arrow")) \
            if root.is_dir() else ()
        return sorted(int(n) for n in names if n.isdigit())

    def write_outputs(self, epoch: int, outputs: pa.Table) -> None:
        """Keep the outputs of ``epoch``, atomically and durably (before its commit point)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, outputs.schema) as writer:
            writer.write_table(outputs)
        self.outputs_path(epoch).parent.mkdir(exist_ok=True)
        atomic_write_bytes(self.outputs_path(epoch), sink.getvalue().to_pybytes())

    def read_outputs(self, epoch: int) -> pa.Table:
        """The kept outputs of ``epoch``; a ``ValueError`` when they are gone or unreadable."""
        path = self.outputs_path(epoch)
        try:
            with pa.memory_map(str(path)) as source:
                return pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            raise ValueError(f"outputs of epoch {epoch} are no longer kept ({path})") from None
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"outputs of epoch {epoch} at {path} are corrupt: {exc}") from None

    def drop_outputs(self, epochs: list[int]) -> None:
        """Delete the kept outputs of ``epochs``."""
        for epoch in epochs:
            self.outputs_path(epoch).unlink(missing_ok=True)

    # -- metadata ------------------------------------------------------------------------

    def load_routing(self) -> RoutingTable:
        """The routing table, checked against this directory's fingerprint."""
        return RoutingTable.load(self.routing_path, self.fingerprint)

    def read_commit(self) -> Commit:
        """The last commit record."""
        return Commit.from_dict(read_json(self.path / "commit.json", "commit record"))

    def write_commit(self, commit: Commit, after: Callable[[], Any] | None = None) -> None:
        """Atomically replace the commit record: the commit point of an epoch (fsynced).

        ``after`` (if given) is what must be durable before the commit point; it is called
        once the record's own bytes are synced, just before the rename, so both are written
        at the same time. If it raises, nothing is committed.
        """
        from megaphone.migrator.faults import crash_point

        def before_rename() -> None:
            if after is not None:
                after()
            crash_point("commit", commit.epoch)

        atomic_write_json(self.path / "commit.json", asdict(commit), before_rename)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one epoch's metrics as a JSON line."""
        with open(self.metrics_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    def read_metrics(self, last: int | None = None) -> list[dict[str, Any]]:
        """The recorded per-epoch metrics (the ``last`` N when given); torn lines are skipped."""
        if not self.metrics_path.exists():
            return []
        records = []
        with open(self.metrics_path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return records[-last:] if last else records

    def prune_outputs(self, keep_from_epoch: int) -> None:
        """Delete outputs of epochs before ``keep_from_epoch``."""
        self.drop_outputs([e for e in self.output_epochs() if e < keep_from_epoch])
