"""DS2 autoscaling scenario: the input rate steps up 3x and later back down, on live Spark.

A keyed operator runs open loop: input arrives at ``rate(t)`` records/s, cut into epochs of
``--interval`` seconds; epoch ``e`` covers ``[t0 + e*I, t0 + (e+1)*I)`` and runs as soon as
its interval has ended and the previous epoch has finished, so an under-provisioned pipeline
builds a backlog that shows as rising latency (latency = completion time - end of the epoch's
input interval). Records are generated in the JVM (``spark.range``; key
``pmod(xxhash64(id), keys)``, event time spread evenly over the interval), so every run sees
the same input. The rate is ``--rate`` for the first phase, ``--factor`` times it for the
second and ``--rate`` again for the third.

**Synthetic cost model.** On a small machine Spark's fixed per-epoch cost (job launch,
shuffle, commit: about 0.5-1 s here) would dwarf the cost of a cheap operator such as a
count, and adding workers would change nothing. So the operator is a general update ``f``
that counts per key and spends ``--cost-ms`` milliseconds per record (``time.sleep(len(values)
* cost)``; 0.5 ms by default, i.e. at most 2000 records/s per worker). Sleeping workers run
concurrently, so the work parallelizes across workers as real per-record work on real cores
would; Spark runs ``local[8]`` so up to 8 worker tasks run at once on the 2 cores.

Two policies run on the same input, each from a fresh pipeline with ``--workers`` workers:

* ``ds2`` -- :class:`megaphone.migrator.control.ds2_controller.DS2Controller` via
``pipe.autoscale()``; * ``threshold`` -- a classic rule on the same policy loop: add one worker
  when the latency is above ``--up-latency`` and grew over the window; remove one when the busiest
  worker was useful less than ``--idle`` of the window and latency is low.

Both use the same policy interval, warm-up, activation period and plans (``rescale`` with
``balance="load"``, ``--strategy``). After each run the counts in the state must add up to the
records fed (a mismatch stops the benchmark).

Outputs under ``--out``: ``<policy>.csv`` (one row per epoch: time, rate, workers, latency,
state moved, outputs), ``decisions-<policy>.csv`` (every policy evaluation with the numbers
behind it), ``summary.json``, ``summary.md`` and ``ds2_scenario.png`` (rate, workers and
latency over time).

    python bench/ds2_scenario.py --quick     # about 5 minutes
    python bench/ds2_scenario.py             # the RESULTS.md run, about 12 minutes
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from megaphone import Pipeline
from megaphone.migrator.control.ds2_controller import DS2Controller
from megaphone.plans.autoscale import Policy, Proposal, Window, input_span
from megaphone.plans.scale_decision import ScaleDecision
from megaphone.spark import spark_session
from megaphone.state_backends import unpack_value

POLICIES = ("ds2", "threshold")
#: Seconds of each phase (rate, factor x rate, rate): the full run and ``--quick``.
PHASES = {"full": (48.0, 160.0, 112.0), "quick": (16.0, 64.0, 48.0)}
#: Throw-away epochs before the clock starts (cold JVM and Python workers).
PRIMER_EPOCHS = 2


# -- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Resolved scenario settings."""

    rate: float
    factor: float
    phases: tuple[float, ...]
    interval: float
    cost_ms: float
    keys: int
    bins: int
    workers: int
    max_workers: int
    master: str
    policy_interval: float
    activation: int
    warmup_epochs: int
    strategy: str
    per_worker: int
    headroom: float
    up_latency: float
    idle: float
    policies: tuple[str, ...]
    out: Path
    state_root: Path

    def rate_at(self, t: float) -> tuple[int, float]:
        """``(phase, records/s)`` of the input at ``t`` seconds after the start."""
        end = 0.0
        for i, length in enumerate(self.phases):
            end += length
            if t < end - 1e-9:
                return i, self.rate * (self.factor if i % 2 == 1 else 1.0)
        return len(self.phases) - 1, self.rate * (self.factor if len(self.phases) % 2 == 0
                                                  else 1.0)

    @property
    def epochs(self) -> int:
        """Epochs in the measured run."""
        return round(sum(self.phases) / self.interval)

    def policy(self, name: str) -> Policy:
        """The policy loop settings shared by both rules (threshold acts on any step)."""
        return Policy(interval_s=self.policy_interval, warmup_epochs=self.warmup_epochs,
                      activation=self.activation, min_workers=1, max_workers=self.max_workers,
                      strategy=self.strategy, per_worker=self.per_worker, balance="load",
                      ignore_down_by_one=name == "ds2", headroom=self.headroom)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter phases (about 5 minutes)")
    p.add_argument("--replot", action="store_true", help="only redraw the plot and summary "
                   "from the CSVs and summary.json already in --out")
    p.add_argument("--rate", type=float, default=2000.0, help="base input rate, records/s")
    p.add_argument("--factor", type=float, default=3.0, help="the step up (x rate)")
    p.add_argument("--phases", help="seconds of each phase, e.g. 48,160,112")
    p.add_argument("--interval", type=float, default=4.0, help="epoch length in seconds")
    p.add_argument("--cost-ms", type=float, default=0.5, help="synthetic cost per record, ms")
    p.add_argument("--keys", type=int, default=20_000, help="distinct keys")
    p.add_argument("--bins", type=int, default=64, help="bins (a power of two)")
    p.add_argument("--workers", type=int, default=2, help="workers at the start")
    p.add_argument("--max-workers", type=int, default=8, help="upper bound of both policies")
    p.add_argument("--master", default="local[8]", help="Spark master")
    p.add_argument("--policy-interval", type=float, default=8.0, help="seconds between "
                   "policy evaluations")
    p.add_argument("--activation", type=int, default=2, help="consecutive identical decisions "
                   "before acting")
    p.add_argument("--warmup-epochs", type=int, default=2, help="epochs ignored after a "
                   "rescale")
    p.add_argument("--strategy", default="batched", help="migration strategy of the plans")
    p.add_argument("--per-worker", type=int, default=8, help="batched: bins a worker sends "
                   "or receives per step")
    p.add_argument("--headroom", type=float, default=0.25, help="DS2: provision for "
                   "(1 + headroom) x the source rate, so a backlog drains")
    p.add_argument("--up-latency", type=float, help="threshold: latency (s) above which it "
                   "adds a worker (default 2 x interval)")
    p.add_argument("--idle", type=float, default=0.4, help="threshold: remove a worker when "
                   "the busiest one is useful less than this share of the window")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset of "
                   f"{','.join(POLICIES)}")
    p.add_argument("--out", type=Path, help="output directory (default bench/results/ds2, "
                   "or bench/results/ds2-quick with --quick)")
    p.add_argument("--state-root", type=Path, help="where the runs' state directories go "
                   "(default: a temporary directory, removed afterwards)")
    return p


def resolve(args: argparse.Namespace) -> Config:
    """Fill defaults and check the options."""
    phases = tuple(float(x) for x in args.phases.split(",")) if args.phases else \
        PHASES["quick" if args.quick else "full"]
    policies = tuple(x.strip() for x in args.policies.split(",") if x.strip())
    if set(policies) - set(POLICIES) or not policies:
        raise SystemExit(f"--policies must name some of {POLICIES}")
    if min(phases) < args.interval:
        raise SystemExit("every phase must last at least one epoch interval")
    root = Path(__file__).resolve().parent / "results"
    return Config(
        rate=args.rate, factor=args.factor, phases=phases, interval=args.interval,
        cost_ms=args.cost_ms, keys=args.keys, bins=args.bins, workers=args.workers,
        max_workers=args.max_workers, master=args.master,
        policy_interval=args.policy_interval, activation=args.activation,
        warmup_epochs=args.warmup_epochs, strategy=args.strategy, per_worker=args.per_worker,
        headroom=args.headroom, up_latency=args.up_latency or 2 * args.interval,
        idle=args.idle, policies=policies,
        out=args.out or root / ("ds2-quick" if args.quick else "ds2"),
        state_root=args.state_root or Path(tempfile.mkdtemp(prefix="megaphone-ds2-")),
    )


# -- the operator and the input --------------------------------------------------------------


def slow_count(cost_s: float) -> Callable[[Any, list, Any], tuple[int, list[str]]]:
    """The keyed update: a count that spends ``cost_s`` seconds per record (cost model)."""

    def update(key: Any, values: list, state: Any) -> tuple[int, list[str]]:
        time.sleep(len(values) * cost_s)
        total = (state or 0) + len(values)
        return total, [str(total)]

    return update


def batch(spark: SparkSession, offset: int, n: int, start: float, interval: float,
          keys: int) -> DataFrame:
    """``n`` records with ids ``offset..offset+n-1``, event times spread over the interval."""
    step = interval / max(n, 1)
    return spark.range(offset, offset + n, 1, 2).select(
        F.pmod(F.xxhash64("id"), F.lit(keys)).alias("k"),
        F.lit(1).alias("v"),
        F.timestamp_seconds(F.lit(start) + (F.col("id") - F.lit(offset) + 1) * F.lit(step))
        .alias("t"),
    )


# -- the threshold baseline ------------------------------------------------------------------


class ThresholdController(DS2Controller):
    """One worker more when latency is high and growing, one fewer when the workers idle.

    The classic rule DS2 is compared with (as Dhalion-style policies): it only knows that the
    pipeline is behind or idle, not by how much, so it moves one worker at a time.
    """

    def __init__(self, pipe: Any, policy: Policy, up_latency_s: float, idle: float) -> None:
        super().__init__(pipe, policy)
        self.up_latency_s = up_latency_s
        self.idle = idle

    def propose(self, window: Window, current: int) -> Proposal:
        """``current + 1``, ``current - 1`` or ``current`` (see the class docstring)."""
        latencies = [float(m.latency_s) for m in window.epochs if m.latency_s is not None]
        if not latencies:
            raise ValueError("no latency in the window (the pipeline needs event_time)")
        _, _, span, _ = input_span(window)
        useful: dict[int, float] = {}
        for m in window.epochs:
            for w, wm in m.per_worker.items():
                useful[int(w)] = useful.get(int(w), 0.0) + float(wm.useful_s or 0)
        busy = max(useful.values(), default=0.0) / span
        numbers = {"latency_s": round(latencies[-1], 3), "busy": round(busy, 3)}
        if latencies[-1] > self.up_latency_s and latencies[-1] >= latencies[0]:
            return Proposal(current + 1, None, numbers, "latency high and growing")
        if busy < self.idle and latencies[-1] <= self.up_latency_s:
            return Proposal(current - 1, None, numbers, f"busiest worker {busy:.0%} useful")
        return Proposal(current, None, numbers, "within thresholds")


# -- one run ---------------------------------------------------------------------------------


@dataclass
class EpochRow:
    """One measured epoch (times in seconds since the run started)."""

    epoch: int
    phase: int
    rate: float
    records: int
    interval_end_s: float
    started_s: float
    finished_s: float
    latency_s: float
    duration_s: float
    workers: int
    routing_version: int
    bins_moved: int
    keys_moved: int
    records_out: int
    in_flight: int
    load_avg: float  # the machine's 1-minute load average when the epoch finished


@dataclass
class RunResult:
    """A policy's run: its epochs, its decisions and the correctness check."""

    name: str
    rows: list[EpochRow]
    decisions: list[dict[str, Any]]
    t0: float
    records_fed: int
    state_total: int
    stats: dict[str, Any] = field(default_factory=dict)


def run_policy(spark: SparkSession, cfg: Config, name: str) -> RunResult:
    """Run the scenario under policy ``name`` from a fresh pipeline."""
    state_dir = cfg.state_root / name
    shutil.rmtree(state_dir, ignore_errors=True)
    pipe = Pipeline(spark, str(state_dir), key="k", value="v",
                    update=slow_count(cfg.cost_ms / 1000.0), workers=cfg.workers,
                    num_bins=cfg.bins, key_type="int64", event_time="t",
                    pipeline_id=f"ds2-{name}-{uuid.uuid4().hex[:8]}")
    offset = 0
    for _ in range(PRIMER_EPOCHS):
        n = round(cfg.rate * cfg.interval)
        pipe.process(batch(spark, offset, n, time.time() - cfg.interval, cfg.interval,
                           cfg.keys))
        offset += n
    policy = cfg.policy(name)
    controller: DS2Controller | None = None
    rows: list[EpochRow] = []
    t0 = time.time()
    try:
        for e in range(cfg.epochs):
            if e == 1:  # from here on the previous epoch's input ends where the next begins
                controller = pipe.autoscale(policy) if name == "ds2" else \
                    ThresholdController(pipe, policy, cfg.up_latency, cfg.idle).start()
            start = t0 + e * cfg.interval
            end = start + cfg.interval
            phase, rate = cfg.rate_at(e * cfg.interval)
            n = round(rate * cfg.interval)
            wait = end - time.time()
            if wait > 0:
                time.sleep(wait)
            began = time.time()
            pipe.process(batch(spark, offset, n, start, cfg.interval, cfg.keys))
            done = time.time()
            offset += n
            m = pipe.metrics(last=1)[0]
            rows.append(EpochRow(
                epoch=m["epoch"], phase=phase, rate=rate, records=n,
                interval_end_s=end - t0, started_s=began - t0, finished_s=done - t0,
                latency_s=done - end, duration_s=m["duration_s"], workers=m["workers"],
                routing_version=m["routing_version"], bins_moved=m["bins_moved"],
                keys_moved=m["keys_moved"], records_out=m["records_out"],
                in_flight=len(pipe.in_flight), load_avg=round(os.getloadavg()[0], 2),
            ))
            print(f"{name:9s} e{e:3d} t={done - t0:6.1f}s rate {rate:6.0f} workers "
                  f"{m['workers']} latency {done - end:6.2f}s moved {m['bins_moved']:2d} bins "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        if controller is not None:
            controller.stop()
    assert controller is not None
    total = sum(int(unpack_value(row[1])) for row in pipe.state().collect())
    decisions = [decision_row(d, t0) for d in controller.decisions]
    pipe.close()
    if total != offset:
        raise AssertionError(f"{name}: the counts add up to {total}, but {offset} records "
                             "were fed")
    return RunResult(name, rows, decisions, t0, offset, total)


def decision_row(d: ScaleDecision, t0: float) -> dict[str, Any]:
    """A decision flattened for CSV (time relative to the run's start)."""
    n = d.numbers
    return {
        "time_s": round(d.time - t0, 3), "action": d.action, "current": d.current,
        "target": d.target, "proposed": d.proposed,
        "epochs": f"{d.epochs[0]}-{d.epochs[1]}" if d.epochs else "",
        "skipped": d.skipped,
        "source_rate": round(d.source_rate, 1) if d.source_rate is not None else None,
        "per_instance_rate": n.get("per_instance_rate"), "overhead": n.get("overhead"),
        "demand": n.get("demand"), "latency_s": n.get("latency_s"), "busy": n.get("busy"),
        "reason": d.reason,
    }


# -- analysis --------------------------------------------------------------------------------


def phase_stats(cfg: Config, result: RunResult) -> list[dict[str, Any]]:
    """Per phase: scaling actions, workers at the end, convergence time and latency."""
    bounds = [0.0]
    for length in cfg.phases:
        bounds.append(bounds[-1] + length)
    scales = [d for d in result.decisions if d["action"] == "scale"]
    out = []
    for i in range(len(cfg.phases)):
        lo, hi = bounds[i], bounds[i + 1]
        acts = [d for d in scales if lo <= d["time_s"] < hi]
        rows = [r for r in result.rows if r.phase == i]
        moving = [r for r in rows if r.bins_moved]
        directions = [1 if d["target"] > d["current"] else -1 for d in acts]
        reversals = sum(1 for a, b in itertools.pairwise(directions) if a != b)
        settle = moving[-1].finished_s - lo if moving else 0.0
        tail = [r.latency_s for r in rows if r.interval_end_s >= lo + 0.75 * (hi - lo)]
        lat = [r.latency_s for r in rows]
        out.append({
            "phase": i,
            "rate": rows[0].rate if rows else None,
            "start_s": lo,
            "actions": len(acts),
            "steps": " ".join(f"{d['current']}->{d['target']}@{d['time_s']:.0f}s" for d in acts),
            "reversals": reversals,
            "workers_end": rows[-1].workers if rows else None,
            "last_move_after_s": round(settle, 1),
            "latency_p50_s": round(statistics.median(lat), 2) if lat else None,
            "latency_max_s": round(max(lat), 2) if lat else None,
            "latency_last_quarter_s": round(statistics.median(tail), 2) if tail else None,
        })
    return out


def migration_stats(result: RunResult) -> dict[str, Any]:
    """Epochs that moved state or ran while a plan was in flight, and their outputs."""
    moving = [r for r in result.rows if r.bins_moved]
    during = [r for r in result.rows if r.bins_moved or r.in_flight]
    return {
        "epochs_moving_state": len(moving),
        "epochs_during_plans": len(during),
        "epochs_without_output_during_plans": sum(1 for r in during if r.records_out == 0),
        "min_records_out_during_plans": min((r.records_out for r in during), default=None),
        "bins_moved": sum(r.bins_moved for r in moving),
        "keys_moved": sum(r.keys_moved for r in moving),
        "max_epoch_while_moving_s": round(max((r.duration_s for r in moving), default=0.0), 2),
    }


# -- outputs ---------------------------------------------------------------------------------


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` as CSV with a header (nothing written for no rows)."""
    if not rows:
        return
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(path: Path, cfg: Config, results: Sequence[RunResult]) -> None:
    """Rate, workers and latency over time, one line per policy, scaling actions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    colors = {"ds2": "tab:blue", "threshold": "tab:orange"}
    fig, (ax_rate, ax_w, ax_lat) = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True,
                                                gridspec_kw={"height_ratios": [1, 1.3, 1.6]})
    ts = [i * 0.25 for i in range(int(sum(cfg.phases) * 4) + 1)]
    ax_rate.plot(ts, [cfg.rate_at(t)[1] for t in ts], color="black", linewidth=1.2)
    ax_rate.set_ylabel("input rec/s")
    ax_rate.set_ylim(0, cfg.rate * max(cfg.factor, 1) * 1.15)
    for r in results:
        c = colors.get(r.name)
        xs = [row.finished_s for row in r.rows]
        ax_w.step([row.started_s for row in r.rows], [row.workers for row in r.rows],
                  where="post", color=c, label=r.name)
        for d in r.decisions:
            if d["action"] == "scale":
                ax_w.annotate("", xy=(d["time_s"], d["target"]),
                              xytext=(d["time_s"], d["current"]),
                              arrowprops={"arrowstyle": "->", "color": c, "lw": 1})
        ax_lat.plot(xs, [max(row.latency_s, 0.05) for row in r.rows], color=c, marker=".",
                    markersize=3, linewidth=1, label=r.name)
        for row in r.rows:
            if row.bins_moved:
                ax_lat.axvspan(row.started_s, row.finished_s, color=c, alpha=0.12, linewidth=0)
    ax_w.set_ylabel("workers")
    ax_w.set_ylim(0, cfg.max_workers + 0.5)
    ax_w.legend(loc="upper left", fontsize=8)
    ax_lat.set_yscale("log")
    ax_lat.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_lat.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_lat.yaxis.set_minor_formatter(NullFormatter())
    ax_lat.set_ylabel("latency s")
    ax_lat.legend(loc="upper left", fontsize=8)
    edge = 0.0
    for length in cfg.phases[:-1]:
        edge += length
        for ax in (ax_rate, ax_w, ax_lat):
            ax.axvline(edge, color="grey", linestyle=":", linewidth=1)
    for ax in (ax_rate, ax_w, ax_lat):
        ax.grid(True, alpha=0.3)
    ax_lat.set_xlabel("seconds since the run started (arrows: scaling decisions; shaded: "
                      "epochs that moved state)")
    fig.suptitle(f"DS2 vs threshold autoscaling: input {cfg.rate:g} -> "
                 f"{cfg.rate * cfg.factor:g} -> {cfg.rate:g} rec/s, {cfg.cost_ms:g} ms/record",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_md(cfg: Config, results: Sequence[RunResult]) -> str:
    """The Markdown tables of a run (what RESULTS.md quotes)."""
    lines = [
        "| policy | phase | rate rec/s | scaling actions | steps (from->to@time) | "
        "reversals | workers at end | last state move after s | latency p50 s | "
        "latency max s | latency last quarter s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for p in r.stats["phases"]:
            lines.append(
                f"| {r.name} | {p['phase']} | {p['rate']:.0f} | {p['actions']} | "
                f"{p['steps'] or '-'} | {p['reversals']} | {p['workers_end']} | "
                f"{p['last_move_after_s']} | {p['latency_p50_s']} | {p['latency_max_s']} | "
                f"{p['latency_last_quarter_s']} |")
    lines += ["", "| policy | scaling actions | epochs moving state | epochs while a plan ran | "
              "epochs without output during plans | min outputs in such an epoch | bins moved "
              "| records fed = state total | mean load avg |",
              "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in results:
        m = r.stats["migration"]
        lines.append(
            f"| {r.name} | {r.stats['actions']} | {m['epochs_moving_state']} | "
            f"{m['epochs_during_plans']} | {m['epochs_without_output_during_plans']} | "
            f"{m['min_records_out_during_plans']} | {m['bins_moved']} | "
            f"{r.records_fed:,} = {r.state_total:,} | {r.stats.get('load_avg_mean', '?')} |")
    return "\n".join(lines) + "\n"


def load_results(cfg: Config) -> list[RunResult]:
    """The runs recorded in ``cfg.out`` (CSVs and summary.json), for ``--replot``."""
    saved = json.loads((cfg.out / "summary.json").read_text(encoding="utf-8"))
    results = []
    for name, run in saved["runs"].items():
        with open(cfg.out / f"{name}.csv", encoding="utf-8") as fh:
            rows = [EpochRow(**{k: (float(v) if "." in v or "e" in v else int(v))
                                for k, v in row.items()}) for row in csv.DictReader(fh)]
        result = RunResult(name, rows, run["decisions"], 0.0, run["records_fed"],
                           run["records_fed"])
        result.stats = {k: run[k] for k in ("phases", "migration", "actions", "load_avg_mean")
                        if k in run}
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenario for each policy and write CSVs, the plot and the summary."""
    args = parser().parse_args(argv)
    cfg = resolve(args)
    cfg.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        saved = json.loads((cfg.out / "summary.json").read_text(encoding="utf-8"))["config"]
        cfg = replace(cfg, **{k: tuple(v) if isinstance(v, list) else v
                              for k, v in saved.items() if k != "out"})
        shutil.rmtree(cfg.state_root, ignore_errors=True)
        results = load_results(cfg)
        plot(cfg.out / "ds2_scenario.png", cfg, results)
        print(summary_md(cfg, results))
        return 0
    spark = spark_session(cfg.master, "megaphone-ds2-scenario",
                          {"spark.sql.shuffle.partitions": str(cfg.max_workers)})
    results = []
    try:
        for name in cfg.policies:
            result = run_policy(spark, cfg, name)
            result.stats = {"phases": phase_stats(cfg, result),
                            "migration": migration_stats(result),
                            "actions": sum(1 for d in result.decisions if d["action"] == "scale"),
                            "load_avg_mean": round(statistics.mean(r.load_avg for r in
                                                                   result.rows), 2)}
            results.append(result)
            write_csv(cfg.out / f"{name}.csv", [asdict(r) for r in result.rows])
            write_csv(cfg.out / f"decisions-{name}.csv", result.decisions)
    finally:
        spark.stop()
        shutil.rmtree(cfg.state_root, ignore_errors=True)
    plot(cfg.out / "ds2_scenario.png", cfg, results)
    md = summary_md(cfg, results)
    (cfg.out / "summary.md").write_text(md, encoding="utf-8")
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(),
               "platform": platform.platform(), "load_avg_after": os.getloadavg()}
    (cfg.out / "summary.json").write_text(json.dumps({
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()
                   if k != "state_root"},
        "machine": machine,
        "runs": {r.name: {**r.stats, "records_fed": r.records_fed,
                          "decisions": r.decisions} for r in results},
    }, indent=1, default=str), encoding="utf-8")
    print(md)
    print(f"wrote {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
