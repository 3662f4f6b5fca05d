"""``megaphone explain`` on a run with one deliberately slowed worker (issue #18's acceptance):
the slowed worker's apply must rank first among the work on the critical paths.

A keyed count written as a general Python update runs ``--epochs`` epochs of ``--records``
records over ``--keys`` keys on ``--workers`` workers; the update burns ``--cost-us``
microseconds of CPU per record of every key whose bin worker ``--slow`` owns (nothing else
differs), and a fluid plan moves ``--move`` bins between two other workers in the middle, so
the window holds exports and installs too. Then ``megaphone explain`` ranks the traced epochs
(the first ``--warmup`` left out);
the script prints its report, checks the ranking (exit 1 if the slowed worker's apply is not
first by kind and worker, or the worker not first by own work) and writes the JSON and the
timeline plot to ``--out``.

    python bench/explain_slowed.py --out bench/results/explain-slowed
    python bench/explain_slowed.py --quick --out /tmp/explain-smoke     # a smoke test
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from tqdm import tqdm

from megaphone import Pipeline
from megaphone.explain_cmd import explain, load_traces, plot, render
from megaphone.plans import make_plan
from megaphone.routing.bins import bin_of
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move, RoutingTable
from megaphone.spark import spark_session


def slowed_count(slow_keys: frozenset[int], cost_s: float):
    """A count that burns ``cost_s`` of CPU per record of the keys in ``slow_keys``."""
    def update(key: int, values: list[Any], state: int | None) -> tuple[int, list[int]]:
        if key in slow_keys:
            until = time.perf_counter() + cost_s * len(values)
            while time.perf_counter() < until:
                pass
        total = (state or 0) + len(values)
        return total, [total]
    return update


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the pipeline, explain it, check the ranking; the results as a JSON-ready dict."""
    spark = spark_session(args.master, "megaphone-explain-slowed")
    state = args.out / "state"
    shutil.rmtree(state, ignore_errors=True)
    keys = list(range(args.keys))
    # a new pipeline's owners: the initial routing of its bins over its workers
    owners = RoutingTable.initial(Fingerprint("probe", args.bins, "int64"), args.workers).owners()
    bins = bin_of(keys, args.bins)
    slow = frozenset(k for k, b in zip(keys, bins, strict=True) if owners[b] == args.slow)
    pipe = Pipeline(spark, str(state), key="k", update=slowed_count(slow, args.cost_us / 1e6),
                    workers=args.workers, num_bins=args.bins, output_type="long")
    src, dst = [w for w in range(args.workers) if w != args.slow][:2]
    moving = [int(b) for b in range(args.bins) if owners[b] == src][:args.move]
    rng = random.Random(7)
    epoch_s = []
    for e in tqdm(range(args.epochs), desc="epochs", disable=args.no_progress):
        if e == args.epochs // 3:
            pipe.migrate(make_plan(pipe.routing, [Move(b, src, dst) for b in moving], "fluid"))
        batch = spark.createDataFrame([(rng.choice(keys),) for _ in range(args.records)],
                                      "k long")
        t0 = time.perf_counter()
        pipe.process_arrow(batch)
        epoch_s.append(time.perf_counter() - t0)
    pipe.close()
    traces = load_traces(str(state), f"{args.warmup}:")
    info, report = explain(traces, top=args.top)
    print(render(info))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(traces, report, str(args.out / "explain.png"), top=args.top)
    expected = f"apply w{args.slow}"
    ranked_first = next(iter(info["by_activity"])) == expected
    straggler = next(iter(info["by_worker"])) == str(args.slow)
    return {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "slow_keys": len(slow),
        "moved_bins": moving,
        "epoch_s": epoch_s,
        "explain": info,
        "slowed_apply_first": ranked_first,
        "slowed_worker_first": straggler,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run, print and write the results; exit 1 if the ranking is wrong."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=8000, help="records per epoch")
    p.add_argument("--keys", type=int, default=20_000, help="distinct keys")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--bins", type=int, default=64)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--slow", type=int, default=1, help="the slowed worker")
    p.add_argument("--warmup", type=int, default=3,
                   help="first epochs left out of the ranking (a cold JVM and Python workers)")
    p.add_argument("--cost-us", type=float, default=300.0,
                   help="CPU microseconds per record of the slowed worker's keys")
    p.add_argument("--move", type=int, default=4, help="bins the fluid plan moves")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", type=Path, default=Path("bench/out/explain-slowed"))
    p.add_argument("--quick", action="store_true", help="a smoke test: small and short")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.keys, args.epochs, args.bins, args.warmup = 400, 500, 6, 16, 2
        args.move, args.cost_us = 1, 2000.0
    result = run(args)
    shutil.rmtree(args.out / "state", ignore_errors=True)
    (args.out / "explain.json").write_text(json.dumps(result, indent=1))
    print(f"\nslowed worker w{args.slow}: apply first by kind and worker: "
          f"{result['slowed_apply_first']}; first by own work: {result['slowed_worker_first']}")
    print(f"wrote {args.out / 'explain.json'} and {args.out / 'explain.png'}")
    return 0 if result["slowed_apply_first"] and result["slowed_worker_first"] else 1


if __name__ == "__main__":
    sys.exit(main())
