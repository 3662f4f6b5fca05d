"""Hot keys split across workers (dual mode) against the same pipeline with every key at its owner.

Workload: a Zipf-skewed stream of string keys where one key, ``hot``, carries ``--hot-share`` of
the records (default 60%; the rest Zipf(``--zipf``) over ``--keys`` keys), and an update that
costs real per-record work in Python: a :class:`megaphone.Combiner` whose ``fold`` runs
``--work`` rounds of an LCG per record (its state: count and a checksum). Two pipelines, 2
workers each, run side by side on ``local[2]`` (2 cores):

* **unsplit** -- hot keys watched (``watch_hot_keys``), every key applied at its owner: the hot
  key's owner folds all of its records alone, the long pole of every epoch;
* **split** -- ``split_hot_keys(ShareThreshold(share=0.2))``: from the epoch after the hot key
  is seen, its records are folded by lessee tasks (the input's 2 partitions) and the partials
  consolidated at its owner.

Phase 1, **capacity** (closed loop): ``--epochs`` epochs of ``--records`` records each, the two
pipelines alternating epoch by epoch (which goes first rotates) so both see the same machine;
capacity = records / seconds over the measured epochs (after ``--warmup``). Phase 2,
**latency** (open loop): each pipeline in turn gets a batch every ``--interval`` seconds at
``--load`` x the unsplit capacity measured in phase 1 (the same rate for both); an epoch's
latency is its commit time minus the end of its batch's arrival interval (a backlog counts);
p50/p99 over ``--latency-epochs`` epochs. Every epoch's outputs and the final states of the
two pipelines are compared: the run fails if they differ.

What 2 cores can give: with a hot share ``h`` and ``s`` the speedup of two processes running the
update's work at once over one (2 on two ideal cores), the unsplit owner's work runs alone
after the other worker is done and the split job keeps both cores busy, so the capacity ratio
is at most ``1 - h + h * s`` (1.6x for ``h`` = 0.6 and ``s`` = 2), fixed costs left out. The
run measures ``s`` itself, one round per measured capacity epoch in between the pipelines'
epochs (``Checksum.fold`` of ``--calibrate-records`` records in one process, then in two at
once), and reports the ceiling beside the ratio.

    python bench/hot_keys.py --smoke               # a minute; numbers mean nothing
    python bench/hot_keys.py                       # the full run (RESULTS.md)
    python bench/hot_keys.py --out bench/results/hot-keys

Writes ``summary.json`` and ``summary.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megaphone
from megaphone.spark import spark_session

if __name__ != "__main__":  # imported (the smoke test): Spark's workers cannot import us by name
    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

MASK = (1 << 61) - 1
SIZES = {
    "smoke": {"records": 4000, "work": 20, "epochs": 2, "warmup": 1, "latency_epochs": 2,
              "interval": 0.5, "keys": 2000, "calibrate_records": 200},
    # ~125 us of Python per record: the hot key's owner folds ~3 s per epoch unsplit, well
    # above an epoch's fixed cost on Spark (a few hundred ms on 2 quiet cores)
    "full": {"records": 40_000, "work": 1000, "epochs": 10, "warmup": 3, "latency_epochs": 20,
             "interval": 6.0, "keys": 100_000, "calibrate_records": 8000},
}


class Checksum(megaphone.Combiner):
    """Per record ``work`` rounds of an LCG (the per-record cost), summed mod 2**61 with the
    count: commutative, associative, and ``fold`` a homomorphism, so it can be split."""

    def __init__(self, work: int) -> None:
        self.work = work

    def fold(self, key: Any, values: list) -> list[int]:
        acc = 0
        for v in values:
            x = v
            for _ in range(self.work):
                x = (x * 6364136223846793005 + 1442695040888963407) & MASK
            acc = (acc + x) & MASK
        return [len(values), acc]

    def combine(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], (a[1] + b[1]) & MASK]

    def outputs(self, key: Any, state: list[int]) -> list[int]:
        return [state[0]]


def batch(rng: np.random.Generator, n: int, keys: int, hot_share: float, zipf: float
          ) -> pa.Table:
    """``n`` records: ``hot`` with probability ``hot_share``, else a Zipf-distributed key."""
    ranks = rng.zipf(zipf, n) % keys
    names = np.char.add("k", ranks.astype(str)).astype(object)
    names[rng.random(n) < hot_share] = "hot"
    return pa.table({"key": pa.array(names, pa.string()),
                     "value": pa.array(rng.integers(0, 1 << 30, n), pa.int64())})


def make_pipeline(spark: Any, root: str, name: str, work: int, split: bool, bins: int
                  ) -> megaphone.Pipeline:
    pipe = megaphone.Pipeline(spark, os.path.join(root, name), key="key", value="value",
                              update=Checksum(work), workers=2, backend="memory",
                              num_bins=bins, key_type="str", output_type="bigint")
    if split:
        pipe.split_hot_keys(megaphone.ShareThreshold(share=0.2, min_records=100))
    else:
        pipe.watch_hot_keys()
    return pipe


def run_epoch(pipe: megaphone.Pipeline, df: Any, input_end: float | None = None
              ) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = pipe.process_arrow(df, input_end=input_end)
    took = time.perf_counter() - t0
    return took, dict(zip(out.column(0).to_pylist(), out.column(1).to_pylist(), strict=True))


def fold_seconds(work: int, n: int) -> float:
    """Seconds ``Checksum(work).fold`` takes over ``n`` records here (the calibration's unit)."""
    t0 = time.perf_counter()
    Checksum(work).fold("calibration", list(range(n)))
    return time.perf_counter() - t0


def parallel_speedup(pool: Any, work: int, n: int) -> float:
    """One calibration round: how much more of the update's work two processes do at once
    than one alone (2.0 on two ideal cores)."""
    one = pool.apply(fold_seconds, (work, n))
    two = max(pool.starmap(fold_seconds, [(work, n)] * 2))
    return 2 * one / two


def capacity(pipes: dict, frames: list, warmup: int, records: int, calibrate: Any) -> dict:
    """Closed loop, alternating: records/s of each pipeline over the epochs after ``warmup``,
    the median of the epochs' paired ratios, and a calibration round (``calibrate()``, the
    machine's parallel speedup) per measured epoch."""
    took: dict[str, list[float]] = {name: [] for name in pipes}
    speedups = []
    for i, df in enumerate(frames):
        order = list(pipes) if i % 2 == 0 else list(pipes)[::-1]
        outs = {}
        for name in order:
            seconds, outs[name] = run_epoch(pipes[name], df)
            print(f"capacity epoch {i} {name}: {seconds:.2f} s", file=sys.stderr)
            if i >= warmup:
                took[name].append(seconds)
        if outs["split"] != outs["unsplit"]:
            raise AssertionError(f"epoch {i}: split outputs differ from unsplit ones")
        if i >= warmup:
            speedups.append(calibrate())
            print(f"calibration {i}: two processes {speedups[-1]:.2f}x one", file=sys.stderr)
    out: dict[str, Any] = {name: {"records_per_s": records * len(t) / sum(t),
                                  "epoch_s_median": statistics.median(t)}
                           for name, t in took.items()}
    out["paired_ratio_median"] = statistics.median(
        u / s for u, s in zip(took["unsplit"], took["split"], strict=True))
    out["parallel_speedups"] = [round(x, 3) for x in speedups]
    out["parallel_speedup_median"] = statistics.median(speedups)
    return out


def latency(pipe: megaphone.Pipeline, frames: list, interval: float) -> dict:
    """Open loop: batch ``i`` has fully arrived at ``t0 + (i + 1) * interval``; its epoch starts
    then or when the previous one ends; latency = commit - arrival end."""
    t0 = time.time()
    lat = []
    for i, df in enumerate(frames):
        arrived = t0 + (i + 1) * interval
        wait = arrived - time.time()
        if wait > 0:
            time.sleep(wait)
        run_epoch(pipe, df, input_end=arrived)
        lat.append(time.time() - arrived)
        print(f"latency epoch {i}: {lat[-1]:.2f} s", file=sys.stderr)
    ordered = sorted(lat)
    p99 = ordered[min(len(ordered) - 1, int(np.ceil(0.99 * len(ordered))) - 1)]
    return {"p50_s": statistics.median(lat), "p99_s": p99, "max_s": max(lat)}


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """Run both phases and write the summary; 0 on success."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    for name, kind in (("records", int), ("work", int), ("epochs", int), ("warmup", int),
                       ("latency-epochs", int), ("interval", float), ("keys", int),
                       ("calibrate-records", int)):
        p.add_argument(f"--{name}", type=kind, default=None)
    p.add_argument("--hot-share", type=float, default=0.6)
    p.add_argument("--bins", type=int, default=4096, help="bins per pipeline")
    p.add_argument("--zipf", type=float, default=1.2)
    p.add_argument("--load", type=float, default=0.9,
                   help="open-loop rate, as a fraction of the unsplit capacity")
    p.add_argument("--out", default=None, help="directory for summary.json and summary.md")
    args = p.parse_args(argv)
    size = dict(SIZES["smoke" if args.smoke else "full"])
    for name in size:
        if getattr(args, name) is not None:
            size[name] = getattr(args, name)
    spark = spark or spark_session("local[2]", "megaphone-bench-hot-keys")
    rng = np.random.default_rng(20)
    n_cap = size["warmup"] + size["epochs"]
    tables = [batch(rng, size["records"], size["keys"], args.hot_share, args.zipf)
              for _ in range(n_cap)]
    share = sum(pa.compute.sum(pa.compute.equal(t.column("key"), "hot")).as_py()
                for t in tables) / (size["records"] * n_cap)
    frames = [spark.createDataFrame(t) for t in tables]
    with tempfile.TemporaryDirectory() as root:
        pipes = {name: make_pipeline(spark, root, name, size["work"], name == "split",
                                     args.bins)
                 for name in ("unsplit", "split")}
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            pool.starmap(fold_seconds, [(size["work"], 10)] * 2)  # both processes started
            cap = capacity(pipes, frames, size["warmup"], size["records"], lambda: (
                parallel_speedup(pool, size["work"], size["calibrate_records"])))
        rate = args.load * cap["unsplit"]["records_per_s"]
        n_lat = max(1, int(rate * size["interval"]))
        lat_frames = [spark.createDataFrame(batch(rng, n_lat, size["keys"], args.hot_share,
                                                  args.zipf))
                      for _ in range(size["latency_epochs"])]
        lat = {name: latency(pipes[name], lat_frames, size["interval"]) for name in pipes}
        states = {name: {r[0]: bytes(r[1]) for r in pipe.state().collect()}
                  for name, pipe in pipes.items()}
        if states["split"] != states["unsplit"]:
            raise AssertionError("the split pipeline's final state differs from the unsplit one's")
        split_records = sum(m["split_records"] for m in pipes["split"].metrics())
        hot = pipes["unsplit"].hot_keys().counters[:3]
        for pipe in pipes.values():
            pipe.close()
    summary = {
        "size": "smoke" if args.smoke else "full", **size, "hot_share": round(share, 4),
        "zipf": args.zipf, "bins": args.bins, "load": args.load, "open_loop_rate": rate,
        "capacity": cap, "latency": lat,
        "capacity_ratio": cap["split"]["records_per_s"] / cap["unsplit"]["records_per_s"],
        "ceiling": 1 - share + share * cap["parallel_speedup_median"],
        "p99_ratio": lat["split"]["p99_s"] / lat["unsplit"]["p99_s"],
        "split_records": split_records, "hot_keys_seen": [list(h) for h in hot],
        "check": "ok: outputs of every epoch and final states equal",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg": os.getloadavg()},
    }
    md = [
        f"hot key share {share:.0%}, {size['records']} records/epoch, work {size['work']}",
        "",
        "| run | capacity (records/s) | p50 latency (s) | p99 latency (s) |",
        "|---|---|---|---|",
        *(f"| {n} | {cap[n]['records_per_s']:.0f} | {lat[n]['p50_s']:.3f} | "
          f"{lat[n]['p99_s']:.3f} |" for n in ("unsplit", "split")),
        "",
        f"capacity split/unsplit: {summary['capacity_ratio']:.2f}x (median of the epochs' "
        f"paired ratios {cap['paired_ratio_median']:.2f}x); p99 split/unsplit: "
        f"{summary['p99_ratio']:.2f} (open loop at {rate:.0f} records/s)",
        f"two processes ran the update's work {cap['parallel_speedup_median']:.2f}x as fast as "
        f"one (median of {len(cap['parallel_speedups'])} rounds): ceiling 1 - h + h * s = "
        f"{summary['ceiling']:.2f}x; attained {summary['capacity_ratio'] / summary['ceiling']:.0%}",
    ]
    print("\n".join(md))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        (out / "summary.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
