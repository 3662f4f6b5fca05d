"""Where a NEXMark chain's epoch goes: input, each stage's job, the last collect.

Runs ``--epochs`` epochs of a NEXMark query back to back (closed loop, 2 workers per stage,
RocksDB) at ``--rate`` events per second of event time (``--interval`` seconds of events per
epoch) and times each part of an epoch the way ``NexmarkQuery.run`` does it, in order:

* **generate** -- the epoch's events generated in Python (the harness's, not megaphone's);
* **input frames** -- the query's input tables made DataFrames: with ``--input tables``
  (``NexmarkQuery.run``'s way) by ``createDataFrame`` from the driver's Arrow tables, with
  ``--input files`` written as parquet files by ``bench/nexmark.py``'s feeder
  (:class:`~nexmark_input.InputFeeder`; not timed: the feeder does it off the epoch's path)
  and read as it reads them;
* **stage i** -- ``Pipeline.process`` of each stage (its own Spark job), with its driver phases
  (``phases_s``), the slowest worker's task (``useful_s``: from its task's start to its
  outputs) and apply time, and the epochs whose input was empty;
* **stages** -- with ``--chain one-job``, ``Chain.process`` (every stage in one Spark job);
  the stages' phases and slowest tasks as above, each stage's ``collect`` being the one job;
* **collect** -- the last stage's outputs as the query's rows on the driver;
* **epoch** -- the sum of the parts (each stage once, with its phases inside).

``--chain per-stage,one-job`` runs both ways in one invocation, a query each, their epochs
alternating, and prints each one's medians (and means: Q7's epoch in five that closes windows
weighs in a capacity, not in a median) and the ratio of their epochs. What the numbers chose:
docs/operators.md, "Where a chain's epoch goes" and "A chain's epoch in one job".

    python bench/chain_epoch.py --query q7 --rate 100000 --chain per-stage,one-job
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from nexmark_input import InputFeeder

from megaphone.nexmark.generator import NexmarkConfig, generate
from megaphone.nexmark.queries import QUERIES
from megaphone.spark import spark_session


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--query", default="q7", choices=sorted(QUERIES))
    p.add_argument("--rate", type=float, default=100_000, help="events per second")
    p.add_argument("--interval", type=float, default=2.0, help="seconds of events per epoch")
    p.add_argument("--epochs", type=int, default=20, help="epochs measured")
    p.add_argument("--warmup", type=int, default=4, help="epochs run first, not measured")
    p.add_argument("--input", choices=("tables", "files"), default="tables",
                   help="the input as DataFrames of the driver's tables, or read from files")
    p.add_argument("--chain", default="per-stage",
                   help="comma-separated: per-stage (a Spark job per stage), one-job (the chain's "
                        "epoch as one job)")
    p.add_argument("--master", default="local[2]")
    return p


MODES = ("per-stage", "one-job")


def stage_times(times: dict[str, float], i: int, stage, warm: bool, empty: list[int]) -> None:
    """Stage ``i``'s phases and slowest worker's task and apply of its last epoch, into
    ``times``; counts the epoch in ``empty[i]`` when it had no input (``warm``: measured)."""
    record = stage.metric_records(1)[0]
    for name, seconds in (record.phases_s or {}).items():
        times[f"stage {i}: {name}"] = seconds
    for label, name in (("task", "useful_s"), ("apply", "apply_s")):
        times[f"stage {i}: slowest worker's {label}"] = max(
            (getattr(m, name) or 0.0 for m in record.per_worker.values()), default=0.0)
    if warm and not record.records_in:
        empty[i] += 1


def main(argv: list[str] | None = None) -> int:
    """Run the epochs and print the medians of their parts."""
    args = parser().parse_args(argv)
    if args.epochs < 1 or args.warmup < 0 or args.rate <= 0 or args.interval <= 0:
        raise SystemExit("--epochs >= 1, --warmup >= 0, --rate and --interval > 0")
    argv = sys.argv[1:] if argv is None else argv
    print(f"# command: python bench/chain_epoch.py {shlex.join(argv)}")
    modes = args.chain.split(",")
    if not modes or any(m not in MODES for m in modes) or len(set(modes)) < len(modes):
        raise SystemExit(f"--chain: a comma-separated list of {', '.join(MODES)}")
    spark = spark_session(args.master, "megaphone-chain-epoch", {"spark.driver.memory": "4g"})
    per_epoch = round(args.rate * args.interval)
    config = NexmarkConfig(events_per_second=args.rate,
                           num_in_flight_auctions=max(1, round(args.rate / 10)))
    root = Path(tempfile.mkdtemp(prefix="chain-epoch-"))
    parts: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    empty: dict[str, list[int]] = {}
    try:
        queries, feeders = {}, {}
        for mode in modes:
            queries[mode] = QUERIES[args.query](spark, root / mode / "state", config=config,
                                                workers=2, num_bins=32)
            queries[mode].chain.one_job = mode == "one-job"
            feeders[mode] = InputFeeder(queries[mode], config, per_epoch, root / mode / "input",
                                        args.interval)
            empty[mode] = [0] * len(queries[mode].stages)
        for epoch in tqdm(range(args.warmup + args.epochs), desc="epochs", leave=False):
            for mode in modes:
                times = run_epoch(args, spark, queries[mode], feeders[mode], config, per_epoch,
                                  epoch, empty[mode])
                if epoch >= args.warmup:
                    parts[mode].append(times)
        for query in queries.values():
            query.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {}
    for mode in modes:
        medians[mode] = statistics.median(p["epoch"] for p in parts[mode])
        print(f"\n# {args.query}, {mode}, {args.rate:,.0f} events/s, {per_epoch:,} events per "
              f"epoch, input {args.input}, {args.epochs} epochs after {args.warmup} warm-up, "
              f"master {args.master}")
        print("| part | median ms | mean ms | share of the epoch's median |")
        print("|---|---:|---:|---:|")
        for name in parts[mode][0]:
            value = statistics.median(p.get(name, 0.0) for p in parts[mode])
            mean = statistics.fmean(p.get(name, 0.0) for p in parts[mode])
            print(f"| {name} | {value * 1e3:,.0f} | {mean * 1e3:,.0f} | "
                  f"{100 * value / medians[mode]:.0f}% |")
        for i, count in enumerate(empty[mode]):
            print(f"stage {i}: {count} of {args.epochs} epochs had no input")
    if len(modes) == 2:
        print(f"\nepoch median, {modes[1]} / {modes[0]}: "
              f"{medians[modes[1]] / medians[modes[0]]:.2f}x")
    return 0


def run_epoch(args: argparse.Namespace, spark, query, feeder, config: NexmarkConfig,
              per_epoch: int, epoch: int, empty: list[int]) -> dict[str, float]:
    """Run ``epoch`` of ``query`` (a job per stage, or its chain's epoch as one job when its
    chain has ``one_job``) and time its parts."""
    times: dict[str, float] = {}
    warm = epoch >= args.warmup
    t0 = time.perf_counter()
    tables = query.inputs(generate(config, epoch * per_epoch, per_epoch))
    times["generate"] = time.perf_counter() - t0
    if args.input == "files":
        feeder.write_tables(epoch, tables)
    t1 = time.perf_counter()
    frames = feeder.frames(spark, epoch)[0] if args.input == "files" else \
        {n: spark.createDataFrame(t) for n, t in tables.items()}
    data = query.batch(**frames)
    times["input frames"] = time.perf_counter() - t1
    stages, chain = query.stages, query.chain
    if chain.one_job:
        s0 = time.perf_counter()
        data = chain.process(data)
        times["stages"] = time.perf_counter() - s0
        for i, stage in enumerate(stages):
            stage_times(times, i, stage, warm, empty)
    else:
        times["stages"] = 0.0
        for i, (stage, link) in enumerate(zip(stages, [*chain.links, None], strict=True)):
            s0 = time.perf_counter()
            data = stage.process(data)
            times[f"stage {i}"] = time.perf_counter() - s0
            times["stages"] += times[f"stage {i}"]
            stage_times(times, i, stage, warm, empty)
            data = data if link is None else link(data)
    c0 = time.perf_counter()
    query.rows(data.toArrow())
    times["collect"] = time.perf_counter() - c0
    times["epoch"] = sum(times[k] for k in ("generate", "input frames", "stages", "collect"))
    return times


if __name__ == "__main__":
    sys.exit(main())
