"""Live migration demo: a word count on a rate-limited stream scales 2 -> 4 workers as it runs.

Runs on embedded Spark (``local[*]``) by default. After a steady phase a fluid plan moves half
the bins, one bin per epoch, to two new workers while the stream keeps going; every epoch
prints what it processed, its latency and what moved, and a summary compares latency before,
during and after the migration.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from megaphone.migrator.pipeline import Pipeline
from megaphone.plans.plan import MigrationPlan
from megaphone.routing.table import Move


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the demo's options."""
    parser.add_argument("--duration", type=float, default=75.0,
                        help="seconds the stream runs in all (default 75)")
    parser.add_argument("--rate", type=int, default=2000, help="records per second (default 2000)")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct words (default 10000)")
    parser.add_argument("--bins", type=int, default=64, help="bins (default 64)")
    parser.add_argument("--steady", type=float, default=15.0,
                        help="seconds before the migration starts (default 15)")
    parser.add_argument("--backend", choices=("rocksdb", "memory"), default="rocksdb")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--state-dir", default=None, help="keep state here (default: temp dir)")


def scale_out_moves(pipe: Pipeline, workers: int) -> list[Move]:
    """Moves that spread the bins of the current workers evenly over ``workers`` workers."""
    owners = pipe.routing.owners()
    return [Move(b, int(owners[b]), b % workers) for b in range(len(owners))
            if b % workers != int(owners[b])]


def words(value: Column, keys: int) -> Column:
    """The demo's word of each ``value``: one of ``w0`` .. ``w{keys-1}``, spread by
    ``xxhash64`` (``pmod``: ``%`` of a negative hash is negative, which made twice the words)."""
    return F.concat(F.lit("w"), F.pmod(F.xxhash64(value), F.lit(keys)).cast("string"))


def run(args: argparse.Namespace) -> int:
    """Run the demo and print one line per epoch and a summary."""
    from megaphone.spark import spark_session

    if args.master.startswith("sc://"):
        raise SystemExit("megaphone demo: the demo's sink reads the pipeline's metrics every "
                         "epoch, which over Spark Connect runs on the server, away from the "
                         "client's pipeline: it needs a classic session (--master local[*], "
                         "spark://, yarn, k8s://)")
    spark = spark_session(args.master, "megaphone-demo")
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="megaphone-demo-")
    pipe = Pipeline(spark, state_dir, key="word", update="count", workers=2,
                    num_bins=args.bins, backend=args.backend, key_type="str",
                    event_time="timestamp")
    stream = (
        spark.readStream.format("rate").option("rowsPerSecond", args.rate)
        .option("numPartitions", 2).load()
        .select(words(F.col("value"), args.keys).alias("word"), "timestamp")
    )
    phase = {"name": "steady"}
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def sink(outputs, epoch: int) -> None:
        m = pipe.metrics(last=1)[0]
        latency = m["latency_s"] if m["latency_s"] is not None else float("nan")
        with lock:
            rows.append({**m, "phase": phase["name"]})
        print(f"epoch {epoch:4d}  records {m['records_in']:7d}  latency {latency * 1000:7.0f} ms"
              f"  bins moved {m['bins_moved']:3d}  keys moved {m['keys_moved']:7d}"
              f"  workers {m['workers']}  [{phase['name']}]", flush=True)

    print(f"megaphone demo: word count, {args.rate} records/s, {args.keys} words, "
          f"{args.bins} bins, state in {state_dir}", flush=True)
    query = pipe.start(stream, sink, trigger={"processingTime": "1 second"})
    started = time.time()
    handle = None
    try:
        while time.time() - started < args.steady and query.isActive:
            time.sleep(0.5)
        moves = scale_out_moves(pipe, 4)
        plan = MigrationPlan.from_moves(pipe.routing, [[m] for m in moves], strategy="fluid")
        print(f"--- submitting a fluid plan: {len(moves)} bins to 2 new workers, one per epoch",
              flush=True)
        phase["name"] = "migrating"
        handle = pipe.migrate(plan)
        while not handle.done and query.isActive and time.time() - started < args.duration * 4:
            time.sleep(0.5)
        phase["name"] = "after"
        print(f"--- migration done: {handle.progress.bins_done} bins, "
              f"{handle.progress.bytes_moved} bytes moved", flush=True)
        while time.time() - started < args.duration and query.isActive:
            time.sleep(0.5)
    finally:
        pipe.stop()
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
    summarize(rows, handle)
    print(next_steps(state_dir, kept=args.state_dir is not None))
    return 0


def next_steps(state_dir: str, kept: bool) -> str:
    """What to try next on the demo's state (kept: a temp dir too), as the demo's last lines."""
    where = "" if kept else f" (a temp dir: delete it with rm -r {state_dir})"
    return (f"\nthe pipeline's state is in {state_dir}{where}; try next:\n"
            f"  megaphone inspect --state-dir {state_dir}   # workers, bins, keys, skew\n"
            f"  megaphone explain --state-dir {state_dir}   # what the slowest epochs waited for\n"
            f"  megaphone plan --state-dir {state_dir} --workers 3 --strategy batched"
            " -o plan.json\n"
            f"  megaphone migrate --state-dir {state_dir} plan.json   # offline, while stopped")


def summarize(rows: list[dict[str, Any]], handle) -> None:
    """Print latency before, during and after the migration and what moved."""
    print("\nsummary")
    for name in ("steady", "migrating", "after"):
        lat = [r["latency_s"] * 1000 for r in rows if r["phase"] == name and r["latency_s"]]
        recs = sum(r["records_in"] for r in rows if r["phase"] == name)
        if lat:
            print(f"  {name:9s}: {len(lat):3d} epochs, {recs:8d} records, latency median "
                  f"{statistics.median(lat):6.0f} ms, max {max(lat):6.0f} ms")
    migrating = [r for r in rows if r["phase"] == "migrating"]
    if handle is not None and migrating:
        p = handle.progress
        span = migrating[-1]["finished"] - migrating[0]["started"]
        print(f"  moved {p.bins_done}/{p.bins_total} bins, {sum(r['keys_moved'] for r in rows)} "
              f"keys, {p.bytes_moved} bytes in {span:.1f} s; workers "
              f"{rows[0]['workers']} -> {rows[-1]['workers']}; no epoch paused")
