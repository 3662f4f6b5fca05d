"""What tracing costs a steady-state epoch: epochs with SnailTrail tracing on and off, side by
side in one run (issue #18's acceptance: at most 3% of the epoch).

One pipeline (a keyed count, ``--workers``, ``--bins``) runs ``--warmup`` epochs, then
``--epochs`` measured ones; tracing (``MEGAPHONE_TRACE``, read by the driver each epoch) is
switched on and off in the order on, off, off, on, ... so both see the same machine state.
Each epoch is timed wall-clock around ``Pipeline.process_arrow``. Prints the median and p90 of
each, the ratio of the medians, and the driver's own cost of tracing measured directly (building
the epoch's trace and appending it to ``traces.jsonl``) as a share of the median epoch.

    python bench/trace_overhead.py                  # 20,000 records/epoch, 60 epochs
    python bench/trace_overhead.py --quick          # a smoke test: tiny and short
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megaphone.migrator import trace as trace_mod
from megaphone.migrator.pipeline.facade import Pipeline
from megaphone.migrator.statedir.directory import StateDir
from megaphone.spark import spark_session

#: The acceptance target: traced median epoch over untraced, at most.
TARGET_RATIO = 1.03


class _Timed:
    """Wall-clock seconds spent in the trace's build and append on the driver."""

    def __init__(self) -> None:
        self.seconds = 0.0
        build, append = trace_mod.epoch_trace, StateDir.append_trace

        def timed_build(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return build(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - t0

        def timed_append(state: StateDir, trace: Any) -> None:
            t0 = time.perf_counter()
            try:
                append(state, trace)
            finally:
                self.seconds += time.perf_counter() - t0

        import megaphone.migrator.epoch.run as epoch_mod
        epoch_mod.epoch_trace = timed_build  # the name the epoch calls
        StateDir.append_trace = timed_append  # type: ignore[method-assign]


def _p90(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.9 * len(xs)))]


def run(records: int, keys: int, workers: int, bins: int, warmup: int, epochs: int
        ) -> dict[str, Any]:
    """Run the comparison; the results as a JSON-ready dict."""
    from pyspark.sql import functions as F

    spark = spark_session(f"local[{workers}]", "megaphone-trace-overhead")
    timer = _Timed()
    times: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="megaphone-trace-bench-") as tmp:
        pipe = Pipeline(spark, os.path.join(tmp, "state"), key="key", update="count",
                        workers=workers, num_bins=bins)
        for e in range(warmup + epochs):
            mode = "on" if e % 4 in (0, 3) else "off"
            os.environ["MEGAPHONE_TRACE"] = "1" if mode == "on" else "0"
            lo = e * records
            frame = spark.range(lo, lo + records, 1, 2).select(
                F.pmod(F.xxhash64("id"), F.lit(keys)).alias("key"))
            t0 = time.perf_counter()
            pipe.process_arrow(frame)
            took = time.perf_counter() - t0
            if e >= warmup:
                times[mode].append(took)
            if e == warmup - 1:
                timer.seconds = 0.0  # only measured epochs count
        traced = len(pipe.state_dir.read_traces())
        pipe.close()
    os.environ.pop("MEGAPHONE_TRACE", None)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    direct = timer.seconds / max(1, len(times["on"]))
    return {"records": records, "workers": workers, "bins": bins, "epochs": epochs,
            "traces_stored": traced,
            "on": {"median_s": on, "p90_s": _p90(times["on"]), "n": len(times["on"])},
            "off": {"median_s": off, "p90_s": _p90(times["off"]), "n": len(times["off"])},
            "ratio": on / off, "target_ratio": TARGET_RATIO,
            "driver_trace_s": direct, "driver_trace_share": direct / off}


def main() -> None:
    """Parse the options, run, print (and write ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bins", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="tiny and short: a smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.records, args.keys, args.bins, args.warmup, args.epochs = 200, 50, 64, 2, 4
    result = run(args.records, args.keys, args.workers, args.bins, args.warmup, args.epochs)
    on, off = result["on"], result["off"]
    print(f"epochs: {result['epochs']} measured ({on['n']} traced, {off['n']} not), "
          f"{result['records']} records each, {result['workers']} workers")
    print(f"traced     median {on['median_s'] * 1e3:8.1f} ms  p90 {on['p90_s'] * 1e3:8.1f} ms")
    print(f"untraced   median {off['median_s'] * 1e3:8.1f} ms  p90 {off['p90_s'] * 1e3:8.1f} ms")
    print(f"ratio      {result['ratio']:.3f} (target <= {TARGET_RATIO})")
    print(f"driver's trace build + append: {result['driver_trace_s'] * 1e3:.2f} ms per epoch, "
          f"{100 * result['driver_trace_share']:.2f}% of the untraced median")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
