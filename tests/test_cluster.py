"""A Spark standalone cluster on two simulated hosts: a misconfiguration fails loudly.

A master and two workers run from the pyspark installation on 127.0.0.1; each worker runs in
its own mount namespace with a private tmpfs over the driver's directory, so its executor sees
neither the driver's state directory nor the other host's store service and working copies;
only a checkpoint location outside that directory is shared. Without a checkpoint location such
a cluster must refuse to run rather than let each executor grow state of its own under the
same path; with one it runs, and survives losing a host. Only the processes started here are
stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest

from tests.helpers.servers import free_port, start, stop, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
SPARK_HOME = Path(pyspark.__file__).parent


def namespaces_permitted(probe: Path) -> bool:
    """Whether this process may give a child its own mount namespace with a private tmpfs."""
    probe.mkdir()
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f"mount -t tmpfs tmpfs {probe}"], capture_output=True)
    return done.returncode == 0


def wait_for_registration(log: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while "Successfully registered with master" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{log.name} did not register: {log.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """``(master URL, the driver's private directory, a directory both hosts see, the
    processes: master, host 0, host 1)`` of a running two-host cluster."""
    base = tmp_path_factory.mktemp("hosts")
    if not namespaces_permitted(base / "probe"):
        pytest.skip("mount namespaces are not permitted here (unshare -m and mount need root)")
    hidden = base / "driver"  # the driver's own disk: each host mounts its own tmpfs over it
    hidden.mkdir()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": str(ROOT)}
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    procs = []
    try:
        log = base / "master.log"
        procs.append(start([spark_class, "org.apache.spark.deploy.master.Master", "--host",
                            "127.0.0.1", "--port", str(port), "--webui-port", str(ui)], log, env))
        wait_for_port(port, procs[0], log)
        for i in range(2):
            work, local = base / f"host{i}-work", base / f"host{i}-local"
            work.mkdir()
            local.mkdir()
            worker = (f"mount -t tmpfs tmpfs {hidden} && exec {spark_class} "
                      f"org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --cores 1 "
                      f"--memory 1g --webui-port {free_port()} --work-dir {work} "
                      f"spark://127.0.0.1:{port}")
            procs.append(start(["unshare", "-m", "--propagation", "private", "sh", "-c", worker],
                               base / f"host{i}.log", {**env, "SPARK_LOCAL_DIRS": str(local)}))
        for i, proc in enumerate(procs[1:]):
            wait_for_registration(base / f"host{i}.log", proc)
        yield f"spark://127.0.0.1:{port}", hidden, base, procs
    finally:
        stop(procs)


def test_executors_that_cannot_see_the_state_directory_fail_the_epoch_loudly(two_hosts):
    master, hidden, _, _ = two_hosts
    state_dir, out = hidden / "state", hidden / "out.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.cluster_client", master, str(state_dir),
         str(hidden / "local"), str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["executors"] == 2
    assert result["error"] is not None and "is not readable on host" in result["error"]
    assert result["epoch"] == -1  # nothing was committed
    # The driver's directory holds no worker state: nothing was written anywhere in its name.
    assert not list((state_dir / "workers").iterdir())


def test_with_a_checkpoint_it_runs_on_two_hosts_and_survives_losing_one(two_hosts):
    """Runs last: it kills host 1. A seeded random plan is in flight when the host goes; its
    workers' state is restored on host 0 from the shared checkpoint location."""
    from tests.helpers.cluster_client import EPOCHS, batch_keys

    master, hidden, shared, procs = two_hosts
    state_dir, out = hidden / "state-ckpt", hidden / "out-ckpt.json"
    client = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.cluster_client", master, str(state_dir),
         str(hidden / "local"), str(out), str(shared / "checkpoint"), "3"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        paused = Path(str(out) + ".paused")
        deadline = time.monotonic() + 600
        while not paused.exists() and client.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert paused.exists(), client.communicate(timeout=60)[1][-4000:]
        os.killpg(procs[2].pid, signal.SIGKILL)  # host 1 is gone: its worker and executor
        procs[2].wait()
        Path(str(out) + ".resume").write_text("")
        _, err = client.communicate(timeout=600)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err[-4000:]
    result = json.loads(out.read_text())
    assert result["error"] is None, result["error"]
    expected: dict[int, int] = {}
    for epoch in range(EPOCHS):
        for k in batch_keys(epoch):
            expected[k] = expected.get(k, 0) + 1
        touched = set(batch_keys(epoch))
        assert {int(k): v for k, v in result["outputs"][str(epoch)].items()} == \
            {k: expected[k] for k in touched}, f"epoch {epoch}"
    assert {int(k): v for k, v in result["state"].items()} == expected
    assert result["executors"] == 1 and result["epoch"] == EPOCHS - 1
    assert result["restored"], "no working copy was restored after host 1 went away"
    # Nothing of the workers' state was ever written to the driver's directory.
    assert not (state_dir / "workers").exists() or not any((state_dir / "workers").iterdir())
