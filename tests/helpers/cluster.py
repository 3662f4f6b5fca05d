"""A Spark standalone cluster on two simulated hosts, for the cluster tests and
``bench/executor_loss.py``.

A master and two workers run from the pyspark installation on 127.0.0.1. Each worker runs in
its own mount namespace with a private tmpfs over the driver's directory and its own
``SPARK_LOCAL_DIRS``, so its executor sees neither the driver's files nor the other host's store
service and working copies; only directories outside the driver's one are shared (a checkpoint
location). Needs root for ``unshare -m`` and ``mount``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.helpers.servers import free_port, start, stop, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
#: Settings for a driver on the simulated hosts: each executor reads only its own shuffle
#: files, one core per executor, and both executors are up before the first job.
CLUSTER_CONF = {"spark.shuffle.readHostLocalDisk": "false", "spark.executor.cores": "1",
                "spark.cores.max": "2", "spark.executor.memory": "768m",
                "spark.task.maxFailures": "4",
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s"}


@dataclass
class TwoHosts:
    """A running two-host cluster: its master URL, the driver's private directory (the hosts
    each see an empty tmpfs there), a directory both hosts see, and the processes (master,
    host 0, host 1; each in its own process group)."""

    master: str
    hidden: Path
    shared: Path
    procs: list[subprocess.Popen]
    _launch: Callable[[int], subprocess.Popen] = field(repr=False)

    def ensure_hosts(self) -> None:
        """Start again, on its old disks, any host that was killed; wait until it registered."""
        for i in (0, 1):
            if self.procs[1 + i].poll() is not None:
                self.procs[1 + i] = self._launch(i)
                _wait_for_registration(self.shared / f"host{i}.log", self.procs[1 + i])


def kill_host(proc: subprocess.Popen) -> list[int]:
    """Lose a simulated host as a machine is lost: SIGKILL every process in the mount
    namespace of its worker ``proc`` (the Spark worker, its executor and Python workers, and
    the store services they started, which run in sessions of their own); the pids killed."""
    def namespace(pid: int | str) -> str | None:
        try:
            return os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            return None

    host = namespace(proc.pid)
    assert host is not None and host != namespace("self"), "not a simulated host's process"
    killed = [int(p) for p in os.listdir("/proc") if p.isdigit() and namespace(p) == host]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    return killed


def namespaces_permitted(probe: Path) -> bool:
    """Whether this process may give a child its own mount namespace with a private tmpfs."""
    probe.mkdir(exist_ok=True)
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f"mount -t tmpfs tmpfs {probe}"], capture_output=True)
    return done.returncode == 0


def _wait_for_registration(log: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while "Successfully registered with master" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{log.name} did not register: {log.read_text()[-3000:]}")
        time.sleep(0.5)


@contextlib.contextmanager
def two_hosts(base: Path, memory: str = "1g", cores: int = 1) -> Iterator[TwoHosts]:
    """Start a master and two workers of ``cores`` cores and ``memory`` each under ``base``;
    stop them (only them) on exit. Call :func:`namespaces_permitted` first."""
    hidden = base / "driver"  # the driver's own disk: each host mounts its own tmpfs over it
    hidden.mkdir()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": str(ROOT)}
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    hosts: TwoHosts | None = None
    try:
        log = base / "master.log"
        procs.append(start([spark_class, "org.apache.spark.deploy.master.Master", "--host",
                            "127.0.0.1", "--port", str(port), "--webui-port", str(ui)], log, env))
        wait_for_port(port, procs[0], log)

        def launch(i: int) -> subprocess.Popen:
            work, local = base / f"host{i}-work", base / f"host{i}-local"
            work.mkdir(exist_ok=True)
            local.mkdir(exist_ok=True)
            worker = (f"mount -t tmpfs tmpfs {hidden} && exec {spark_class} "
                      f"org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --cores {cores} "
                      f"--memory {memory} --webui-port {free_port()} --work-dir {work} "
                      f"spark://127.0.0.1:{port}")
            return start(["unshare", "-m", "--propagation", "private", "sh", "-c", worker],
                         base / f"host{i}.log", {**env, "SPARK_LOCAL_DIRS": str(local)})

        procs += [launch(0), launch(1)]
        for i, proc in enumerate(procs[1:]):
            _wait_for_registration(base / f"host{i}.log", proc)
        hosts = TwoHosts(f"spark://127.0.0.1:{port}", hidden, base, procs, launch)
        yield hosts
    finally:
        stop(hosts.procs if hosts is not None else procs)
