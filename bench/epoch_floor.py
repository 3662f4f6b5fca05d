"""An epoch of megaphone against Spark's floor for a one-shuffle ``mapInArrow`` job.

Each epoch's input is ``--records`` records generated in the JVM (``pmod(xxhash64(id), keys)``
over ids ``[e*n, (e+1)*n)``, 2 partitions: bench/migration.py's workload). Per epoch two jobs
run on that same input, alternating which goes first so both see the same machine state:

* **floor** -- the least a one-shuffle epoch can cost on Spark: ``key % workers`` as a
  partition id, ``repartitionById(workers, ...)``, then ``mapInArrow`` counting the rows of
  each partition, ``collect()``;
* **megaphone** -- an epoch of a keyed count (``--backend``, ``--workers``, ``--bins``) that,
  like the floor's ``collect()``, ends with its outputs on the driver:
  ``Pipeline.process_arrow(df)`` (a ``pyarrow.Table``);
* **megaphone, DataFrame** -- ``Pipeline.process(df)`` of a second pipeline, whose outputs also
  become a DataFrame (one more round trip to the JVM); shown, not held to the target.

Each is timed wall-clock around the whole call (building the job and running it); the order
of the three rotates from epoch to epoch. After ``--warmup`` epochs, ``--epochs`` are measured;
prints the median and p90 of each, the ratio of megaphone's median to the floor's, and
megaphone's epoch split into its driver phases (``phases_s`` of ``Pipeline.metrics()``), the
slowest worker's per-worker ``*_s`` timings and what no phase accounts for.

    python bench/epoch_floor.py                      # 2,000 records/epoch, 40 epochs
    python bench/epoch_floor.py --records 20000 --epochs 20 --json /tmp/floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megaphone
from megaphone.spark import spark_session

#: Acceptance target of megaphone's median epoch over the floor's, at 2,000 records per epoch.
TARGET_RATIO = 1.15


def epoch_frame(spark, epoch: int, records: int, keys: int):
    """Epoch ``epoch``'s input: column ``key`` = ``pmod(xxhash64(id), keys)``, 2 partitions."""
    from pyspark.sql import functions as F

    lo = epoch * records
    return spark.range(lo, lo + records, 1, 2).select(
        F.pmod(F.xxhash64("id"), F.lit(keys)).alias("key"))


def count_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body of the floor job: consume the partition, yield its row count."""
    n = 0
    for batch in batches:
        n += batch.num_rows
    yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})


def floor_job(spark, epoch: int, args: argparse.Namespace) -> float:
    """Build and run the floor job for ``epoch``; its wall-clock seconds."""
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    df = epoch_frame(spark, epoch, args.records, args.keys)
    rows = (df.withColumn("_w", (F.col("key") % args.workers).cast("int"))
            .repartitionById(args.workers, F.col("_w"))
            .mapInArrow(count_batches, "n long")
            .collect())
    seconds = time.perf_counter() - t0
    total = sum(row.n for row in rows)
    if total != args.records:
        raise AssertionError(f"floor job of epoch {epoch} counted {total} rows, "
                             f"expected {args.records}")
    return seconds


def megaphone_epoch(pipe: megaphone.Pipeline, spark, epoch: int, args: argparse.Namespace,
                    *, as_frame: bool) -> float:
    """Run an epoch of ``pipe`` on ``epoch``'s input (``process`` when ``as_frame``, else
    ``process_arrow``); its wall-clock seconds."""
    t0 = time.perf_counter()
    batch = epoch_frame(spark, epoch, args.records, args.keys)
    if as_frame:
        pipe.process(batch)
    else:
        pipe.process_arrow(batch)
    return time.perf_counter() - t0


def p90(values: list[float]) -> float:
    """The 90th percentile (linear interpolation)."""
    return float(np.percentile(values, 90))


def ms(seconds: float) -> str:
    """Seconds as milliseconds for the tables."""
    return f"{seconds * 1e3:.1f}"


def ordered_keys(dicts: Iterable[dict[str, Any]]) -> list[str]:
    """The union of the dicts' keys, in order of first appearance."""
    seen: dict[str, None] = {}
    for d in dicts:
        seen.update(dict.fromkeys(d))
    return list(seen)


def is_number(value: Any) -> bool:
    """A real number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def phase_breakdown(records: list[dict[str, Any]], process_s: list[float]) -> dict[str, Any]:
    """Medians of the driver phases, of the slowest worker's ``*_s`` and of what is left over.

    ``records`` are the measured epochs' ``Pipeline.metrics()`` rows, ``process_s`` the
    matching ``process()`` times.
    """
    phases = [r.get("phases_s") or {} for r in records]
    driver: dict[str, dict[str, float]] = {}
    for name in ordered_keys(phases):
        values = [p[name] for p in phases if is_number(p.get(name))]
        if values:
            driver[name] = {"median_s": statistics.median(values), "p90_s": p90(values),
                            "epochs": len(values)}
    unaccounted = [t - sum(v for v in p.values() if is_number(v))
                   for p, t in zip(phases, process_s, strict=True) if p]
    workers = [list((r.get("per_worker") or {}).values()) for r in records]
    names = [k for k in ordered_keys(m for ws in workers for m in ws) if k.endswith("_s")]
    per_worker: dict[str, dict[str, float]] = {}
    for name in names:
        maxima = [max(vals) for ws in workers
                  if (vals := [m[name] for m in ws if is_number(m.get(name))])]
        if maxima:
            per_worker[name] = {"median_max_s": statistics.median(maxima),
                                "p90_max_s": p90(maxima), "epochs": len(maxima)}
    return {"driver": driver, "per_worker_max": per_worker,
            "unaccounted_median_s": statistics.median(unaccounted) if unaccounted else None}


def print_breakdown(bd: dict[str, Any], process_median: float) -> None:
    """Print the phase tables of :func:`phase_breakdown`."""
    print()
    if not bd["driver"]:
        print("no phase timings recorded")
    else:
        print("## megaphone driver phases (`phases_s`), median over epochs")
        print("| phase | median ms | p90 ms | % of process() median | epochs |")
        print("|---|---:|---:|---:|---:|")
        for name, s in bd["driver"].items():
            print(f"| {name} | {ms(s['median_s'])} | {ms(s['p90_s'])} | "
                  f"{100 * s['median_s'] / process_median:.0f}% | {s['epochs']} |")
        if bd["unaccounted_median_s"] is not None:
            u = bd["unaccounted_median_s"]
            print(f"| unaccounted (process() - sum of phases) | {ms(u)} | | "
                  f"{100 * u / process_median:.0f}% | |")
    print()
    if not bd["per_worker_max"]:
        print("no per-worker timings recorded")
        return
    print("## megaphone worker timings (`per_worker`), median over epochs of the max over workers")
    print("| key | median of max ms | p90 of max ms | epochs |")
    print("|---|---:|---:|---:|")
    for name, s in bd["per_worker_max"].items():
        print(f"| {name} | {ms(s['median_max_s'])} | {ms(s['p90_max_s'])} | {s['epochs']} |")


def machine() -> dict[str, Any]:
    """The machine the run is on."""
    import pyspark

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"nproc": cpus, "platform": platform.platform(),
            "python": platform.python_version(), "pyspark": pyspark.__version__,
            "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None}


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved floor and megaphone epochs, then print the comparison."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=lambda s: int(float(s)), default=2000,
                   help="records per epoch")
    p.add_argument("--epochs", type=int, default=40, help="measured epochs")
    p.add_argument("--warmup", type=int, default=5, help="epochs run first, not measured")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bins", type=int, default=4096)
    p.add_argument("--keys", type=lambda s: int(float(s)), default=100_000,
                   help="distinct int keys")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--backend", default="rocksdb")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.warmup < 0:
        p.error("--epochs must be >= 1 and --warmup >= 0")

    mach = machine()
    command = "python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    print(f"# epoch_floor: nproc {mach['nproc']}, {mach['platform']}, Python {mach['python']}, "
          f"PySpark {mach['pyspark']}")
    print(f"# command: {command}")
    print(f"# {args.records:,} records/epoch over {args.keys:,} keys, {args.workers} workers, "
          f"{args.bins} bins, backend {args.backend}, master {args.master}; "
          f"{args.warmup} warmup + {args.epochs} measured epochs")

    spark = spark_session(args.master, "epoch-floor")
    names = ("floor", "megaphone", "megaphone-df")
    times: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="epoch-floor-") as tmp:
        pipes = {name: megaphone.Pipeline(spark, str(Path(tmp) / name), key="key",
                                          update="count", workers=args.workers,
                                          num_bins=args.bins, backend=args.backend)
                 for name in names[1:]}
        try:
            runs: dict[str, Callable[[int], float]] = {
                "floor": lambda e: floor_job(spark, e, args),
                "megaphone": lambda e: megaphone_epoch(pipes["megaphone"], spark, e, args,
                                                       as_frame=False),
                "megaphone-df": lambda e: megaphone_epoch(pipes["megaphone-df"], spark, e,
                                                          args, as_frame=True),
            }
            total = args.warmup + args.epochs
            for epoch in tqdm(range(total), desc="epochs", leave=False):
                order = names[epoch % 3:] + names[:epoch % 3]
                seconds = {name: runs[name](epoch) for name in order}
                if epoch >= args.warmup:
                    for name in names:
                        times[name].append(seconds[name])
            records = pipes["megaphone"].metrics()[-args.epochs:]
        finally:
            for pipe in pipes.values():
                pipe.close()
    if len(records) != args.epochs:
        raise AssertionError(f"{len(records)} metrics records for {args.epochs} epochs")
    applied = [r.get("records_in") for r in records]
    if any(n != args.records for n in applied if n is not None):
        raise AssertionError(f"megaphone applied {applied} records, expected {args.records}")

    floor_s, mega_s, frame_s = (times[name] for name in names)
    f_med, m_med = statistics.median(floor_s), statistics.median(mega_s)
    ratio = m_med / f_med
    print()
    print(f"## epoch wall-clock, {args.epochs} epochs (ms)")
    print("| job | median | p90 | min | max |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in (("floor (repartitionById + mapInArrow, collect)", floor_s),
                     ("megaphone (Pipeline.process_arrow)", mega_s),
                     ("megaphone, DataFrame (Pipeline.process)", frame_s)):
        print(f"| {name} | {ms(statistics.median(ts))} | {ms(p90(ts))} | {ms(min(ts))} | "
              f"{ms(max(ts))} |")
    print(f"| megaphone - floor | {ms(m_med - f_med)} | | | |")
    print(f"| megaphone, DataFrame - floor | {ms(statistics.median(frame_s) - f_med)} | | | |")
    bd = phase_breakdown(records, mega_s)
    print_breakdown(bd, m_med)

    if args.json is not None:
        result = {
            "command": command, "machine": mach, "config": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "floor_s": floor_s, "megaphone_s": mega_s,
            "floor": {"median_s": f_med, "p90_s": p90(floor_s)},
            "megaphone": {"median_s": m_med, "p90_s": p90(mega_s)},
            "megaphone_dataframe_s": frame_s,
            "megaphone_dataframe": {"median_s": statistics.median(frame_s),
                                    "p90_s": p90(frame_s)},
            "ratio_of_medians": ratio, "phases": bd,
            "phases_s_per_epoch": [r.get("phases_s") for r in records],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    print()
    verdict = "within" if ratio <= TARGET_RATIO else "over"
    print(f"target: megaphone/floor <= {TARGET_RATIO:.2f}x at 2,000 records/epoch ({verdict})")
    print(f"megaphone/floor: {ratio:.2f}x (median {m_med * 1e3:.0f} ms vs {f_med * 1e3:.0f} ms)")
    print(f"megaphone with a DataFrame/floor: {statistics.median(frame_s) / f_med:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
