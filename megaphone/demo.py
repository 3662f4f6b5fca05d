"""Live migration demo: a word count on a rate-limited stream scales 2 -> 4 workers as it runs.

Runs on embedded Spark (``local[*]``) by default, or with ``--master sc://HOST:PORT`` on a Spark
Connect server. After a steady phase a fluid plan moves half the bins, one bin per epoch, to
two new workers while the stream keeps going; every epoch prints what it processed, its latency
and what moved, and a summary compares latency before, during and after the migration. The
lines come from the committed epochs' metrics, which the demo polls: the pipeline's own, or
over Spark Connect, where the stream runs the pipeline on the server, those the server writes
to the checkpoint location as it commits (the plan goes there too, through its inbox).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from megaphone.migrator.pipeline import Pipeline
from megaphone.migrator.statedir.driver_copy import DriverCopy
from megaphone.paths import STREAM_CHECKPOINT
from megaphone.plans.handle import MigrationHandle
from megaphone.plans.strategies import make_plan
from megaphone.plans.targets import balanced_target, target_moves
from megaphone.routing.table import Move

#: Seconds between two polls of the committed epochs' metrics. Polling every 0.25 s doubled
#: the latency the demo reports (median 1.2-1.4 s against 0.6-0.9 s at 1 s, same epoch
#: durations): the polls' calls into the JVM delay the stream's micro-batches.
POLL_S = 1.0


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
    parser.add_argument("--checkpoint", default=None, metavar="URI",
                        help="the pipeline's checkpoint location (default: none; over Spark "
                        "Connect, where it must be reachable from here and from the server, "
                        "STATE_DIR-checkpoint, for a server on this host)")


def scale_out_moves(pipe: Pipeline, workers: int) -> list[Move]:
    """Moves that spread the bins evenly over ``workers`` workers, moving as few as possible
    (the planner's own :func:`~megaphone.plans.targets.balanced_target`, by bin counts)."""
    owners = pipe.routing.owners()
    return target_moves(owners, balanced_target(owners, np.zeros(len(owners)), workers))


def words(value: Column, keys: int) -> Column:
    """The demo's word of each ``value``: one of ``w0`` .. ``w{keys-1}``, spread by
    ``xxhash64`` (``pmod``: ``%`` of a negative hash is negative, which made twice the words)."""
    return F.concat(F.lit("w"), F.pmod(F.xxhash64(value), F.lit(keys)).cast("string"))


def discard(outputs: DataFrame, epoch: int) -> None:
    """The demo's sink: the word counts are dropped, the demo shows each epoch's metrics (over
    Spark Connect it runs on the server, so it holds nothing of the client's)."""


class EpochFeed:
    """The committed epochs after ``after``, each printed once as a line, from ``read`` (the
    metrics, as dicts, of the kept epochs after the epoch it is given). Each row gets the
    phase of the migration it ran in, exactly, from the plan's ``handle``: ``steady`` before
    the plan's first step, ``migrating`` from it to its last, ``after`` past it. The handle is
    asked after the metrics are read, so it knows every step up to the epochs read: a live
    handle learns of a step at its commit, before the epoch's metrics are recorded, and a
    posted one from the checkpoint's commits, which are written no later than the metrics of
    their epochs."""

    def __init__(self, read: Callable[[int], list[dict[str, Any]]], after: int) -> None:
        self.read = read
        self.last = after
        self.rows: list[dict[str, Any]] = []
        self.handle: MigrationHandle | None = None

    def poll(self) -> None:
        """Print and keep the epochs committed since the last poll."""
        new = [m for m in self.read(self.last) if m["epoch"] > self.last]
        handle = self.handle
        done = handle is not None and handle.done
        steps = handle.progress.epochs if handle is not None else []
        for m in new:
            if not steps or m["epoch"] < min(steps):
                phase = "steady"
            elif not done or m["epoch"] <= max(steps):
                phase = "migrating"
            else:
                phase = "after"
            self.rows.append({**m, "phase": phase})
            self.last = m["epoch"]
            latency = m["latency_s"] if m["latency_s"] is not None else float("nan")
            print(f"epoch {m['epoch']:4d}  records {m['records_in']:7d}  latency "
                  f"{latency * 1000:7.0f} ms  bins moved {m['bins_moved']:3d}  keys moved "
                  f"{m['keys_moved']:7d}  workers {m['workers']}  [{phase}]", flush=True)

    def migrated(self) -> bool:
        """True once the plan is done and its last step's epoch is printed."""
        handle = self.handle
        if handle is None or not handle.done:
            return False
        steps = handle.progress.epochs
        return not steps or self.last >= max(steps)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print one line per epoch and a summary."""
    from megaphone.spark import is_connect, spark_session

    spark = spark_session(args.master, "megaphone-demo")
    connect = is_connect(spark)
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="megaphone-demo-")
    checkpoint = args.checkpoint
    if connect and checkpoint is None:  # a server on this host reaches a local path
        checkpoint = state_dir.rstrip("/") + "-checkpoint"
    pipe = Pipeline(spark, state_dir, key="word", update="count", workers=2,
                    num_bins=args.bins, backend=args.backend, key_type="str",
                    event_time="timestamp", checkpoint=checkpoint)
    stream = (
        spark.readStream.format("rate").option("rowsPerSecond", args.rate)
        .option("numPartitions", 2).load()
        .select(words(F.col("value"), args.keys).alias("word"), "timestamp")
    )
    where = f", checkpoint {checkpoint}" if checkpoint is not None else ""
    print(f"megaphone demo: word count, {args.rate} records/s, {args.keys} words, "
          f"{args.bins} bins, state in {state_dir}{where}", flush=True)
    feed = EpochFeed(committed_metrics(pipe, checkpoint if connect else None), pipe.epoch)
    # Over Spark Connect the query's checkpoint is one the server reaches: the pipeline's.
    location = f"{checkpoint.rstrip('/')}/{STREAM_CHECKPOINT}" if connect and checkpoint else None
    query = pipe.start(stream, discard, trigger={"processingTime": "1 second"},
                       checkpoint_location=location)
    started = time.time()

    def follow(until: Callable[[], bool], limit: float, since: float = started) -> None:
        while not until() and query.isActive and time.time() - since < limit:
            feed.poll()
            time.sleep(POLL_S)

    handle = None
    try:
        # The steady phase: ``steady`` seconds and one epoch at least (a cold cluster's first
        # epoch may take longer; over Spark Connect a plan is checked against a commit).
        follow(lambda: time.time() - started >= args.steady and bool(feed.rows),
               args.duration * 4)
        moves = scale_out_moves(pipe, 4)
        plan = make_plan(pipe.routing, moves, "fluid")  # turns about the two new workers
        print(f"--- submitting a fluid plan: {len(moves)} bins to 2 new workers, one per epoch",
              flush=True)
        handle = feed.handle = pipe.migrate(plan)
        follow(feed.migrated, args.duration * 4, since=time.time())
        p = handle.progress
        if handle.wait(0):  # a plan the pipeline rejected raises its PlanError
            print(f"--- migration done: {p.bins_done} bins, {moved_bytes(feed.rows)} bytes "
                  "moved", flush=True)
        else:
            print(f"--- migration not done after {args.duration * 4:.0f} s: {p.bins_done}/"
                  f"{p.bins_total} bins committed", flush=True)
        follow(lambda: False, args.duration)
    finally:
        pipe.stop()
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
    feed.poll()  # the epochs committed while the stream stopped
    summarize(feed.rows, handle)
    temp = checkpoint if connect and args.checkpoint is None else None
    print(next_steps(state_dir, kept=args.state_dir is not None, checkpoint=temp,
                     traced=not connect))
    return 0


def committed_metrics(pipe: Pipeline, checkpoint: str | None
                      ) -> Callable[[int], list[dict[str, Any]]]:
    """What reads the metrics of the epochs committed after a given one: the pipeline's own
    (only those are turned into dicts: it keeps up to 10,000), or with ``checkpoint`` (over
    Spark Connect, where the stream runs the pipeline on the server) those the server writes
    to the checkpoint's driver copy as it commits, read again each time."""
    if checkpoint is None:
        return lambda after: [m.to_dict() for m in pipe.metric_records() if m.epoch > after]
    return lambda after: DriverCopy(checkpoint).metrics()


def moved_bytes(rows: list[dict[str, Any]]) -> int:
    """Bytes the migrating epochs shipped, as their metrics record it (over Spark Connect the
    plan's handle does not follow bytes)."""
    return sum(r["bytes_moved"] for r in rows if r["phase"] == "migrating")


def next_steps(state_dir: str, kept: bool, checkpoint: str | None = None,
               traced: bool = True) -> str:
    """What to try next on the demo's state (kept: a temp dir too), as the demo's last lines.
    ``checkpoint``: one the demo made beside the state (deleted with it); ``traced``: False
    when the epochs ran on a Spark Connect server, which keeps their traces in the state
    directory it opened, not in this one."""
    temp = f"{state_dir} {checkpoint}" if checkpoint is not None else state_dir
    where = "" if kept else f" (a temp dir: delete it with rm -r {temp})"
    explain = (f"  megaphone explain --state-dir {state_dir}   # what the slowest epochs waited for"
               if traced else "  (megaphone explain: the epochs ran on the Spark Connect server, "
               "which keeps their traces in its own state directory, not here)")
    return (f"\nthe pipeline's state is in {state_dir}{where}; try next:\n"
            f"  megaphone inspect --state-dir {state_dir}   # workers, bins, keys, skew\n"
            f"{explain}\n"
            f"  megaphone plan --state-dir {state_dir} --workers 3 --strategy batched"
            " -o plan.json\n"
            f"  megaphone migrate --state-dir {state_dir} plan.json   # offline, while stopped")


def summarize(rows: list[dict[str, Any]], handle: MigrationHandle | None) -> None:
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
              f"keys, {moved_bytes(rows)} bytes in {span:.1f} s; workers "
              f"{rows[0]['workers']} -> {rows[-1]['workers']}; no epoch paused")
