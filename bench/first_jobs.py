"""A new application's first jobs on two simulated hosts: what the probe of the Python workers
costs, and what the first epoch would pay without it.

A restarted driver runs :func:`~megaphone.spark.check_python_workers` before its first epoch: a
one-task-per-slot Python job. In the soak it takes 12-20 s, so is the probe the cost, or the
application's first jobs? This starts the soak's two simulated hosts (``tests/helpers/cluster.py``,
4 cores each; needs root) once, then ``--apps`` applications in turn, each a fresh driver
process, in two orders:

- ``probe first`` (what a restarted driver does): the probe, then the probe again;
- ``split``: a JVM-only job over every slot, the same job again, a two-task Python job (what the
  first epoch of two workers starts), then the probe.

Printed: the median seconds of each step per order, and the probe's share of a probe-first start.

    python bench/first_jobs.py
    python bench/first_jobs.py --apps 3 --json bench/results/first-jobs/run1.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from bench.epoch_floor import machine
from tests.helpers.cluster import CLUSTER_CONF, namespaces_permitted, two_hosts

#: The soak's executors: two hosts of four cores (bench/soak.py).
CONF = {**CLUSTER_CONF, "spark.executor.cores": "4", "spark.cores.max": "8",
        "spark.executor.memory": "2g"}
ORDERS = ("probe first", "split")


def one_application(master: str, order: str) -> dict[str, float]:
    """Start one application on ``master`` and time its first jobs in ``order``: seconds per
    step, in the order they ran."""
    from pyspark.sql import functions as F

    from megaphone.spark import _checked, check_python_workers, spark_session

    steps: dict[str, float] = {}

    def timed(name: str, run) -> None:
        started = time.perf_counter()
        run()
        steps[name] = time.perf_counter() - started

    def probe() -> None:
        _checked.discard(spark.sparkContext)
        check_python_workers(spark)

    started = time.perf_counter()
    spark = spark_session(master, "first-jobs", CONF)
    steps["session (executors registered)"] = time.perf_counter() - started
    identity = F.udf(lambda x: x, "long")
    if order == "probe first":
        timed("probe", probe)
        timed("probe again", probe)
    else:
        timed("JVM job, every slot", lambda: spark.range(0, 8, 1, 8).count())
        timed("JVM job again", lambda: spark.range(0, 8, 1, 8).count())
        timed("Python job, two tasks",
              lambda: spark.range(0, 2, 1, 2).select(identity("id")).collect())
        timed("probe", probe)
    spark.stop()
    return steps


def main(argv: list[str] | None = None) -> int:
    """Run ``--apps`` applications per order on the two simulated hosts; print the medians."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--apps", type=int, default=3, help="applications per order")
    p.add_argument("--json", type=Path, help="write every application's steps here")
    p.add_argument("--child", nargs=2, metavar=("MASTER", "ORDER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(one_application(*args.child)))
        return 0
    mach = machine()
    print(f"# first jobs: nproc {mach['nproc']}, {mach['platform']}, PySpark {mach['pyspark']}")
    with tempfile.TemporaryDirectory(prefix="first-jobs-") as tmp:
        base = Path(tmp)
        if not namespaces_permitted(base / "probe"):
            print("mount namespaces are not permitted here (needs root)", file=sys.stderr)
            return 2
        runs: dict[str, list[dict[str, float]]] = {o: [] for o in ORDERS}
        with two_hosts(base, "3g", cores=4) as hosts:
            for i in range(args.apps):
                for order in ORDERS if i % 2 == 0 else ORDERS[::-1]:
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", hosts.master, order],
                        capture_output=True, text=True, check=True, env=os.environ.copy())
                    steps = json.loads(out.stdout.strip().splitlines()[-1])
                    runs[order].append(steps)
                    print(f"app {i + 1} {order}: " +
                          ", ".join(f"{k} {v:.1f}" for k, v in steps.items()), flush=True)
    print(f"\n| order | step | median s (of {args.apps}) |\n|---|---|---:|")
    for order, apps in runs.items():
        for step in apps[0]:
            print(f"| {order} | {step} | {statistics.median(a[step] for a in apps):.1f} |")
    first = statistics.median(a["probe"] for a in runs["probe first"])
    split = statistics.median(sum(v for k, v in a.items() if not k.startswith("session"))
                              for a in runs["split"])
    print(f"\nprobe first: {first:.1f} s; the split order's jobs together: {split:.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": mach, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
