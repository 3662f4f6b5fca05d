"""Relief first: an overloaded worker's hot bins moved first against bin order, same input.

A keyed count runs open loop (bench/ds2_scenario.py's model: epoch ``e`` covers the input
interval ``[t0 + e*I, t0 + (e+1)*I)`` and runs once that interval has ended and the previous
epoch has finished; latency = completion - end of the epoch's input interval). Each record
costs ``--cost-ms`` of sleep in the update, so the work parallelizes over workers as real
per-record work on real cores would (``local[8]``). The input is skewed: ``--hot-share`` of
the records go to ``--hot`` keys whose bins all belong to worker 0 of ``--workers``, the rest
spread over ``--keys`` cold keys. At ``--rate`` worker 0 cannot keep up, so a backlog builds.

After ``--before`` epochs the benchmark decides to scale out to ``--to`` workers:
``megaphone.rescale(pipe, workers=TO, strategy=..., balance="load", order=ORDER)``, then
``migrate``. Both orders run from fresh pipelines on the same input, one after the other in
one process:

* ``bins`` -- the moves in bin order (the order of every strategy before relief order);
* ``relief`` -- the moves that take the most load off the most loaded worker first.

A scratch pipeline first runs ``--warmup`` epochs (JVM and Python workers warm), then
``--rounds`` rounds run both orders, every other round in reverse, so neither order always
goes first. Both plans move the same bins to the same workers (checked). Reported per run: the
time to relief, from the decision until the overloaded worker's backlog is gone (the finish of
the last epoch that had to wait for the one before it; epochs are synchronous, so the busiest
worker's backlog is the pipeline's) and latency is back under ``--target`` (the finish of the
first epoch after the last one over it), the later of the two and each on its own; the peak
latency after the decision; and the scaling duration (decision until the plan is done). Then
per order the medians over the rounds, and relief's ratios to bin order. Every run's outputs,
epoch by epoch, and final state must be equal, and the counts must add up to the records fed
(else the benchmark fails). Results go to ``--out`` (and ``--json FILE``): ``summary.json``,
``<order>-<round>.csv`` and ``relief.png`` (latency over time, the decision marked; needs
matplotlib).

``--workload q7`` or ``q8`` runs NEXMark Q7 (highest bid per tumbling window) or Q8 (new
users, a windowed join) instead of the count, on a skewed stream, the setting DRRS (ICDE
2025) is evaluated in. Bids' auctions (Q7) or auctions' sellers (Q8) follow a Zipf law of
exponent ``--skew``, and the stream is the first seed from ``--seed`` whose ``--hot`` most
popular auctions or sellers all lie in distinct bins of worker 0, so worker 0 falls behind as
with the count's hot keys (``bench/relief_nexmark.py`` says how). ``--rate`` is the records
per second into the rescaled stage (Q7's window stage reads the bids, 46 of every 50 events;
Q8's join the persons and auctions, 4 of 50), ``--cost-ms`` their cost as for the count. The
same measures are reported. Instead of the counts, every run's outputs must equal the batch
SQL of the query over the events fed (``megaphone/nexmark/sql.py``) with no record late; the
runs' outputs epoch by epoch and the rescaled stage's final state must be equal.

    python bench/relief.py                  # about 11 minutes (2 rounds of 70 epochs of 2 s
    python bench/relief.py --workload q7    # per order); Q7 and Q8 about 12 minutes each
    python bench/relief.py --smoke          # a short check of the machinery (any workload)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import ds2_scenario
import relief_nexmark
from ds2_scenario import slow_count
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from tqdm import tqdm

import megaphone
from megaphone import Pipeline
from megaphone.routing.bins import bin_of
from megaphone.spark import spark_session
from megaphone.state_backends import unpack_value

# Spark's Python workers cannot import the bench helpers by name: ship the update by value.
cloudpickle.register_pickle_by_value(ds2_scenario)
cloudpickle.register_pickle_by_value(relief_nexmark)

ORDERS = ("bins", "relief")
WORKLOADS = ("count", *relief_nexmark.QUERIES)
#: Default records per second into the rescaled stage, by workload: worker 0 falls behind by
#: about a second per 2 s epoch, and after the scale-out the busiest worker has room to drain
#: the backlog (Q7's two Spark jobs per epoch leave less room than Q8's one).
RATES = {"count": 3500.0, "q7": 3000.0, "q8": 3500.0}
#: Acceptance targets (relief over bins): time to relief, peak latency.
TARGET_RELIEF = 0.5
TARGET_PEAK = 0.7
#: Hot keys are taken from this id on, apart from the cold keys ``0..keys-1``.
HOT_BASE = 10**9


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=WORKLOADS, default="count",
                   help="the keyed count, or NEXMark Q7 or Q8 on a skewed stream")
    p.add_argument("--rate", type=float, help="records per second into the rescaled stage "
                   "(default 3500, Q7 3000)")
    p.add_argument("--interval", type=float, default=2.0, help="epoch length, seconds")
    p.add_argument("--cost-ms", type=float, default=0.5, help="sleep per record, ms")
    p.add_argument("--keys", type=int, default=20_000, help="cold keys (count)")
    p.add_argument("--hot", type=int, default=6, help="hot keys (NEXMark: the most popular "
                   "auctions or sellers), each in its own bin of worker 0")
    p.add_argument("--hot-share", type=float, default=0.6, help="share of records to hot keys "
                   "(count)")
    p.add_argument("--skew", type=float, default=1.2, help="Zipf exponent of the popular "
                   "auctions or sellers (NEXMark)")
    p.add_argument("--skew-keys", type=int, default=1000, help="auctions or sellers the Zipf "
                   "law ranks (NEXMark)")
    p.add_argument("--hot-ratio", type=int, default=10, help="1 - 1/RATIO of the bids' "
                   "auctions (Q7) or auctions' sellers (Q8) are Zipf draws (NEXMark)")
    p.add_argument("--seed", type=int, default=0, help="the first stream seed tried (NEXMark)")
    p.add_argument("--window-s", type=float, help="window size, event-time seconds (NEXMark; "
                   "10, --smoke 2)")
    p.add_argument("--bins", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="workers at the start")
    p.add_argument("--to", type=int, default=4, help="workers after the scale-out")
    p.add_argument("--strategy", default="fluid", help="fluid, batched or all-at-once")
    p.add_argument("--before", type=int, default=6, help="overloaded epochs before deciding")
    p.add_argument("--epochs", type=int, default=70, help="measured epochs in all")
    p.add_argument("--target", type=float, help="latency target, s (default: the interval)")
    p.add_argument("--master", default="local[8]")
    p.add_argument("--orders", default=",".join(ORDERS))
    p.add_argument("--rounds", type=int, default=2, help="rounds of both orders")
    p.add_argument("--warmup", type=int, default=6, help="scratch epochs run first")
    p.add_argument("--smoke", action="store_true", help="a short run: 12 epochs, 16 bins")
    p.add_argument("--out", type=Path, help="results directory (default results/relief, "
                   "results/relief-q7 or results/relief-q8 next to this script)")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="also write the summary (the JSON of OUT/summary.json) to FILE")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.rate = args.rate or RATES[args.workload]
    if args.smoke:
        args.epochs, args.before, args.bins, args.rate, args.keys = 12, 3, 16, 800.0, 500
        args.interval, args.rounds, args.warmup = 1.0, 1, 1
    args.window_s = args.window_s or (2.0 if args.smoke else 10.0)
    args.out = args.out or Path(__file__).resolve().parent / "results" / (
        "relief" if args.workload == "count" else f"relief-{args.workload}")
    args.target = args.target or args.interval
    args.orders = tuple(o.strip() for o in args.orders.split(",") if o.strip())
    if not args.orders or set(args.orders) - set(ORDERS):
        raise SystemExit(f"--orders must name some of {ORDERS}")
    if not 0 < args.before < args.epochs:
        raise SystemExit("--before must be between 0 and --epochs")
    return args


def hot_keys(owners: Any, bins: int, count: int) -> list[int]:
    """``count`` keys, each in its own bin, every bin owned by worker 0 at the start."""
    keys: list[int] = []
    used: set[int] = set()
    k = HOT_BASE
    while len(keys) < count:
        b = int(bin_of(k, bins))
        if int(owners[b]) == 0 and b not in used:
            keys.append(k)
            used.add(b)
        k += 1
        if k > HOT_BASE + 1_000_000:
            raise SystemExit(f"worker 0 has fewer than {count} bins: lower --hot")
    return keys


def batch(spark: SparkSession, offset: int, n: int, args: argparse.Namespace,
          hot: list[int]) -> DataFrame:
    """Records ``offset..offset+n-1``: ``hot_share`` of them to the hot keys, the rest spread
    over the cold keys (the same for every run)."""
    h = F.xxhash64("id")
    hot_key = F.element_at(F.array(*[F.lit(k) for k in hot]),
                           (F.pmod(h, F.lit(len(hot))) + 1).cast("int"))
    is_hot = F.pmod(F.col("id"), F.lit(1000)) < F.lit(round(args.hot_share * 1000))
    return spark.range(offset, offset + n, 1, 2).select(
        F.when(is_hot, hot_key).otherwise(F.pmod(h, F.lit(args.keys))).alias("k"),
        F.lit(1).alias("v"))


@dataclass
class Row:
    """One measured epoch; times in seconds since the run's start."""

    order: str
    epoch: int
    interval_end_s: float
    finished_s: float
    latency_s: float
    duration_s: float
    workers: int
    bins_moved: int
    max_worker_records: int
    load1: float


@dataclass
class Run:
    """One order's run: its epochs, decision, plan and what it computed (``fed``: records, or
    NEXMark events; ``check``: what its outputs were checked against)."""

    order: str
    round: int
    rows: list[Row]
    decision_s: float
    done_s: float | None
    moves: list[list[int]]
    plan_order: str
    outputs: list[list[tuple[Any, ...]]]
    state: dict[Any, Any]
    fed: int
    check: str = ""


class CountWorkload:
    """The keyed count: ``--hot-share`` of the records to ``--hot`` keys in bins of worker 0,
    the rest to ``--keys`` cold keys. :attr:`stage` is the pipeline the benchmark rescales."""

    def __init__(self, spark: SparkSession, args: argparse.Namespace, path: Path) -> None:
        self.spark, self.args = spark, args
        self.stage = Pipeline(spark, str(path), key="k", value="v",
                              update=slow_count(args.cost_ms / 1000), workers=args.workers,
                              num_bins=args.bins, key_type="int64",
                              pipeline_id=f"relief-{path.name}-{uuid.uuid4().hex[:8]}")
        self.hot = hot_keys(self.stage.routing.owners(), args.bins, args.hot)
        self.per_epoch = round(args.rate * args.interval)
        self.fed = 0

    def epoch(self, input_end: float | None) -> list[tuple[Any, ...]]:
        """Run the next epoch; its outputs as sorted ``(key, count)`` pairs."""
        table = self.stage.process_arrow(batch(self.spark, self.fed, self.per_epoch, self.args,
                                               self.hot), input_end=input_end)
        self.fed += self.per_epoch
        return _pairs(table)

    def close(self) -> None:
        """Close the pipeline."""
        self.stage.close()

    def finish(self) -> tuple[dict[Any, Any], int, str]:
        """The counts, which must add up to the records fed (else an ``AssertionError``),
        the records fed and what was checked; closes the pipeline."""
        try:
            state = {int(k): int(unpack_value(v)) for k, v in self.stage.state().collect()}
        finally:
            self.close()
        if sum(state.values()) != self.fed:
            raise AssertionError(f"the counts add up to {sum(state.values())}, but {self.fed} "
                                 "records were fed")
        return state, self.fed, "the counts add up to the records fed"


def workload(spark: SparkSession, args: argparse.Namespace, path: Path
             ) -> CountWorkload | relief_nexmark.NexmarkWorkload:
    """A fresh ``--workload`` under ``path``."""
    if args.workload == "count":
        return CountWorkload(spark, args, path)
    return relief_nexmark.NexmarkWorkload(spark, args, path)


def warm(spark: SparkSession, args: argparse.Namespace, root: Path) -> None:
    """``--warmup`` epochs of a scratch workload as fast as they go (nothing measured)."""
    if not args.warmup:
        return
    work = workload(spark, args, root / "warmup")
    for _ in range(args.warmup):
        work.epoch(None)
    work.close()


def run(spark: SparkSession, args: argparse.Namespace, order: str, round_: int,
        root: Path) -> Run:
    """One order from a fresh workload: prime, overload, decide, then run to the end."""
    work = workload(spark, args, root / f"{order}-{round_}")
    pipe = work.stage
    work.epoch(None)  # primer: JVM and workers warm
    outputs: list[list[tuple[Any, ...]]] = [[]]
    rows = []
    handle, decision_s, done_s, plan = None, 0.0, None, None
    t0 = time.time()
    bar = tqdm(range(args.epochs), desc=order, disable=args.no_progress, leave=False)
    for e in bar:
        if e == args.before:
            decision_s = time.time() - t0
            plan = megaphone.rescale(pipe, workers=args.to, strategy=args.strategy,
                                     balance="load", order=order)
            handle = megaphone.migrate(plan, pipe)
        end = t0 + (e + 1) * args.interval
        if (wait := end - time.time()) > 0:
            time.sleep(wait)
        outputs.append(work.epoch(end))
        done = time.time()
        m = pipe.metrics(last=1)[0]
        if handle is not None and done_s is None and handle.done:
            done_s = done - t0
        per_worker = [int(w.get("records_in", 0)) for w in m.get("per_worker", {}).values()]
        rows.append(Row(order, e, end - t0, done - t0, done - end, m["duration_s"],
                        m["workers"], m["bins_moved"], max(per_worker, default=0),
                        round(os.getloadavg()[0], 2)))
        bar.set_postfix(latency=f"{done - end:.2f}s", workers=m["workers"])
    assert plan is not None
    try:
        state, fed, check = work.finish()
    except AssertionError as exc:
        raise AssertionError(f"{order}, round {round_}: {exc}") from exc
    moves = sorted([m.bin, m.src, m.dst] for s in plan.steps for m in s.moves)
    return Run(order, round_, rows, decision_s, done_s, moves, str(plan.meta.get("order", order)),
               outputs, state, fed, check)


def _pairs(table: Any) -> list[tuple[Any, Any]]:
    """An epoch's outputs as sorted ``(key, count)`` pairs (to compare runs)."""
    if table is None:
        return []
    cols = table.to_pydict()
    names = table.column_names
    return sorted(zip(cols[names[0]], cols[names[1]], strict=True))


def backlog_gone(r: Run) -> float:
    """Seconds from the decision until the backlog is gone: the finish of the last epoch
    after it that could not start when its input ended, because the epoch before it was
    still running (0 without one; infinite when the run's last epoch still had a backlog).
    Epochs are synchronous, so this is the overloaded worker's backlog."""
    late = [i for i in range(1, len(r.rows))
            if r.rows[i - 1].finished_s > r.rows[i].interval_end_s
            and r.rows[i].finished_s >= r.decision_s]
    if not late:
        return 0.0
    if late[-1] == len(r.rows) - 1:
        return float("inf")
    return r.rows[late[-1]].finished_s - r.decision_s


def stats(r: Run, target: float) -> dict[str, Any]:
    """Time to relief (the backlog gone and latency back under ``target``: the later of the
    two), peak latency and scaling duration after the decision."""
    after = [row for row in r.rows if row.finished_s >= r.decision_s]
    over = [i for i, row in enumerate(after) if row.latency_s > target]
    if not over:
        under = 0.0
    elif over[-1] + 1 < len(after):
        under = after[over[-1] + 1].finished_s - r.decision_s
    else:
        under = float("inf")  # never back under the target within the run
    gone = backlog_gone(r)
    before = [row.latency_s for row in r.rows if row.finished_s < r.decision_s]
    return {
        "order": r.order, "round": r.round, "plan_order": r.plan_order,
        "time_to_relief_s": round(max(under, gone), 2),
        "backlog_gone_s": round(gone, 2),
        "latency_under_target_s": round(under, 2),
        "peak_latency_s": round(max(row.latency_s for row in after), 3),
        "latency_at_decision_s": round(before[-1], 3) if before else None,
        "scaling_duration_s": None if r.done_s is None else round(r.done_s - r.decision_s, 2),
        "bins_moved": len(r.moves),
        "records_fed": r.fed,
        "check": r.check,
    }


def plot(path: Path, runs: list[Run], target: float, workload: str) -> None:
    """Latency over time per order, the decision and the target marked."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'megaphone[plot]')")
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in runs:
        ax.plot([row.finished_s for row in r.rows], [row.latency_s for row in r.rows],
                marker=".", color="tab:blue" if r.order == "bins" else "tab:orange",
                alpha=1.0 if r.round == 0 else 0.45, label=f"{r.order} order, round {r.round}")
        ax.axvline(r.decision_s, linestyle=":", color="grey")
    ax.axhline(target, linestyle="--", color="red", label="target")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("latency (s)")
    ax.set_title(f"{workload}: scale-out of an overloaded worker, relief order against bin "
                 "order")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the orders, check them against each other, print and write the results (on
    ``spark`` when given, else a session of ``--master``)."""
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    spark = spark or spark_session(args.master, "megaphone-relief")
    root = Path(tempfile.mkdtemp(prefix="megaphone-relief-"))
    try:
        warm(spark, args, root)
        runs = [run(spark, args, order, i, root) for i in range(args.rounds)
                for order in (args.orders if i % 2 == 0 else args.orders[::-1])]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first = runs[0]
    for r in runs[1:]:
        if r.moves != first.moves:
            raise AssertionError(f"{r.order} and {first.order} plans move different bins")
        if r.outputs != first.outputs or r.state != first.state:
            raise AssertionError(f"{r.order} and {first.order} computed different results")
    summary: dict[str, Any] = {
        "command": "python bench/relief.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.node()} {os.cpu_count()} cpus",
        "settings": {k: v for k, v in vars(args).items() if not isinstance(v, Path)},
        "runs": [stats(r, args.target) for r in runs],
        "equal": "outputs epoch by epoch, state, and the bins moved",
    }
    if args.workload != "count":
        config, hot = relief_nexmark.choose_stream(args)
        summary["stream"] = {"seed": config.seed, "events_per_second": config.events_per_second,
                             f"hot_{relief_nexmark.HOT_KIND[args.workload]}s": hot}
    by = {o: {m: statistics.median(s[m] for s in summary["runs"] if s["order"] == o)
              for m in ("time_to_relief_s", "peak_latency_s")} for o in args.orders}
    summary["medians"] = by
    if {"bins", "relief"} <= set(by):
        b, r = by["bins"], by["relief"]
        summary["relief_over_bins"] = {
            "time_to_relief": _ratio(r["time_to_relief_s"], b["time_to_relief_s"]),
            "peak_latency": _ratio(r["peak_latency_s"], b["peak_latency_s"]),
            "targets": {"time_to_relief": TARGET_RELIEF, "peak_latency": TARGET_PEAK},
        }
    for r in runs:
        with open(args.out / f"{r.order}-{r.round}.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(asdict(r.rows[0])))
            w.writeheader()
            w.writerows(asdict(row) for row in r.rows)
    text = json.dumps(summary, indent=2) + "\n"
    (args.out / "summary.json").write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    plot(args.out / "relief.png", runs, args.target,
         "keyed count" if args.workload == "count" else f"NEXMark {args.workload.upper()}")
    for s in summary["runs"]:
        print(f"{s['order']:7s} round {s['round']}  time to relief "
              f"{s['time_to_relief_s']:7.1f} s (backlog gone {s['backlog_gone_s']} s, latency "
              f"under target {s['latency_under_target_s']} s)   "
              f"peak latency {s['peak_latency_s']:6.2f} s   "
              f"scaling {s['scaling_duration_s']} s   "
              f"({s['bins_moved']} bins, plan order {s['plan_order']})")
    if "relief_over_bins" in summary:
        x = summary["relief_over_bins"]
        print(f"relief / bins (medians): time to relief {x['time_to_relief']}x "
              f"(target <= {TARGET_RELIEF}), peak latency {x['peak_latency']}x "
              f"(target <= {TARGET_PEAK})")
    print(f"checked: {runs[0].check}; equal: {summary['equal']}; results in {args.out}")
    return 0


def _ratio(num: float, den: float) -> float | None:
    """``num / den`` rounded, ``None`` when it has no meaning (a zero or endless side)."""
    if den in (0, float("inf")) or num == float("inf"):
        return None
    return round(num / den, 3)


if __name__ == "__main__":
    sys.exit(main())
