"""Spark Connect: a pipeline driven from a Connect client against a real Connect server.

The server is pyspark's bundled ``SparkConnectServer`` started here with ``spark-submit`` on
127.0.0.1 (local[2]); the client runs in a subprocess, since a Connect client puts pyspark in
remote mode for its whole process. Only the server started here is stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyspark
import pytest

from tests.helpers.connect_client import EPOCHS, MOVES, STREAM_EPOCHS, batch_keys
from tests.helpers.servers import free_port, start, stop, wait_for_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    """A Spark Connect server of our own on 127.0.0.1, its URL; stopped at the end."""
    import grpc  # noqa: F401  (the client's packages: pyspark's `connect` extra, a test extra)

    home = Path(pyspark.__file__).parent
    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    # The server's Python workers run this interpreter, whatever `python3` is on PATH (its
    # UDFs follow PYSPARK_PYTHON, not spark.pyspark.python).
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    conf = {"spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.pyspark.python": sys.executable, "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4"}
    cmd = [str(home / "bin" / "spark-submit"), "--master", "local[2]",
           "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    server = start([*cmd, "spark-internal"], log, env)
    try:
        wait_for_port(port, server, log)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop([server])


def test_a_pipeline_migrates_live_over_spark_connect(connect_url, tmp_path):
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "MEGAPHONE_LOCAL_DIR": str(tmp_path / "local")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.connect_client", connect_url,
         str(tmp_path / "state"), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    # Against a plain Python count: each epoch's outputs, and the state at the end; the last
    # STREAM_EPOCHS ran as a stream on the server, while plans moved three bins back.
    seen: Counter = Counter()
    for epoch in range(EPOCHS + STREAM_EPOCHS):
        batch = Counter(batch_keys(epoch))
        seen.update(batch)
        assert result["outputs"][str(epoch)] == {str(k): seen[k] for k in batch}, epoch
    assert {int(k): v for k, v in result["state"].items()} == dict(seen)
    assert result["epoch"] == EPOCHS + STREAM_EPOCHS - 1 and result["in_flight"] == 0
    # The third plan, posted from the client to the server, ran at the last epoch there; the
    # client saw it done and the server's routing; a stale plan was refused at once.
    assert result["owners"] == [m.src for m in MOVES[:3]] + [m.dst for m in MOVES[3:]]
    posted = result["posted"]
    assert posted["done"] and posted["epochs"] == [EPOCHS + STREAM_EPOCHS - 1]
    assert posted["owner"] == MOVES[2].src and "stale plan" in posted["stale"]
    assert result["records_in"] == [len(batch_keys(e)) for e in range(EPOCHS + STREAM_EPOCHS)]
    assert "running a stream" in result["refused"]  # the client stepped aside meanwhile


class _FakeConnectConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, name: str, default=None):
        return self.values.get(name, default)


def _connect_session(values: dict[str, str]):
    """Something that looks like a Spark Connect session to ``is_connect``, with a conf."""
    session = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()
    session.conf = _FakeConnectConf(values)
    return session


@pytest.mark.parametrize(("values", "slots"), [
    ({"spark.default.parallelism": "6", "spark.master": "local[3]"}, 6),
    ({"spark.master": "local[3]"}, 3),
    ({"spark.master": "local[5,2]"}, 5),
    ({"spark.master": "local[*]"}, os.cpu_count() or 2),
    ({"spark.master": "spark://h:7077", "spark.executor.instances": "4",
      "spark.executor.cores": "2"}, 8),
    ({"spark.master": "spark://h:7077"}, 2),
])
def test_task_slots_of_a_connect_server_come_from_its_settings(values, slots):
    from megaphone.spark import is_connect, task_slots

    session = _connect_session(values)
    assert is_connect(session) and task_slots(session) == slots


def test_a_plan_posted_through_the_checkpoint_is_answered_once_and_followed(tmp_path):
    """The inbox of the checkpoint's driver copy, without a server: a plan taken is followed
    to its commit; one the pipeline already holds (taken before a restart) is answered, not
    submitted again; one the pipeline rejects fails its handle with the pipeline's error."""
    from megaphone.migrator.statedir.commit import Commit
    from megaphone.migrator.statedir.driver_copy import DriverCopy
    from megaphone.migrator.statedir.inbox import PlanInbox, copy_committed
    from megaphone.plans.plan import MigrationPlan, PlanError
    from megaphone.routing.fingerprint import Fingerprint
    from megaphone.routing.table import Move, RoutingTable

    uri, routing_file = str(tmp_path / "checkpoint"), tmp_path / "routing.json"
    table = RoutingTable.initial(Fingerprint("p", 8, "int64"), 2)

    def commit(epoch: int, seq: int) -> None:
        table.save(routing_file)
        DriverCopy(uri).write_commit({**Commit(epoch, table.version).to_dict(), "seq": seq},
                                     routing_file)

    DriverCopy(uri).write_manifest({})
    commit(2, 1)
    submitted: list[MigrationPlan] = []
    inbox = PlanInbox(DriverCopy(uri))

    def post(plan: MigrationPlan):
        return inbox.post(plan, lambda: copy_committed(DriverCopy(uri)))

    handle = post(MigrationPlan.from_moves(table, [[Move(5, 1, 2)]]))
    inbox.take([], submitted.append)
    assert [p.moves for p in submitted] == [[Move(5, 1, 2)]] and not handle.done
    table.apply_step([Move(5, 1, 2)], 3)
    commit(3, 2)
    assert handle.wait(5) and handle.progress.epochs == [3] and handle.progress.bins_done == 1
    again = post(MigrationPlan.from_moves(table, [[Move(6, 1, 2)]]))
    inbox.take([{"plan": again.plan.to_dict()}], submitted.append)
    assert len(submitted) == 1 and not again.done and again.accepted
    refused = post(MigrationPlan.from_moves(table, [[Move(7, 1, 2)]]))

    def refuse(plan: MigrationPlan) -> None:
        raise PlanError("refused by the pipeline")

    inbox.take([], refuse)
    with pytest.raises(PlanError, match="refused by the pipeline"):
        refused.wait(5)
    assert DriverCopy(uri).names("inbox") == []


def test_the_demo_runs_over_spark_connect(connect_url, tmp_path):
    """``megaphone demo --master sc://...``: the stream runs on the server, the plan reaches it
    through the checkpoint's inbox, and the client prints each epoch from the metrics the
    server writes to the checkpoint: every bin it moves lands, one per epoch, on 4 workers."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "MEGAPHONE_LOCAL_DIR": str(tmp_path / "local")}
    done = subprocess.run(
        [sys.executable, "-m", "megaphone", "demo", "--master", connect_url, "--bins", "8",
         "--rate", "50", "--keys", "100", "--steady", "1", "--duration", "6",
         "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    epochs = [line.split() for line in out.splitlines() if line.startswith("epoch ")]
    assert [int(e[1]) for e in epochs] == list(range(len(epochs)))  # each epoch once, in order
    migrating = [e for e in epochs if e[-1] == "[migrating]"]
    # Bins 8 over 2 workers (b % 2 at first) to b % 4: bins 2, 3, 6 and 7 move, one an epoch.
    assert [int(e[9]) for e in migrating] == [1, 1, 1, 1]
    assert all(e[5] != "nan" and int(e[5]) > 0 for e in migrating) and epochs[-1][-2] == "4"
    assert "--- migration done: 4 bins" in out
    assert "moved 4/4 bins" in out and "workers 2 -> 4" in out
