"""Every path of megaphone's on-disk layout, in one place: the state directory, the
executor-local store dirs and the checkpoint location (the workers' and the driver's copies).

Imports nothing from megaphone, so every layer (state backends, the runtime, the CLI) can use it.
Local paths are :class:`~pathlib.Path`; checkpoint paths are ``/``-joined strings, as
``pyarrow.fs`` takes them.
"""

from __future__ import annotations

import os
from pathlib import Path

MANIFEST = "megaphone.json"
ROUTING = "routing.json"
COMMIT = "commit.json"
METRICS = "metrics.jsonl"
LOCK = ".lock"
WORKERS = "workers"
OUTPUTS = "outputs"
INBOX = "inbox"
#: The checkpoint location's folder of the driver's copy.
DRIVER = "driver"
#: The driver's copy's numbered commit records and folded metrics.
COMMITS = "commits"
FOLDED_METRICS = "metrics"
#: Under ``LOCAL_DIR``: the working copies of checkpointed pipelines' workers.
STORES = "stores"


def worker_name(worker: int) -> str:
    """The folder name of ``worker`` (``w00007``), wherever its state lives."""
    return f"w{worker:05d}"


def worker_of(name: str) -> int | None:
    """The worker a folder name from :func:`worker_name` names, ``None`` for any other name."""
    return int(name[1:]) if name[:1] == "w" and name[1:].isdigit() else None


def outputs_name(epoch: int) -> str:
    """The file name of ``epoch``'s kept outputs (``e000000007.arrow``)."""
    return f"e{epoch:09d}.arrow"


def outputs_epoch_of(name: str) -> int | None:
    """The epoch an outputs file name from :func:`outputs_name` names, ``None`` otherwise."""
    stem = name.removesuffix(".arrow")
    return int(stem[1:]) if stem != name and stem[:1] == "e" and stem[1:].isdigit() else None


def seq_name(seq: int, suffix: str) -> str:
    """The file name of the driver copy's record number ``seq`` (``s000000000012.json``)."""
    return f"s{seq:012d}{suffix}"


def seq_of(name: str, suffix: str) -> int | None:
    """The number a :func:`seq_name` file name carries, ``None`` for any other name."""
    stem = name.removesuffix(suffix)
    return int(stem[1:]) if stem != name and stem[:1] == "s" and stem[1:].isdigit() else None


class StateDirPaths:
    """The files and folders of a state directory rooted at ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def manifest(self) -> Path:
        """The manifest (fingerprint, backend, update, columns)."""
        return self.root / MANIFEST

    @property
    def routing(self) -> Path:
        """The routing table."""
        return self.root / ROUTING

    @property
    def commit(self) -> Path:
        """The last commit record."""
        return self.root / COMMIT

    @property
    def metrics(self) -> Path:
        """The JSON-lines file of per-epoch metrics."""
        return self.root / METRICS

    @property
    def lock(self) -> Path:
        """The file whose lock marks the directory in use."""
        return self.root / LOCK

    @property
    def workers(self) -> Path:
        """The folder of the workers' state backends (without a checkpoint location)."""
        return self.root / WORKERS

    def worker(self, worker: int) -> Path:
        """The state backend directory of ``worker``."""
        return self.workers / worker_name(worker)

    @property
    def outputs(self) -> Path:
        """The folder of the kept outputs."""
        return self.root / OUTPUTS

    def outputs_file(self, epoch: int) -> Path:
        """The file that keeps the outputs of ``epoch``."""
        return self.outputs / outputs_name(epoch)

    @property
    def inbox(self) -> Path:
        """The folder of plans handed over by another process."""
        return self.root / INBOX


def local_worker_path(local_dir: str | os.PathLike[str], pipeline_id: str, worker: int) -> Path:
    """Where a host keeps its working copy of a checkpointed pipeline's worker."""
    return local_stores_path(local_dir, pipeline_id) / worker_name(worker)


def local_stores_path(local_dir: str | os.PathLike[str], pipeline_id: str) -> Path:
    """The folder of a host's working copies of one checkpointed pipeline's workers."""
    return Path(local_dir) / STORES / pipeline_id


def checkpoint_worker_root(root: str, worker: int) -> str:
    """The folder of ``worker``'s durable copy under the checkpoint location's path ``root``."""
    return f"{root.rstrip('/')}/{WORKERS}/{worker_name(worker)}"


def checkpoint_driver_root(root: str) -> str:
    """The folder of the driver's copy under the checkpoint location's path ``root``."""
    return f"{root.rstrip('/')}/{DRIVER}"
