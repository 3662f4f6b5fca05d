"""Small probes behind docs/placement.md (a design study; not part of the package).

``transport``: the cost of reaching a store service over TCP loopback instead of the Unix socket
tasks use today, with the service's own framing (:mod:`megaphone.state_backends.wire`). A server
process answers three kinds of request:

- ``ship``: an Arrow IPC frame of N ``(key int64, value int64)`` records, decoded and answered
  with an IPC frame of the same size (direction 1 as the issue states it: the records go to the
  home service, the outputs come back);
- ``read`` and ``commit``: the two storage calls an epoch's task makes today for N keys
  (12-byte raw keys, 8-byte values; ``commit`` carries keys, new and old values and the outputs
  as IPC), answered as the service would (N values; a short map).

``secrets``: what the event log (the history UI) shows of a value handed to tasks as a Spark
conf entry, a job-local property or a value bound into the task's function (as the epoch spec
is); also whether ``mapInArrow`` calls its function for an empty partition (local mode).

``cluster``: where Spark runs tasks on a ``local-cluster[2,1,1024]`` master (two executors, one
core each, in separate JVMs; a task's executor is read from its ``java`` ancestor's
``--executor-id``): a DataFrame job shaped like an epoch's (``repartitionById`` then
``mapInArrow``); a PySpark RDD built on the JVM's ``makeRDD`` with per-partition location
preferences (``executor_<host>_<id>``); that RDD zipped with the epoch-shaped shuffle; tasks
crowding one preferred executor; and the zipped job's cost against the DataFrame job's.

Run from the repository root with ``PYTHONPATH=.``: ``python docs/placement_probe.py transport``,
``... secrets`` or ``... cluster`` (it starts and stops its own local cluster; about a minute).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

import msgpack
import numpy as np
import pyarrow as pa

from megaphone.state_backends.wire import batch_to_ipc, ipc_to_batches, recv_frame, send_frame


def _batch(n: int) -> pa.RecordBatch:
    keys = np.arange(n, dtype=np.int64)
    return pa.record_batch([pa.array(keys), pa.array(keys * 7)], names=["key", "value"])


def _serve(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        while (req := recv_frame(conn)) is not None:
            op = req["op"]
            if op == "ship":
                batches = ipc_to_batches(req["chunk"])
                send_frame(conn, {"ok": True, "chunk": batch_to_ipc(batches[0])})
            elif op == "read":
                send_frame(conn, {"ok": True, "values": [b"\0" * 8] * len(req["keys"])})
            elif op == "commit":
                send_frame(conn, {"ok": True, "keys": len(req["keys"]), "token": "t"})
            elif op == "ping":
                send_frame(conn, {"ok": True})
        conn.close()


def _timed(conn: socket.socket, message: dict, repeats: int) -> float:
    """Median milliseconds of one request and its reply."""
    times = []
    for i in range(repeats + 2):
        started = time.perf_counter()
        send_frame(conn, message)
        recv_frame(conn)
        if i >= 2:  # two warm-ups
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def transport(sizes: list[int], repeats: int) -> dict:
    """Median round-trip milliseconds per request kind, size and transport."""
    tmp = tempfile.mkdtemp(prefix="placement-probe-")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(os.path.join(tmp, "s.sock"))
    unix.listen(4)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    servers = [multiprocessing.Process(target=_serve, args=(s,), daemon=True)
               for s in (unix, tcp)]
    for p in servers:
        p.start()
    results: dict = {}
    try:
        ends = {}
        ends["unix"] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ends["unix"].connect(os.path.join(tmp, "s.sock"))
        ends["tcp"] = socket.create_connection(tcp.getsockname())
        ends["tcp"].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for name, conn in ends.items():
            results[f"ping/{name}"] = _timed(conn, {"op": "ping"}, repeats * 10)
        for n in sizes:
            batch = _batch(n)
            encode = []
            for _ in range(repeats):
                started = time.perf_counter()
                ipc = batch_to_ipc(batch)
                encode.append((time.perf_counter() - started) * 1e3)
            encode_ms = statistics.median(encode)
            raw_keys = [b"\0\0\0\1" + i.to_bytes(8, "big") for i in range(n)]
            values = [b"\0" * 8] * n
            messages = {
                "ship": {"op": "ship", "chunk": ipc},
                "read": {"op": "read", "keys": raw_keys},
                "commit": {"op": "commit", "keys": raw_keys, "values": values, "old": values,
                           "outputs": ipc},
            }
            results[f"ipc_bytes/{n}"] = len(ipc)
            for kind, message in (("read_request", {"op": "read", "keys": raw_keys}),
                                  ("read_reply", {"ok": True, "values": values}),
                                  ("commit_request_without_outputs",
                                   {"op": "commit", "keys": raw_keys, "values": values,
                                    "old": values})):
                results[f"msgpack_bytes/{kind}/{n}"] = len(msgpack.packb(message))
            results[f"ipc_encode_ms/{n}"] = encode_ms
            for kind, message in messages.items():
                for name, conn in ends.items():
                    results[f"{kind}/{name}/{n}"] = _timed(conn, message, repeats)
        for conn in ends.values():
            conn.close()
    finally:
        for p in servers:
            p.terminate()
            p.join()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def executor_id() -> str:
    """The id of the Spark executor this Python worker runs under: the ``--executor-id`` of
    the nearest ``java`` ancestor process (how megaphone finds its executor, too)."""
    from megaphone.state_backends.service_client import executor_pid
    pid = executor_pid()
    if pid is None:
        return "?"
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        args = fh.read().decode().split("\0")
    return args[args.index("--executor-id") + 1] if "--executor-id" in args else f"pid{pid}"


def jvm_list(sc, seq) -> list:
    """A Scala ``Seq`` as a Python list."""
    return list(sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq))


def _where(_):
    from pyspark import TaskContext
    return [(TaskContext.get().partitionId(), executor_id())]


def cluster(rounds: int, records: int) -> dict:
    """Which executor ran each partition: RDDs with location preferences, and epoch-shaped
    DataFrame jobs."""
    from pyspark.rdd import RDD
    from pyspark.serializers import CPickleSerializer
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need pyarrow
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
             .config("spark.executor.memory", "512m")
             .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
             .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
             .config("spark.ui.enabled", "false").getOrCreate())
    sc = spark.sparkContext
    out: dict = {}
    try:
        # Wait for both executors, then learn their ids and hosts.
        jsc = sc._jsc.sc()
        deadline = time.monotonic() + 120
        while jsc.getExecutorMemoryStatus().size() < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        tracker = jsc.statusTracker().getExecutorInfos()
        hosts = {tracker[i].host() for i in range(len(tracker))}
        executors = sorted(jvm_list(sc, jsc.getExecutorIds()))
        host = hosts.pop()  # the driver and both executors: one host here
        out["executors"] = executors
        jvm = sc._jvm
        # (b) makeRDD with preferences: partition w prefers executors[home[w]].
        def preferring(homes: list[int]) -> RDD:
            """A PySpark RDD of one element (w) per partition w, preferring executor
            ``executors[homes[w]]`` (JVM ``makeRDD`` of ``(item, Seq(location))``)."""
            pairs = [jvm.scala.Tuple2(bytearray(ser.dumps(w)), scala_seq(
                [f"executor_{host}_{executors[h]}"])) for w, h in enumerate(homes)]
            jrdd = jsc.makeRDD(scala_seq(pairs), tag)
            out.setdefault("makeRDD_preferred", []).append(
                [jvm_list(sc, jrdd.preferredLocations(jrdd.partitions()[w]))
                 for w in range(len(homes))])
            return RDD(jvm.org.apache.spark.api.java.JavaRDD(jrdd, tag), sc, ser)

        def scala_seq(items):
            return jvm.scala.jdk.javaapi.CollectionConverters.asScala(items).toSeq()

        ser = CPickleSerializer()
        tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
        # (b) location preferences alone, two opposite home assignments.
        for homes in ([0, 1, 1, 0], [1, 0, 0, 1]):
            prdd = preferring(homes)
            hits = 0
            for _ in range(rounds):
                got = dict(prdd.mapPartitionsWithIndex(lambda i, it: _where(i)).collect())
                hits += sum(got[w] == executors[h] for w, h in enumerate(homes))
            out[f"makeRDD_hits/{homes}"] = f"{hits}/{rounds * len(homes)}"
        # (b') the same preferences zipped with an epoch-shaped shuffle: partition w of
        # repartitionById packed into one row (mapInArrow), zipped with partition w of the
        # preferring RDD; the zipped stage reads the shuffle and runs where it prefers?
        def pack(batches):
            from pyspark import TaskContext
            rows = sum(b.num_rows for b in batches)
            yield pa.record_batch([pa.array([TaskContext.get().partitionId()], pa.int32()),
                                   pa.array([rows], pa.int64())], names=["w", "rows"])

        routed = spark.range(0, 40_000, 1, 4).select(
            F.col("id").alias("key"), (F.col("id") % 4).cast("int").alias("worker"))
        for homes in ([0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 0, 0]):
            hits, shapes = 0, set()
            for _ in range(rounds):
                payload = routed.repartitionById(4, F.col("worker")).mapInArrow(
                    pack, "w int, rows long").rdd
                got = preferring(homes).zip(payload).map(
                    lambda p: (p[0], p[1].w, p[1].rows, executor_id())).collect()
                shapes.add(tuple((w, sw, n) for w, sw, n, _ in got))
                hits += sum(e == executors[homes[w]] for w, _, _, e in got)
            out[f"zip_hits/{homes}"] = f"{hits}/{rounds * len(homes)}"
            out[f"zip_partitions/{homes}"] = sorted(shapes)
        # Fallback: every partition prefers executor 0 and takes 0.5 s; how many ran there,
        # and how long did the stage take (spark.locality.wait is 3 s by default)?
        def slow(i, it):
            time.sleep(0.5)
            return _where(i)

        started = time.perf_counter()
        got = dict(preferring([0, 0, 0, 0]).mapPartitionsWithIndex(slow).collect())
        out["crowded_ran_on"] = got
        out["crowded_seconds"] = round(time.perf_counter() - started, 2)

        # (a) an epoch-shaped DataFrame job: where does worker w's apply task run?
        def apply(batches):
            from pyspark import TaskContext
            for _ in batches:
                pass
            yield pa.record_batch([pa.array([TaskContext.get().partitionId()], pa.int32()),
                                   pa.array([executor_id()])], names=["w", "executor"])

        df = spark.range(0, 40_000, 1, 4).select(F.col("id").alias("key"),
                                                 (F.col("id") % 4).cast("int").alias("worker"))
        moved, runs = 0, []
        last = None
        for _ in range(rounds):
            rows = df.repartitionById(4, F.col("worker")).mapInArrow(
                apply, "w int, executor string").collect()
            got = {r.w: r.executor for r in rows}
            runs.append(got)
            if last is not None:
                moved += sum(got[w] != last[w] for w in got)
            last = got
        out["dataframe_runs"] = runs
        # Cost: the same epoch-shaped job over ``records`` rows (key, value int64), as a
        # DataFrame job (apply = mapInArrow after repartitionById) and as the zipped RDD job
        # (each worker's records packed into one Arrow IPC value, decoded in the apply).
        def count_rows(batches):
            rows = sum(b.num_rows for b in batches)
            yield pa.record_batch([pa.array([rows], pa.int64())], names=["rows"])

        def pack_ipc(batches):
            table = pa.Table.from_batches(list(batches))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            yield pa.record_batch([pa.array([sink.getvalue().to_pybytes()], pa.binary())],
                                  names=["data"])

        def unpack(pair):
            return pa.ipc.open_stream(pa.py_buffer(pair[1].data)).read_all().num_rows

        big = spark.range(0, records, 1, 4).select(
            F.col("id").alias("key"), (F.col("id") * 3).alias("value"),
            (F.col("id") % 4).cast("int").alias("worker"))
        timings: dict = {"dataframe": [], "zip": []}
        for _ in range(3):
            started = time.perf_counter()
            n = sum(r.rows for r in big.repartitionById(4, F.col("worker")).mapInArrow(
                count_rows, "rows long").collect())
            timings["dataframe"].append(time.perf_counter() - started)
            assert n == records
            started = time.perf_counter()
            payload = big.repartitionById(4, F.col("worker")).mapInArrow(
                pack_ipc, "data binary").rdd
            n = sum(preferring([0, 1, 1, 0]).zip(payload).map(unpack).collect())
            timings["zip"].append(time.perf_counter() - started)
            assert n == records
        out[f"job_seconds/{records}"] = {k: [round(t, 2) for t in v] for k, v in timings.items()}

        out["dataframe_moved_between_runs"] = f"{moved}/{(rounds - 1) * 4}"
        out["reduceLocality"] = sc.getConf().get("spark.shuffle.reduceLocality.enabled", "true")
    finally:
        spark.stop()
    return out


def _tagged(tag: str, batches):
    for _ in batches:
        pass
    yield pa.record_batch([pa.array([tag])], names=["tag"])


def secrets() -> dict:
    """Where a value handed to tasks shows up: a Spark conf entry and a job-local property,
    each under a name that matches Spark's redaction pattern and one that does not, written
    to the event log (what the history UI shows) and read back in a task; and whether
    ``mapInArrow`` calls its function for an empty partition (one row per partition)."""
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logs = tempfile.mkdtemp(prefix="placement-events-")
    spark = (SparkSession.builder.master("local[1]")
             .config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", logs)
             .config("spark.eventLog.compress", "false")
             .config("spark.megaphone.pipeline.secret", "CONFSECRET1")
             .config("spark.megaphone.pipeline.key", "CONFPLAIN1")
             .config("spark.ui.enabled", "false").getOrCreate())
    sc = spark.sparkContext
    out: dict = {"redaction_regex": sc._jsc.sc().conf().get(
        "spark.redaction.regex", "(default)")}
    try:
        sc.setLocalProperty("megaphone.secret", "LOCALSECRET2")
        sc.setLocalProperty("megaphone.key", "LOCALPLAIN2")
        seen = sc.parallelize([0], 1).map(lambda _: (
            TaskContext.get().getLocalProperty("megaphone.secret"),
            TaskContext.get().getLocalProperty("megaphone.key"))).collect()
        out["task_reads_local_properties"] = seen
        sc.setLocalProperty("megaphone.secret", None)
        sc.setLocalProperty("megaphone.key", None)

        def one_row(batches):
            rows = sum(b.num_rows for b in batches)
            yield pa.record_batch([pa.array([rows], pa.int64())], names=["rows"])

        rows = spark.range(0, 2, 1, 1).select(F.col("id").cast("int").alias("w")) \
            .repartitionById(4, F.col("w")).mapInArrow(one_row, "rows long").collect()
        out["mapInArrow_rows_for_4_partitions_2_empty"] = [r.rows for r in rows]
        # A value bound into the task's function (as the epoch spec is, functools.partial).
        rows = spark.range(0, 2, 1, 1).mapInArrow(
            functools.partial(_tagged, "SPECSECRET3"), "tag string").collect()
        out["task_reads_bound_value"] = sorted({r.tag for r in rows})
    finally:
        spark.stop()
    text = ""
    for root, _, files in os.walk(logs):
        for name in files:
            with open(os.path.join(root, name), errors="replace") as fh:
                text += fh.read()
    for marker in ("CONFSECRET1", "CONFPLAIN1", "LOCALSECRET2", "LOCALPLAIN2", "SPECSECRET3"):
        out[f"in_event_log/{marker}"] = marker in text
    out["event_log_redacted_marker"] = "*********(redacted)" in text
    shutil.rmtree(logs, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("transport")
    t.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    t.add_argument("--repeats", type=int, default=9)
    c = sub.add_parser("cluster")
    c.add_argument("--rounds", type=int, default=5)
    c.add_argument("--records", type=int, default=1_000_000)
    sub.add_parser("secrets")
    args = parser.parse_args()
    if args.what == "transport":
        result = transport(args.sizes, args.repeats)
    elif args.what == "cluster":
        result = cluster(args.rounds, args.records)
    else:
        result = secrets()
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
