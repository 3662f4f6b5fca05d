"""A NEXMark epoch's outputs to the driver's rows, two ways, epoch by epoch in one process.

Per query, two instances run the same epochs back to back (closed loop, 2 workers per stage,
RocksDB, input read from parquet files as ``bench/nexmark.py`` reads it), alternating, the
first one first in even epochs:

* **frame** -- ``Chain.process`` (the last stage's outputs made a DataFrame on the driver), then
  ``toArrow()`` of it and the query's rows: what a sink that collects the outputs DataFrame
  pays, as NEXMark's harness did before it used ``process_arrow``;
* **arrow** -- ``Chain.process_arrow`` (the outputs as the epoch's job brought them), then the
  query's rows.

The two must give the same rows every epoch. Prints the median epoch (ms) of each way after
``--warmup`` epochs, their ratio, and the outputs per epoch. What it chose: bench/RESULTS.md,
"NEXMark's outputs as Arrow".

    python bench/nexmark_sink.py --queries q3,q8,q5,q7 --rate 50000
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from nexmark_input import InputFeeder

from megaphone.nexmark.generator import NexmarkConfig
from megaphone.nexmark.queries import QUERIES, NexmarkQuery
from megaphone.spark import spark_session

WAYS = ("frame", "arrow")


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", default="q3,q8,q5,q7", help="comma-separated, of "
                   + ", ".join(sorted(QUERIES)))
    p.add_argument("--rate", type=float, default=50_000, help="events per second")
    p.add_argument("--interval", type=float, default=2.0, help="seconds of events per epoch")
    p.add_argument("--epochs", type=int, default=16, help="epochs measured")
    p.add_argument("--warmup", type=int, default=4, help="epochs run first, not measured")
    p.add_argument("--master", default="local[2]")
    return p


def epoch_rows(query: NexmarkQuery, feeder: InputFeeder, spark, epoch: int, way: str
               ) -> tuple[float, list]:
    """Run ``epoch`` of ``query`` one ``way``: its seconds (from its input frames to its rows)
    and its rows."""
    frames = feeder.frames(spark, epoch)[0]
    started = time.perf_counter()
    batch = query.batch(**frames)
    table = query.chain.process_arrow(batch) if way == "arrow" else \
        query.chain.process(batch).toArrow()
    rows = query.rows(table)
    return time.perf_counter() - started, rows


def main(argv: list[str] | None = None) -> int:
    """Run every query both ways and print the medians."""
    args = parser().parse_args(argv)
    names = args.queries.split(",")
    if any(n not in QUERIES for n in names) or args.epochs < 1 or args.warmup < 0:
        raise SystemExit(f"--queries of {', '.join(sorted(QUERIES))}; --epochs >= 1")
    argv = sys.argv[1:] if argv is None else argv
    print(f"# command: python bench/nexmark_sink.py {shlex.join(argv)}")
    spark = spark_session(args.master, "megaphone-nexmark-sink", {"spark.driver.memory": "4g"})
    per_epoch = round(args.rate * args.interval)
    config = NexmarkConfig(events_per_second=args.rate,
                           num_in_flight_auctions=max(1, round(args.rate / 10)))
    print(f"{args.rate:,.0f} events/s, {per_epoch:,} events per epoch, {args.epochs} epochs "
          f"after {args.warmup} warm-up, master {args.master}; median ms per epoch\n")
    print("| query | frame | arrow | arrow / frame | rows per epoch (median) |")
    print("|---|---:|---:|---:|---:|")
    root = Path(tempfile.mkdtemp(prefix="nexmark-sink-"))
    for name in names:
        queries, feeders = {}, {}
        for way in WAYS:
            queries[way] = QUERIES[name](spark, root / name / way / "state", config=config,
                                         workers=2, num_bins=32)
            feeders[way] = InputFeeder(queries[way], config, per_epoch,
                                       root / name / way / "input", args.interval)
        seconds: dict[str, list[float]] = {w: [] for w in WAYS}
        counts = []
        for epoch in tqdm(range(args.warmup + args.epochs), desc=name, leave=False):
            got = {}
            for way in (WAYS if epoch % 2 == 0 else WAYS[::-1]):
                feeders[way].write(epoch)
                took, got[way] = epoch_rows(queries[way], feeders[way], spark, epoch, way)
                if epoch >= args.warmup:
                    seconds[way].append(took)
            if sorted(got["frame"]) != sorted(got["arrow"]):
                raise SystemExit(f"{name} epoch {epoch}: the two ways' rows differ")
            counts.append(len(got["arrow"]))
        for query in queries.values():
            query.close()
        frame, arrow = (statistics.median(seconds[w]) for w in WAYS)
        print(f"| {name} | {frame * 1e3:,.0f} | {arrow * 1e3:,.0f} | {arrow / frame:.2f}x "
              f"| {statistics.median(counts[args.warmup:]):,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
