"""Every path of megaphone's on-disk layout, in one place: the state directory, the
executor-local dir (store service, working copies) and the checkpoint location (the workers'
and the driver's copies).

Imports nothing from megaphone, so every layer (state backends, the runtime, the CLI) can use it.
Local paths are :class:`~pathlib.Path` (the store service's socket and pid file are strings);
checkpoint paths are ``/``-joined strings, as ``pyarrow.fs`` takes them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MANIFEST = "megaphone.json"
ROUTING = "routing.json"
COMMIT = "commit.json"
METRICS = "metrics.jsonl"
#: The metrics file before the current one (see ``StateDir.append_metrics``).
METRICS_OLD = "metrics.old.jsonl"
#: The JSON-lines file of per-epoch SnailTrail traces, and the one before it (see
#: ``StateDir.append_trace``).
TRACES = "traces.jsonl"
TRACES_OLD = "traces.old.jsonl"
LOCK = ".lock"
#: Under the state directory: the pipeline's secret (mode 0600), which authenticates its tasks
#: to other hosts' store services (docs/placement.md).
SECRET = ".secret"
WORKERS = "workers"
OUTPUTS = "outputs"
INBOX = "inbox"
#: The checkpoint location's folder of the driver's copy.
DRIVER = "driver"
#: The driver's copy's numbered commit records and folded metrics, and their files' endings.
COMMITS = "commits"
FOLDED_METRICS = "metrics"
COMMIT_RECORD_SUFFIX = ".json"
FOLDED_METRICS_SUFFIX = ".jsonl"
#: Under ``LOCAL_DIR``: the working copies of checkpointed pipelines' workers.
STORES = "stores"
#: Under ``LOCAL_DIR``: the host's store service's socket, pid file, starters' lock and log.
STORE_SOCKET = "store.sock"
STORE_PID = "store-service.pid"
STORE_LOCK = "store-service.lock"
STORE_LOG = "store-service.log"
#: Under ``LOCAL_DIR``: the pipelines registered with the host's store services (mode 0600,
#: :mod:`megaphone.state_backends.network`).
REGISTRATIONS = "registrations"
#: Under ``LOCAL_DIR``: the host's id (:func:`megaphone.state_backends.host.host_id`).
HOST_ID = "host-id"
#: Under ``LOCAL_DIR``: the directories of the host's further store services (one per core).
SERVICE_PREFIX = "service-"
#: Under ``LOCAL_DIR``: the state directories of pipelines a Spark Connect server opens.
DRIVERS = "drivers"
#: Under the state directory: the checkpoint of ``Pipeline.start``'s query, if it names none.
STREAM_CHECKPOINT = "_stream_checkpoint"
#: The endings of a plan handed over through the inbox and of the status that answers it.
PLAN_SUFFIX = ".plan.json"
STATUS_SUFFIX = ".status.json"
#: A worker's durable copy: a changelog per epoch it applied, and now and then a snapshot.
CHANGELOG = "changelog"
SNAPSHOT = "snapshot"
#: At the checkpoint location's root: the record of the pipeline that owns the location.
CHECKPOINT_OWNER = "megaphone-checkpoint.json"


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


def durable_name(epoch: int) -> str:
    """The file name of a worker's changelog or snapshot of ``epoch`` (``e000000000007.arrow``)."""
    return f"e{epoch:012d}.arrow"


def durable_epoch_of(name: str) -> int | None:
    """The epoch a file name from :func:`durable_name` names, ``None`` for any other name."""
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
    def metrics_old(self) -> Path:
        """The metrics file before the current one (the older epochs kept)."""
        return self.root / METRICS_OLD

    @property
    def traces(self) -> Path:
        """The JSON-lines file of per-epoch SnailTrail traces (``megaphone explain``)."""
        return self.root / TRACES

    @property
    def traces_old(self) -> Path:
        """The traces file before the current one (the older epochs kept)."""
        return self.root / TRACES_OLD

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
    def secret(self) -> Path:
        """The pipeline's secret (:data:`SECRET`)."""
        return self.root / SECRET

    @property
    def inbox(self) -> Path:
        """The folder of plans handed over by another process."""
        return self.root / INBOX

    @property
    def stream_checkpoint(self) -> Path:
        """The checkpoint location of ``Pipeline.start``'s query when it is given none."""
        return self.root / STREAM_CHECKPOINT


def local_worker_path(local_dir: str | os.PathLike[str], pipeline_id: str, worker: int) -> Path:
    """Where a host keeps its working copy of a checkpointed pipeline's worker."""
    return local_stores_path(local_dir, pipeline_id) / worker_name(worker)


def local_stores_path(local_dir: str | os.PathLike[str], pipeline_id: str) -> Path:
    """The folder of a host's working copies of one checkpointed pipeline's workers."""
    return Path(local_dir) / STORES / pipeline_id


def registration_path(local_dir: str | os.PathLike[str], pipeline_id: str) -> Path:
    """The file that keeps a pipeline's registration with a host's store services."""
    return Path(local_dir) / REGISTRATIONS / f"{pipeline_id}.json"


def host_id_path(local_dir: str | os.PathLike[str]) -> Path:
    """The file that keeps the id of the host whose local directory is ``local_dir``."""
    return Path(local_dir) / HOST_ID


def service_dir(local_dir: str, shard: int) -> str:
    """The directory of a host's store service number ``shard``: ``LOCAL_DIR`` itself for the
    first, ``LOCAL_DIR/service-<shard>`` for the others (socket, pid, lock and log inside)."""
    return local_dir if shard == 0 else os.path.join(local_dir, f"{SERVICE_PREFIX}{shard}")


def host_dir_of(service_directory: str) -> str:
    """The host's ``LOCAL_DIR`` of the directory of one of its store services
    (:func:`service_dir`)."""
    path = os.path.abspath(service_directory)
    shard = os.path.basename(path).removeprefix(SERVICE_PREFIX)
    return os.path.dirname(path) if shard != os.path.basename(path) and shard.isdigit() \
        else path


def service_dirs(local_dir: str) -> list[str]:
    """The directories of every store service that ``local_dir`` has held (the first always)."""
    try:
        names = sorted(n for n in os.listdir(local_dir) if n.startswith(SERVICE_PREFIX))
    except OSError:
        names = []
    return [local_dir, *(os.path.join(local_dir, n) for n in names)]


def store_socket_path(local_dir: str) -> str:
    """Where the store service of ``local_dir`` listens: ``LOCAL_DIR/store.sock``, or a short
    path under ``/tmp`` named for ``local_dir`` when that is too long (Unix sockets allow ~107
    bytes)."""
    path = os.path.join(local_dir, STORE_SOCKET)
    if len(path.encode()) < 100:
        return path
    digest = hashlib.sha256(os.path.abspath(local_dir).encode()).hexdigest()[:16]
    return os.path.join("/tmp", f"megaphone-{digest}.sock")


def store_pid_path(local_dir: str) -> str:
    """The file holding the pid of the store service of ``local_dir``."""
    return os.path.join(local_dir, STORE_PID)


def store_lock_path(local_dir: str) -> str:
    """The file whose lock lets one process at a time start the store service of ``local_dir``."""
    return os.path.join(local_dir, STORE_LOCK)


def store_log_path(local_dir: str) -> str:
    """The file the store service of ``local_dir`` logs to."""
    return os.path.join(local_dir, STORE_LOG)


def driver_state_path(local_dir: str | os.PathLike[str], pipeline_id: str, run: str) -> Path:
    """The state directory a Spark Connect server opens pipeline ``pipeline_id`` in for the
    stream query run ``run``."""
    return Path(local_dir) / DRIVERS / f"{pipeline_id}-{run}"


def checkpoint_worker_root(root: str, worker: int) -> str:
    """The folder of ``worker``'s durable copy under the checkpoint location's path ``root``."""
    return f"{root.rstrip('/')}/{WORKERS}/{worker_name(worker)}"


def checkpoint_durable_file(worker_root: str, kind: str, epoch: int) -> str:
    """The ``kind`` (:data:`CHANGELOG` or :data:`SNAPSHOT`) file of ``epoch`` under a worker's
    durable copy folder ``worker_root`` (from :func:`checkpoint_worker_root`)."""
    return f"{worker_root}/{kind}/{durable_name(epoch)}"


def checkpoint_owner_path(root: str) -> str:
    """The record of the owning pipeline under the checkpoint location's path ``root``."""
    return f"{root.rstrip('/')}/{CHECKPOINT_OWNER}"


def checkpoint_driver_root(root: str) -> str:
    """The folder of the driver's copy under the checkpoint location's path ``root``."""
    return f"{root.rstrip('/')}/{DRIVER}"
