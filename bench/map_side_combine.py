"""Would grouping a window stage's records in the JVM, before the shuffle, make its epoch
cheaper? The job's shape without megaphone's work in it, both ways, on the same files.

Writes ``--epochs`` epochs of NEXMark bids (``--rate`` events per second, 2 s each) as parquet,
then times, per epoch file, Spark's side of a window stage's epoch (``local[2]``):

* ``rows`` -- read the file, give each bid its bin and worker (``xxhash64`` as megaphone
  routes), shuffle to one partition per worker (``repartitionById``), hand the rows to Python
  (``mapInArrow``, which only counts them): every record crosses the shuffle and the JVM ->
  Python boundary, as megaphone's epoch does today;
* ``grouped`` -- the same, grouped by ``(worker, bin, auction, 10 s window)`` first (count,
  latest event time, count, sum, min and max of the price: what a window's fold needs), so
  only the groups reach Python. Spark's ``groupBy`` brings its own shuffle (its partial
  aggregate runs before it), so this job has two.

Prints the median seconds of each way over the epochs after the first two, in two alternating
rounds, and how many rows reached Python. What it chose: bench/RESULTS.md, "Window states
packed and folded in columns".

    python bench/map_side_combine.py --rate 100000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megaphone.nexmark import definitions as D
from megaphone.nexmark.generator import NexmarkConfig, generate
from megaphone.routing.bins import bin_column
from megaphone.spark import spark_session

WAYS = ("rows", "grouped")


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=100_000, help="events per second")
    p.add_argument("--epochs", type=int, default=12, help="epoch files, each timed both ways")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", type=Path, help="also write the medians here")
    return p


def _count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A worker's stand-in: the rows it got, read column by column."""
    n = 0
    for batch in batches:
        n += batch.num_rows
        for column in batch.columns:
            column.to_numpy(zero_copy_only=False)
    yield pa.record_batch({"n": pa.array([n], pa.int64())})


def job(spark: SparkSession, path: str, way: str, workers: int) -> DataFrame:
    """One epoch's job of ``way`` over the bids in ``path``."""
    bids = spark.read.parquet(path)
    key = F.col("auction")
    b = bin_column(key, 4096, "int64")
    t = F.unix_micros(F.col("date_time").cast("timestamp"))
    routed = bids.select(F.pmod(b, F.lit(workers)).cast("int").alias("_w"), b.alias("_bin"),
                         key.alias("key"), F.col("price").alias("value"), t.alias("_t"))
    if way == "grouped":
        window = F.col("_t") - F.pmod(F.col("_t"), F.lit(D.Q7_SIZE_US))
        routed = routed.groupBy("_w", "_bin", "key", window.alias("_p")).agg(
            F.count(F.lit(1)).alias("_c"), F.max("_t").alias("_t"),
            F.count("value").alias("_n"), F.try_sum("value").alias("_s"),
            F.min("value").alias("_lo"), F.max("value").alias("_hi"))
    return routed.repartitionById(workers, F.col("_w")).mapInArrow(_count, "n long")


def main(argv: list[str] | None = None) -> None:
    """Write the files, time both ways, print the medians."""
    args = parser().parse_args(argv)
    spark = spark_session("local[2]", "map-side-combine")
    per_epoch = int(args.rate * 2)
    config = NexmarkConfig(events_per_second=args.rate)
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    rows: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for e in range(args.epochs):
            path = f"{folder}/bids-{e}.parquet"
            pq.write_table(generate(config, e * per_epoch, per_epoch).bids.select(
                ["auction", "price", "date_time"]), path)
            paths.append(path)
        for _ in range(2):  # two rounds, alternating
            for way in WAYS:
                times = []
                for path in paths:
                    t0 = time.perf_counter()
                    counts = job(spark, path, way, args.workers).toArrow()
                    times.append(time.perf_counter() - t0)
                rows[way] = sorted(counts.column("n").to_pylist())
                seconds[way].append(statistics.median(times[2:]))
    spark.stop()
    print(f"{per_epoch:,} events an epoch, {args.workers} workers; median s per epoch "
          "(two rounds), rows handed to Python per worker:")
    for way in WAYS:
        print(f"  {way:8s} {' / '.join(f'{s:.3f}' for s in seconds[way])}   {rows[way]}")
    if args.json:
        args.json.write_text(json.dumps({"rate": args.rate, "median_s": seconds,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
