"""Catching up a backlog: one Spark job per epoch against groups of epochs (docs/groups.md).

The backlog is ``--epochs`` epochs of ``--records`` records each, generated in the JVM
(``key = pmod(xxhash64(id), keys)`` over ids ``[e*n, (e+1)*n)``, bench/epoch_floor.py's
workload), all available at once. Two pipelines of the same keyed count catch it up in the same
process, one after the other:

* **per-epoch** -- ``Pipeline.process_arrow(epoch_frame)`` once per epoch: one job each;
* **groups** -- ``Pipeline.process_arrow(backlog, epoch_column="e")`` once: the epochs run in
  groups of ``--group-size`` (default ``auto``, Drizzle's rule), one job per group.

Both runs' outputs are checked equal, epoch by epoch. Prints the wall-clock time of each, the
speedup, and each run's amortized scheduling overhead per epoch: its time less the busiest
worker's useful time at every epoch, over the epochs. Targets (issue #19): speedup >= 3 and
groups' overhead <= 0.15 s per epoch at 60 epochs of 2,000 records. Results go to
``--out``/backlog.json.

    python bench/backlog.py                     # 60 epochs of 2,000 records
    python bench/backlog.py --smoke             # 6 epochs of 200 records: a quick check
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megaphone
from megaphone.records import EpochMetrics
from megaphone.spark import spark_session

#: Acceptance targets: groups over per-epoch jobs, and groups' overhead per epoch (seconds).
TARGET_SPEEDUP = 3.0
TARGET_OVERHEAD_S = 0.15


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--records", type=int, default=2000, help="records per epoch")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bins", type=int, default=4096)
    ap.add_argument("--backend", default="rocksdb")
    ap.add_argument("--group-size", default="auto", help="an int, or auto (Drizzle's rule)")
    ap.add_argument("--warmup", type=int, default=3, help="epochs run first, not measured")
    ap.add_argument("--smoke", action="store_true", help="6 epochs of 200 records")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "backlog"))
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.epochs, args.records, args.keys, args.bins, args.warmup = 6, 200, 50, 64, 1
    args.group_size = args.group_size if args.group_size == "auto" else int(args.group_size)
    return args


def epoch_frame(spark, lo: int, hi: int, records: int, keys: int):
    """The records of epochs ``[lo, hi)``: ``key`` and their epoch ``e``, 2 partitions."""
    from pyspark.sql import functions as F

    return spark.range(lo * records, hi * records, 1, 2).select(
        F.pmod(F.xxhash64("id"), F.lit(keys)).alias("key"),
        F.floor(F.col("id") / records).cast("long").alias("e"))


def overhead(seconds: float, records: list[EpochMetrics]) -> float:
    """Scheduling overhead per epoch: ``seconds`` less every epoch's busiest worker's useful
    time, over the epochs."""
    work = sum(max((m.useful_s or 0.0 for m in r.per_worker.values()), default=0.0)
               for r in records)
    return max(0.0, seconds - work) / max(len(records), 1)


def by_epoch(table: pa.Table, column: str | None, first: int) -> dict[int, dict]:
    """Outputs ``{epoch: {key: count}}`` (epochs from ``first`` when ``column`` is None)."""
    out: dict[int, dict] = {}
    rows = table.to_pylist()
    for row in rows:
        out.setdefault(row[column] if column else first, {})[row["key"]] = row["count"]
    return out


def main(argv: list[str] | None = None, spark=None) -> int:
    """Run the benchmark; 0 when both runs' outputs agree."""
    args = parse(argv)
    spark = spark or spark_session(f"local[{args.workers}]", "megaphone-backlog")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    outputs: dict[str, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        def pipeline(name: str, **kw: Any) -> megaphone.Pipeline:
            return megaphone.Pipeline(spark, f"{tmp}/{name}", key="key", update="count",
                                      workers=args.workers, num_bins=args.bins,
                                      backend=args.backend, key_type="int64", **kw)

        warm = pipeline("warmup")  # JVM, Python workers and store service warmed up
        for e in range(args.warmup):
            warm.process_arrow(epoch_frame(spark, e, e + 1, args.records, args.keys).drop("e"))
        warm.process_arrow(epoch_frame(spark, 0, 2, args.records, args.keys),
                           epoch_column="e")
        warm.close()

        plain = pipeline("per-epoch")
        outputs["per-epoch"] = {}
        started = time.perf_counter()
        for e in tqdm(range(args.epochs), desc="per-epoch", disable=args.no_progress):
            table = plain.process_arrow(
                epoch_frame(spark, e, e + 1, args.records, args.keys).drop("e"))
            outputs["per-epoch"].update(by_epoch(table, None, e))
        seconds = time.perf_counter() - started
        results["per-epoch"] = {"seconds": seconds, "jobs": args.epochs,
                                "overhead_per_epoch_s": overhead(seconds,
                                                                 plain.metric_records())}
        plain.close()

        grouped = pipeline("groups", group_size=args.group_size)
        started = time.perf_counter()
        with tqdm(total=1, desc="groups", disable=args.no_progress) as bar:
            table = grouped.process_arrow(epoch_frame(spark, 0, args.epochs, args.records,
                                                      args.keys), epoch_column="e")
            bar.update()
        seconds = time.perf_counter() - started
        records = grouped.metric_records()
        outputs["groups"] = by_epoch(table, "e", 0)
        sizes = [r.group_size for r in records if r.group == r.epoch]
        results["groups"] = {"seconds": seconds, "jobs": len(sizes), "group_sizes": sizes,
                             "overhead_per_epoch_s": overhead(seconds, records)}
        grouped.close()
    same = outputs["per-epoch"] == outputs["groups"]
    speedup = results["per-epoch"]["seconds"] / results["groups"]["seconds"]
    summary = {
        "args": vars(args), "machine": platform.platform(), "runs": results,
        "speedup": speedup, "outputs_equal": same,
        "targets": {"speedup": TARGET_SPEEDUP, "overhead_per_epoch_s": TARGET_OVERHEAD_S},
        "met": speedup >= TARGET_SPEEDUP and
        results["groups"]["overhead_per_epoch_s"] <= TARGET_OVERHEAD_S,
    }
    (out / "backlog.json").write_text(json.dumps(summary, indent=2))
    print(f"\n{args.epochs} epochs x {args.records} records, {args.workers} workers")
    print("| run | seconds | jobs | overhead / epoch (s) |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['seconds']:.2f} | {r['jobs']} | "
              f"{r['overhead_per_epoch_s']:.3f} |")
    print(f"speedup {speedup:.2f}x (target >= {TARGET_SPEEDUP}x); group sizes "
          f"{results['groups']['group_sizes']}; outputs equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
