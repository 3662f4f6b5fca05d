"""Open-loop migration benchmark: latency of a keyed count on Spark while its state moves.

Input arrives at a fixed rate (``--rate`` records/s) cut into epochs of ``--interval`` seconds:
epoch ``e``'s input interval is ``[t0 + e*I, t0 + (e+1)*I)``. The harness runs epoch ``e`` as
soon as its interval has ended and epoch ``e-1`` has finished, so a slow epoch leaves a backlog
that shows as rising latency (latency = completion time - end of the input interval). Each
epoch's records are generated in the JVM (``pmod(xxhash64(id), keys)`` over a range of ids),
so every run sees exactly the same input. The operator is a keyed count over ``--keys``
distinct keys whose initial state (count 1 per key) is bulk-loaded as SST files
(``bench/load.py``).

After ``--warmup`` and ``--pre`` epochs a reconfiguration starts. The default scenario is the
Megaphone paper's: half of the workers each move half of their bins to a worker of the other
half, and once that is done (and ``--hold`` epochs later) the bins move back;
``--scenario half-out`` makes only the first of those moves (the billion-key run);
``--scenario scale-out`` moves from ``W`` to ``2W`` workers instead. Runs, all on the same input:

* ``steady`` -- no migration (the reference);
* ``all-at-once``, ``fluid``, ``batched`` -- live migration with each strategy;
* ``deadline@L`` (any number, e.g. ``--runs fluid,batched,deadline@2,deadline@4``) -- live
  migration paced by the deadline policy with latency target ``L`` seconds; the summary then
  also counts, for fluid, batched and each ``deadline@L``, the epochs over ``L``;
* ``pause-restart`` -- stop the pipeline, ``migrate_offline`` the same moves, open it again,
  all in the warm application (same SparkSession); the input keeps arriving during the pause;
* ``restart-app`` -- the same pause-and-restart paying the real application restart: every
  stretch between reconfigurations runs in a new process (new SparkSession, new JVM) that
  migrates offline before it starts Spark (``bench/restart_baselines.py``);
* ``native`` -- Spark Structured Streaming's own ``groupBy(key).count()`` (update mode,
  RocksDB state store, file source fed the same epochs, one file per trigger), no migration;
* ``native-repartition`` -- that query stopped between triggers at each reconfiguration, its
  state repartitioned offline (``spark._streamingCheckpointManager.repartition``, PySpark >=
  4.2, experimental) from ``W`` to ``2W`` partitions (and back), and restarted in the same
  SparkSession while the input keeps arriving (``bench/restart_baselines.py``).

The runs that stop (``pause-restart``, ``restart-app``, ``native-repartition``) report the
seconds of each phase of their pauses; every run reports its latency spike, the epochs over
1.5x its own steady p99 and the drain time: from the end of a reconfiguration (the restart)
until the backlog is worked off -- the last epoch over 1.5x the run's steady median latency
before one back within it completed (``report.drain_times``).

After every megaphone run the total of all counts in ``pipe.state()`` must equal the
bulk-loaded counts plus the records fed (``restart-app``: checked in its last application;
``native`` and ``native-repartition``: the preloaded counts plus the records fed, read back
with the ``statestore`` data source); a mismatch stops the benchmark with an error.

Outputs under ``--out``: ``<run>.csv`` per run, ``latency.png`` (and ``memory.png``),
``summary.md`` and ``summary.json``.

    python bench/migration.py --keys 1e5            # smoke: a few minutes
    python bench/migration.py --keys 1e7            # the RESULTS.md run
    python bench/migration.py --keys 1e7 --runs fluid,batched,deadline@1.5,deadline@3
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from load import clone_state_dir, create_loaded
from procmem import RssSampler
from report import (
    DRAIN,
    MIGRATION,
    RUN_ORDER,
    EpochRow,
    RunResult,
    Window,
    fmt_mb,
    fmt_x,
    label_phases,
    load_result,
    ms,
    pct,
    plot_timelines,
    prediction_ratios,
    rate,
    ratio,
    run_stats,
    save_result,
    secs,
    spike_table,
    stats_table,
    write_csv,
)
from restart_baselines import RESTART_RUNS, run_restart_baseline
from run_setup import (
    Config,
    Context,
    CorrectnessError,
    Target,
    Workload,
    check_total,
    count,
    epoch_row,
    iso_seconds,
    load_avg,
    machine,
    native_conf,
    open_pipeline,
    prime,
    reconfigurations,
    state_total,
)

from megaphone import Pipeline, rescale
from megaphone.migrator.control.offline import migrate_offline
from megaphone.paths import StateDirPaths
from megaphone.routing.table import ROUTING_FORMAT, initial_owners
from megaphone.state_backends import open_backend

LIVE_STRATEGIES = ("all-at-once", "fluid", "batched")
#: Run name prefix of the deadline strategy: ``deadline@2.5`` has a 2.5 s latency target.
DEADLINE_RUN = "deadline@"
SCENARIOS = ("half-and-back", "half-out", "scale-out")
#: Settings by size: ``smoke`` (keys < 1e6) keeps the whole benchmark to a few minutes (the
#: restart baselines start new Spark applications and wait for their backlog to drain).
PROFILES: dict[str, dict[str, Any]] = {
    "smoke": {"bins": 8, "workers": 2, "rate": 2000.0, "interval": 0.5, "warmup": 1, "pre": 1,
              "hold": 0, "cooldown": 1, "steady_epochs": 3, "per_worker": 2, "drain_epochs": 40},
    "full": {"bins": 256, "workers": 4, "rate": 5000.0, "interval": 2.0, "warmup": 10,
             "pre": 10, "hold": 2, "cooldown": 10, "steady_epochs": 40, "per_worker": 1,
             "drain_epochs": 150},
}
#: Keys exported and imported to measure the backend's own transfer rate on this state.
BACKEND_SAMPLE_KEYS = 1_000_000


def deadline_target(name: str) -> float | None:
    """The latency target of a ``deadline@L`` run name, else None."""
    if not name.startswith(DEADLINE_RUN):
        return None
    try:
        value = float(name[len(DEADLINE_RUN):])
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def run_order(names: list[str] | tuple[str, ...]) -> list[str]:
    """``names`` in report order: :data:`RUN_ORDER`, deadline runs (by target) after batched."""
    fixed = [r for r in RUN_ORDER if r in names]
    deadlines = sorted({n for n in names if deadline_target(n)}, key=deadline_target)
    at = fixed.index("batched") + 1 if "batched" in fixed else \
        sum(r in ("steady", "all-at-once", "fluid") for r in fixed)
    return fixed[:at] + deadlines + fixed[at:]


# -- configuration ---------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """The command line (sizes and phases default to the profile chosen by ``--keys``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=count, default=100_000, help="distinct keys (1e5 .. 1e9)")
    p.add_argument("--rate", type=float, help="records per second")
    p.add_argument("--interval", type=float, help="epoch length in seconds")
    p.add_argument("--workers", type=int, help="workers at the start")
    p.add_argument("--bins", type=int, help="bins (a power of two)")
    p.add_argument("--scenario", choices=SCENARIOS, default="half-and-back")
    p.add_argument("--runs", default=",".join(RUN_ORDER),
                   help=f"comma-separated subset of {','.join(RUN_ORDER)}, plus any "
                        f"{DEADLINE_RUN}L (the deadline strategy with an L-second target)")
    p.add_argument("--warmup", type=int, help="epochs excluded from every statistic")
    p.add_argument("--pre", type=int, help="steady epochs before the reconfiguration")
    p.add_argument("--hold", type=int, help="epochs between moving out and moving back")
    p.add_argument("--cooldown", type=int, help="epochs after the last reconfiguration")
    p.add_argument("--steady-epochs", type=int, help="measured epochs of steady and native")
    p.add_argument("--per-worker", type=int, help="bins per worker per step of batched")
    p.add_argument("--gap", type=int, default=0,
                   help="idle epochs between the steps of fluid and batched (flow control)")
    p.add_argument("--drain-epochs", type=int,
                   help="epochs beyond --cooldown that restart-app and native-repartition wait "
                        "at most, after their last restart, for the backlog to drain")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    p.add_argument("--state-root", type=Path, help="state directories (default OUT/state)")
    p.add_argument("--keep-state", action="store_true", help="keep the runs' state dirs")
    p.add_argument("--merge", action="store_true",
                   help="report together with the runs an earlier invocation saved in --out "
                        "with the same settings (run long benchmarks one run at a time)")
    p.add_argument("--backend", choices=("rocksdb", "memory"), default="rocksdb")
    p.add_argument("--master", default="local[*]", help="Spark master")
    p.add_argument("--driver-memory", default="4g", help="JVM heap (spark.driver.memory)")
    p.add_argument("--native-preload-max", type=count, default=20_000_000,
                   help="largest --keys for which native starts with all keys counted once")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def resolve(args: argparse.Namespace) -> Config:
    """Fill unset options from the size profile and check them."""
    profile = "smoke" if args.keys < 1_000_000 else "full"
    base = PROFILES[profile]

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return base[name] if value is None else value

    runs = tuple(r.strip() for r in args.runs.split(",") if r.strip())
    unknown = {r for r in runs if r not in RUN_ORDER and deadline_target(r) is None}
    if unknown:
        raise SystemExit(f"unknown runs {sorted(unknown)}; choose from {RUN_ORDER} or "
                         f"{DEADLINE_RUN}L with L > 0 seconds")
    cfg = Config(
        keys=args.keys, rate=pick("rate"), interval=pick("interval"), workers=pick("workers"),
        bins=pick("bins"), scenario=args.scenario, runs=runs, warmup=pick("warmup"),
        pre=pick("pre"), hold=pick("hold"), cooldown=pick("cooldown"),
        steady_epochs=pick("steady_epochs"), per_worker=pick("per_worker"), gap=args.gap,
        drain_epochs=pick("drain_epochs"),
        out=args.out,
        state_root=args.state_root or args.out / "state", keep_state=args.keep_state,
        merge=args.merge,
        backend=args.backend, master=args.master, driver_memory=args.driver_memory,
        native_preload_max=args.native_preload_max, progress=not args.no_progress,
        profile=profile,
    )
    if cfg.scenario != "scale-out" and cfg.workers % 2:
        raise SystemExit(f"--scenario {cfg.scenario} needs an even number of workers")
    return cfg


# -- workload --------------------------------------------------------------------------------


# -- megaphone runs --------------------------------------------------------------------------


def plan_for(pipe: Pipeline, target: Target, strategy: str, per_worker: int = 1, gap: int = 0,
             target_latency: float | None = None):
    """A plan from the pipeline's current routing to ``target`` with ``strategy``."""
    goal: dict[str, Any] = {"workers": target} if isinstance(target, int) else {"target": target}
    return rescale(pipe, **goal, strategy=strategy, per_worker=per_worker, gap=gap,
                   target_latency=target_latency)


class LiveRun:
    """One megaphone run: the open-loop epoch loop plus the run's reconfiguration schedule.

    ``mode`` is ``"steady"`` (no reconfiguration), ``"live"`` (``pipe.migrate`` with
    ``strategy``; ``target_latency`` for ``deadline``) or ``"pause"`` (close,
    ``migrate_offline``, reopen). Each epoch tells the pipeline when its input ended, so the
    deadline policy sees the backlog.
    """

    def __init__(self, ctx: Context, name: str, mode: str, strategy: str = "all-at-once",
                 target_latency: float | None = None):
        self.ctx, self.name, self.mode, self.strategy = ctx, name, mode, strategy
        self.target_latency = target_latency
        self.cfg = ctx.cfg
        self.path = ctx.cfg.state_root / name
        self.rows: list[EpochRow] = []
        self.windows: list[Window] = []
        self.notes: list[str] = []
        self.pending = list(reconfigurations(ctx.cfg)) if mode != "steady" else []
        self.next_start = self.cfg.warmup + self.cfg.pre
        self.stop_at: int | None = None if mode != "steady" else \
            self.cfg.warmup + self.cfg.steady_epochs
        self.handle = None
        self.window: Window | None = None
        self.decisions: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.t0 = 0.0

    def run(self) -> RunResult:
        """Clone the template, run the epochs, check the counts, clean up."""
        shutil.rmtree(self.path, ignore_errors=True)
        clone_state_dir(self.ctx.template, self.path)
        pipe = open_pipeline(self.ctx, self.path)
        load_before = load_avg()
        try:
            pipe = self._loop(pipe)
            fed = len(self.rows) * self.ctx.workload.per_epoch
            expected = self.ctx.initial_total + fed
            check = check_total(state_total(pipe), expected, self.name)
        finally:
            pipe.close()
            if not self.cfg.keep_state:
                shutil.rmtree(self.path, ignore_errors=True)
        label_phases(self.rows, self.windows, self.cfg.warmup)
        return RunResult(self.name, self.rows, self.windows, fed, check, self.notes,
                         (load_before, load_avg()), decisions=self.decisions,
                         phases=self.phases)

    def _loop(self, pipe: Pipeline) -> Pipeline:
        cfg, sampler = self.cfg, self.ctx.sampler
        sampler.take_peak()
        self.t0 = time.time()
        epoch = 0
        with tqdm(desc=self.name, unit="epoch", disable=not cfg.progress, leave=False) as bar:
            while self.stop_at is None or epoch < self.stop_at:
                end = self.t0 + (epoch + 1) * cfg.interval
                if self.mode == "live":  # planned while the epoch's input arrives
                    pipe = self._maybe_reconfigure(pipe, epoch)
                time.sleep(max(0.0, end - time.time()))
                if self.mode != "live":  # stopped once the input is complete
                    pipe = self._maybe_reconfigure(pipe, epoch)
                started = time.time()
                pipe.process(self.ctx.workload.frame(self.ctx.spark, epoch), input_end=end)
                finished = time.time()
                row = self._row(pipe.metrics(last=1)[0], epoch, end, started, finished)
                self.rows.append(row)
                self._after_epoch(row, epoch)
                bar.update(1)
                bar.set_postfix(latency=f"{row.latency_s:.2f}s", moved=row.bins_moved)
                epoch += 1
        return pipe

    def _row(self, m: dict[str, Any], epoch: int, end: float, started: float,
             finished: float) -> EpochRow:
        return epoch_row(self.name, self.t0, m, (epoch, end, started, finished),
                         self.ctx.sampler.take_peak())

    def _maybe_reconfigure(self, pipe: Pipeline, epoch: int) -> Pipeline:
        if self.handle is not None or not self.pending or epoch < self.next_start:
            return pipe
        label, target = self.pending.pop(0)
        start = time.time()
        if self.mode == "live":
            gap = self.cfg.gap if self.strategy in ("fluid", "batched") else 0
            plan = plan_for(pipe, target, self.strategy, self.cfg.per_worker, gap,
                            self.target_latency)
            self.handle = pipe.migrate(plan)
            self.window = Window(label, start - self.t0, math.nan)
            if not plan.adaptive:
                self.notes.append(f"{label}: {len(plan.steps)} step(s), "
                                  f"{plan.meta['bins_moved']} bins, "
                                  f"{plan.meta['keys_moved']:,} keys")
            return pipe
        return self._pause_and_restart(pipe, label, target, start, epoch)

    def _pause_and_restart(self, pipe: Pipeline, label: str, target: Target, start: float,
                           epoch: int) -> Pipeline:
        plan = plan_for(pipe, target, "all-at-once")
        pipe.close()
        stopped = time.time()
        handle = migrate_offline(str(self.path), plan)
        migrated = time.time()
        pipe = open_pipeline(self.ctx, self.path)
        end = time.time()
        self.windows.append(Window(label, start - self.t0, end - self.t0,
                                   plan.meta["keys_moved"], handle.progress.bytes_moved,
                                   migrated - stopped))
        self.phases.append({"label": label, "stop_s": stopped - start, "app_start_s": None,
                            "migrate_s": migrated - stopped, "reopen_s": end - migrated,
                            "pause_s": end - start})
        self.notes.append(
            f"{label}: plan+stop {stopped - start:.2f} s, migrate_offline {migrated - stopped:.2f}"
            f" s, reopen {end - migrated:.2f} s; {plan.meta['bins_moved']} bins, "
            f"{plan.meta['keys_moved']:,} keys")
        self._finished_reconfiguration(epoch)
        return pipe

    def _after_epoch(self, row: EpochRow, epoch: int) -> None:
        if self.window is not None:
            self.window.keys_moved += row.keys_moved
            self.window.bytes_moved += row.bytes_moved
        if self.handle is not None and self.handle.done:
            self.handle.wait(0)  # raises the plan's error, if it failed
            assert self.window is not None
            if self.handle.plan.adaptive:
                self.notes.append(adaptive_note(self.window.label, self.handle))
                self.decisions += [{"reconfiguration": self.window.label, **asdict(d)}
                                   for d in self.handle.policy.decisions]
            self.window.end_s = row.finished_s
            self.windows.append(self.window)
            self.handle, self.window = None, None
            self._finished_reconfiguration(epoch + 1)

    def _finished_reconfiguration(self, next_epoch: int) -> None:
        """Schedule the next reconfiguration (after ``hold``) or the end of the run."""
        self.next_start = next_epoch + self.cfg.hold
        if not self.pending:
            self.stop_at = next_epoch + self.cfg.cooldown


def write_decisions(path: Path, result: RunResult) -> None:
    """The deadline policy's decision before each epoch next to what the epoch then took."""
    rows = {r.epoch: r for r in result.rows}
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["reconfiguration", "epoch", "action", "bins", "bytes", "budget_s",
                         "predicted_s", "duration_s", "latency_s", "note"])
        for d in result.decisions:
            row = rows.get(d["epoch"])
            writer.writerow([d["reconfiguration"], d["epoch"], d["action"], d["bins"],
                             d["bytes"], d["budget_s"], d["predicted_s"],
                             round(row.duration_s, 4) if row else "",
                             round(row.latency_s, 4) if row else "", d["note"]])


def adaptive_note(label: str, handle) -> str:
    """What an adaptive plan's policy did: steps, bins and its decisions by action."""
    p = handle.progress
    actions: dict[str, int] = {}
    for d in getattr(handle.policy, "decisions", ()):
        actions[d.action] = actions.get(d.action, 0) + 1
    told = ", ".join(f"{a} {n}" for a, n in sorted(actions.items()))
    return (f"{label}: {p.steps_done} step(s) chosen live, {p.bins_done} bins; policy "
            f"decisions: {told or '-'}")


# -- native Spark ----------------------------------------------------------------------------


def write_native_input(ctx: Context, directory: Path, preload: bool, epochs: int) -> None:
    """Parquet files, one per trigger, oldest first: the preload (optional) then each epoch.

    Modification times are set one second apart so the file source takes them in order.
    """
    directory.mkdir(parents=True)
    base = time.time() - 10 * (epochs + 2)
    files: list[tuple[Path, Callable[[], np.ndarray]]] = []
    if preload:
        files.append((directory / "e000000.parquet",
                      lambda: np.arange(ctx.cfg.keys, dtype=np.int64)))
    for e in range(epochs):
        files.append((directory / f"e{e + 1:06d}.parquet",
                      lambda e=e: ctx.workload.keys_of(e)))
    for i, (path, keys) in enumerate(files):
        pq.write_table(pa.table({"key": keys()}), path)
        os.utime(path, (base + i, base + i))


def run_native(ctx: Context) -> RunResult:
    """Spark Structured Streaming's stateful count on the same epochs; no migration.

    One parquet file per trigger (``maxFilesPerTrigger=1``) with a processing-time trigger of
    ``--interval``: batch ``b`` starts at its trigger (the end of its input interval) or as soon
    as batch ``b-1`` ends if that is later, exactly like the megaphone harness. Latency is
    ``trigger time + triggerExecution - interval end`` from the query's progress reports.
    """
    cfg, spark = ctx.cfg, ctx.spark
    epochs = cfg.warmup + cfg.steady_epochs
    root = cfg.state_root / "native"
    shutil.rmtree(root, ignore_errors=True)
    preload = cfg.keys <= cfg.native_preload_max
    write_native_input(ctx, root / "input", preload, epochs)
    load_before = load_avg()
    try:
        with native_conf(spark, cfg.workers):
            progress, rss = _native_query(ctx, root, epochs + int(preload))
            total = _native_total(spark, root / "checkpoint")
    finally:
        if not cfg.keep_state:
            shutil.rmtree(root, ignore_errors=True)
    fed = epochs * ctx.workload.per_epoch
    check = check_total(total, (cfg.keys if preload else 0) + fed, "native")
    rows = _native_rows(cfg, progress[int(preload):], rss[int(preload):])
    label_phases(rows, [], cfg.warmup)
    notes = [f"state preloaded with {cfg.keys:,} keys (count 1) in the first batch" if preload
             else f"state NOT preloaded (keys > {cfg.native_preload_max:,}): it holds only the "
                  "keys seen"]
    return RunResult("native", rows, [], fed, check, notes, (load_before, load_avg()))


def _native_query(ctx: Context, root: Path, batches: int) -> tuple[list[dict], list]:
    """Run the streaming count until ``batches`` batches ran.

    Returns their progress reports and, per batch, ``(peak RSS, load average)``.
    """
    cfg, spark = ctx.cfg, ctx.spark
    query = (spark.readStream.schema("key long").option("maxFilesPerTrigger", 1)
             .parquet(str(root / "input")).groupBy("key").count()
             .writeStream.outputMode("update").format("noop")
             .trigger(processingTime=f"{int(cfg.interval * 1000)} milliseconds")
             .option("checkpointLocation", str(root / "checkpoint")).start())
    rss: dict[int, Any] = {}
    ctx.sampler.take_peak()
    seen = -1
    try:
        with tqdm(total=batches, desc="native", unit="batch", disable=not cfg.progress,
                  leave=False) as bar:
            while seen < batches - 1:
                if query.exception() is not None:
                    raise RuntimeError(f"native query failed: {query.exception()}")
                last = query.lastProgress
                if last is not None and last["batchId"] > seen:
                    for b in range(seen + 1, last["batchId"] + 1):
                        rss[b] = (ctx.sampler.take_peak(), load_avg())
                    bar.update(last["batchId"] - seen)
                    seen = last["batchId"]
                time.sleep(0.05)
    finally:
        query.stop()
    by_batch = {p["batchId"]: p for p in query.recentProgress if p["numInputRows"] > 0}
    missing = [b for b in range(batches) if b not in by_batch]
    if missing:
        raise RuntimeError(f"native: no progress report for batches {missing[:10]}")
    return [by_batch[b] for b in range(batches)], [rss[b] for b in range(batches)]


def _native_total(spark, checkpoint: Path) -> int:
    """Sum of all counts in the query's state, read with the ``statestore`` data source."""
    from pyspark.sql import functions as F

    value = spark.read.format("statestore").load(str(checkpoint)) \
        .agg(F.sum("value.count")).first()[0]
    return int(value) if value is not None else 0


def native_schedule(starts: list[float], interval: float, slack: float = 0.1) -> list[float]:
    """The end of every native batch's input interval, from the batches' trigger times.

    Spark triggers a processing-time query on wall-clock multiples of the interval, or at
    once when the previous batch overran. The first batch that starts on such a boundary
    (within ``slack`` seconds) anchors the schedule: batch ``j`` then ends its interval at
    ``anchor + (j - ref) * interval``. From the anchor on, no batch can start before its
    boundary, so late batches show their backlog exactly as in the megaphone harness.
    """
    ref = next((j for j, t in enumerate(starts) if (t % interval) < slack), None)
    if ref is None:  # every batch overran: the first one's start anchors the schedule
        ref, anchor = 0, starts[0]
    else:
        anchor = starts[ref] - starts[ref] % interval
    return [anchor + (j - ref) * interval for j in range(len(starts))]


def _native_rows(cfg: Config, progress: list[dict], rss: list) -> list[EpochRow]:
    starts = [iso_seconds(p["timestamp"]) for p in progress]
    ends = native_schedule(starts, cfg.interval)
    t0 = ends[0] - cfg.interval
    rows = []
    for e, (p, (peak, load)) in enumerate(zip(progress, rss, strict=True)):
        started = starts[e]
        duration = p["durationMs"]["triggerExecution"] / 1000.0
        rows.append(EpochRow(
            run="native", epoch=e, interval_end_s=ends[e] - t0, started_s=started - t0,
            finished_s=started + duration - t0, records=int(p["numInputRows"]),
            latency_s=started + duration - ends[e], duration_s=duration,
            rss_driver_mb=round(peak.driver, 1), rss_jvm_mb=round(peak.jvm, 1),
            rss_workers_mb=round(peak.workers, 1), load1=load))
    return rows


# -- setup -----------------------------------------------------------------------------------


def prepare_template(cfg: Config, spark) -> tuple[Path, int, str]:
    """The bulk-loaded state every run starts from, reused when its settings match.

    Returns ``(path, initial total count, how it was made)``; the load time is kept next to
    the template so later invocations can still report it.
    """
    template = cfg.state_root / "template"
    marker = cfg.state_root / "template.json"
    wanted = {"keys": cfg.keys, "workers": cfg.workers, "bins": cfg.bins,
              "backend": cfg.backend, "value": 1, "routing": ROUTING_FORMAT}
    if template.exists() and marker.exists():
        saved = json.loads(marker.read_text())
        if saved.get("setup") == wanted:
            return template, cfg.keys, f"loaded in {saved['load_s']:.1f} s, reused"
    shutil.rmtree(template, ignore_errors=True)
    marker.unlink(missing_ok=True)
    cfg.state_root.mkdir(parents=True, exist_ok=True)
    started = time.time()
    total = create_loaded(spark, template, cfg.keys, cfg.workers, cfg.bins, cfg.backend,
                          progress=cfg.progress)
    took = time.time() - started
    marker.write_text(json.dumps({"setup": wanted, "load_s": took}))
    return template, total, f"loaded in {took:.1f} s"


def measure_backend(cfg: Config, template: Path) -> dict[str, float]:
    """Export and import rates of the backend on this state, by the pipeline's own calls.

    Takes up to :data:`BACKEND_SAMPLE_KEYS` keys of the first moving bins from their owner in
    the template (read-only) into an empty backend, timing each side, twice: as rows
    (``export_bins``, then ``import_bins(method="auto")``) and, where the backend can, as
    whole-bin files (``write_bin_file``, then ``ingest_bin_files``). ``sequential_keys_per_s``
    is the faster of the two: what a live transfer is held to.
    """
    _, target = reconfigurations(cfg)[0]
    owners = initial_owners(cfg.bins, cfg.workers)
    moving = sorted(target) if isinstance(target, dict) else list(range(cfg.bins))
    src = int(owners[moving[0]])
    bins = [b for b in moving if owners[b] == src]
    source = open_backend(cfg.backend, StateDirPaths(template).worker(src), "int64",
                          cfg.bins, read_only=True)
    rates: dict[str, float] = {}
    try:
        stats = source.bin_stats()
        chosen, n = [], 0
        for b in bins:
            if n >= BACKEND_SAMPLE_KEYS and chosen:
                break
            chosen.append(b)
            n += stats[b].keys if b in stats else 0
        started = time.perf_counter()
        chunks = list(source.export_bins(chosen))
        export_s = time.perf_counter() - started
        keys = sum(c.num_rows for c in chunks)
        import_s = _timed_import(cfg, lambda sink: sink.import_bins(iter(chunks), method="auto"))
        rates.update(keys=keys, rows_export_keys_per_s=keys / export_s,
                     rows_import_keys_per_s=keys / import_s,
                     rows_keys_per_s=keys / (export_s + import_s))
        if source.supports_bin_files:
            started = time.perf_counter()
            files = [f for f in map(source.write_bin_file, chosen) if f is not None]
            export_s = time.perf_counter() - started
            import_s = _timed_import(cfg, lambda sink: sink.ingest_bin_files(files))
            shutil.rmtree(os.path.dirname(files[0].path), ignore_errors=True)
            rates.update(files_export_keys_per_s=keys / export_s,
                         files_import_keys_per_s=keys / import_s,
                         files_keys_per_s=keys / (export_s + import_s))
    finally:
        source.close()
    rates["sequential_keys_per_s"] = max(rates["rows_keys_per_s"],
                                         rates.get("files_keys_per_s", 0.0))
    return rates


def backend_line(rates: dict[str, float]) -> str:
    """The backend's own export and import rates on this state, as a sentence."""
    text = f"Backend on this state (export then import of {rates.get('keys', 0):,.0f} keys):"
    for path in ("rows", "files"):
        if f"{path}_keys_per_s" in rates:
            text += (f" as {path}, export {rate(rates[f'{path}_export_keys_per_s'])} keys/s, "
                     f"import {rate(rates[f'{path}_import_keys_per_s'])} keys/s, one after "
                     f"the other {rate(rates[f'{path}_keys_per_s'])} keys/s;")
    return text[:-1] + "."


def _timed_import(cfg: Config, load: Callable[[Any], Any]) -> float:
    """Seconds ``load(sink)`` takes on a new empty backend."""
    with tempfile.TemporaryDirectory(dir=cfg.state_root) as tmp:
        sink = open_backend(cfg.backend, Path(tmp) / "sink", "int64", cfg.bins)
        try:
            started = time.perf_counter()
            load(sink)
            return time.perf_counter() - started
        finally:
            sink.close()


# -- summary ---------------------------------------------------------------------------------


def findings(stats: dict[str, dict[str, Any]], backend: dict[str, float]) -> list[str]:
    """The targets of the benchmark, each measured and marked met or missed."""
    out: list[str] = []
    steady = stats.get("steady")
    for name in ("fluid", "batched"):
        s = stats.get(name)
        if s is None:
            continue
        ref = steady["steady_p99"] if steady else s["steady_p99"]
        r = ratio(s["mig_max"], ref)
        verdict = "met" if r <= 1.5 else f"MISSED by {r / 1.5:.2f}x"
        out.append(f"{name}: max latency during migration {ms(s['mig_max'])} ms = {fmt_x(r)} "
                   f"the steady-state p99 ({ms(ref)} ms); target <= 1.5x: {verdict}")
    smooth = [stats[n]["mig_max"] for n in ("fluid", "batched") if n in stats]
    for name in ("all-at-once", "pause-restart", "restart-app", "native-repartition"):
        s = stats.get(name)
        if s is None or not smooth:
            continue
        parts = [f"{fmt_x(ratio(s['mig_max'], stats[n]['mig_max']))} {n}"
                 for n in ("fluid", "batched") if n in stats]
        out.append(f"{name}: max latency {ms(s['mig_max'])} ms, spike = " + ", ".join(parts)
                   + "; longest drain after a reconfiguration " + "; ".join(
                       f"{n} {drained(stats[n]['drain_s'])}" for n in (name, "fluid", "batched")
                       if n in stats))
    for name in (*LIVE_STRATEGIES, "pause-restart", "restart-app"):
        s = stats.get(name)
        if s is None or not backend:
            continue
        out.append(
            f"{name}: moved {s['keys_moved']:,} keys in {s['migration_s']:.1f} s = "
            f"{rate(s['keys_per_s'])} keys/s over the window, {rate(s['busy_keys_per_s'])} "
            f"keys/s over the busy time of moving epochs; backend export+import on this "
            f"state: {rate(backend['sequential_keys_per_s'])} keys/s "
            f"({fmt_x(ratio(s['busy_keys_per_s'], backend['sequential_keys_per_s']))})")
        if s["transfer_s"] > 0:
            own = s["keys_moved"] / backend["sequential_keys_per_s"] / max(1, s["bins_moved"])
            out.append(
                f"{name}: the transfer's own time (export + ship + install, from the workers' "
                f"timings) {ms(s['transfer_s_per_bin'])} ms per bin, "
                f"{rate(s['transfer_keys_per_s'])} keys/s; the backend's export+import of the "
                f"same keys: {ms(own)} ms per bin "
                f"({fmt_x(ratio(s['transfer_keys_per_s'], backend['sequential_keys_per_s']))})")
    for name in ("fluid", "batched"):
        s = stats.get(name)
        if s is None:
            continue
        growth = ratio(s["rss_mig"], s["rss_steady"]) - 1
        workers = ratio(s["rss_workers_mig"], s["rss_workers_steady"]) - 1
        verdict = "met" if growth <= 0.10 else "MISSED"
        out.append(f"{name}: peak RSS (driver + JVM + Python workers) during migration "
                   f"{fmt_mb(s['rss_mig'])} MiB vs {fmt_mb(s['rss_steady'])} MiB in the same "
                   f"run's steady epochs ({growth:+.1%}; Python workers alone {workers:+.1%}); "
                   f"target <= +10%: {verdict}")
    native = stats.get("native")
    mega = steady or next(iter(stats.values()), None)
    if native and mega and mega is not native:
        p50 = fmt_x(ratio(mega["steady_p50"], native["steady_p50"]))
        out.append(
            f"steady state, megaphone ({mega['run']}) vs native: p50 {ms(mega['steady_p50'])} vs "
            f"{ms(native['steady_p50'])} ms ({p50}), p99 {ms(mega['steady_p99'])} vs "
            f"{ms(native['steady_p99'])} ms; capacity "
            f"(records / busy s) {rate(mega['capacity_rps'])} vs {rate(native['capacity_rps'])} "
            f"records/s")
    return out


def drained(seconds: float) -> str:
    """A drain time as ``1.2 s``, or ``not drained`` (NaN: not within the run)."""
    return "not drained" if math.isnan(seconds) else f"{seconds:.1f} s"


def target_misses(result: RunResult, target: float) -> dict[str, Any]:
    """Epochs over ``target`` seconds of latency while the run migrated (and drained)."""
    during = [r for r in result.rows if r.phase in (MIGRATION, DRAIN)]
    return {"epochs": len(during), "over": sum(r.latency_s > target for r in during),
            "max": max((r.latency_s for r in during), default=math.nan)}


def target_table(results: list[RunResult]) -> tuple[str, list[str]]:
    """Per latency target of a deadline run: misses, max latency and migration time of fluid,
    batched and the deadline run (markdown), and the issue's verdict per target."""
    by_name = {r.name: r for r in results}
    lines = ["| target L s | run | epochs over L during migration | epochs during migration "
             "| max ms during | migration s |", "|" + "---|" * 6]
    verdicts: list[str] = []
    for name in [n for n in by_name if deadline_target(n)]:
        target = deadline_target(name)
        assert target is not None
        row = {}
        for run in ("fluid", "batched", name):
            if run not in by_name:
                continue
            m = target_misses(by_name[run], target)
            row[run] = (m, run_stats(by_name[run])["migration_s"])
            lines.append(f"| {target:g} | {run} | {m['over']} | {m['epochs']} | "
                         f"{ms(m['max'])} | {secs(row[run][1])} |")
        if "fluid" in row:
            (mine, mine_s), (fluid, fluid_s) = row[name], row["fluid"]
            misses = "met" if mine["over"] <= fluid["over"] else "MISSED"
            faster = "met" if mine_s < fluid_s else "MISSED"
            verdicts.append(
                f"{name}: {mine['over']} epochs over {target:g} s vs {fluid['over']} for fluid "
                f"(no more: {misses}); migration {secs(mine_s)} s vs {secs(fluid_s)} s for fluid "
                f"({fmt_x(ratio(fluid_s, mine_s))} faster; faster: {faster})")
        ratios = prediction_ratios(by_name[name])
        if ratios:
            verdicts.append(
                f"{name}: epoch duration measured / predicted (calibrated, without the "
                f"margin) over the {len(ratios)} epochs it moved bins: median "
                f"{pct(ratios, 50):.2f}, p90 {pct(ratios, 90):.2f}, max {max(ratios):.2f}")
    return "\n".join(lines), verdicts


def write_summary(ctx: Context, results: list[RunResult], info: dict[str, Any]) -> str:
    """Write ``summary.md`` and ``summary.json``; return the markdown."""
    cfg = ctx.cfg
    stats = {r.name: run_stats(r) for r in results}
    steady = stats.get("steady")
    ref = steady["steady_p99"] if steady else math.nan
    load = info["loaded"]
    targets = target_table(results)
    lines = [
        f"# Migration benchmark: {cfg.keys:,} keys",
        "",
        "Commands: " + ", ".join(sorted({f"`{r.command}`" for r in results})),
        "",
        f"Machine: {info['machine']}",
        "",
        f"Setup: {cfg.rate:,.0f} records/s in epochs of {cfg.interval} s "
        f"({cfg.per_epoch:,} records), keyed count, {cfg.keys:,} keys bulk-loaded "
        f"(count 1; {load}), {cfg.workers} workers, {cfg.bins} bins, backend "
        f"{cfg.backend}, scenario {cfg.scenario}, warm-up {cfg.warmup} epochs, batched "
        f"per_worker={cfg.per_worker}, gap {cfg.gap} epochs between steps of fluid and "
        f"batched, Spark master {cfg.master}.",
        "",
        stats_table([stats[r.name] for r in results], ref),
        "",
        "Reconfiguration cost, side by side: the latency spike, the epochs over 1.5x the run's "
        "own steady p99 during migration and drain, the drain time from the end of each "
        "reconfiguration (the restart) until the backlog was worked off (the last epoch over "
        "1.5x the run's steady median latency before one back within it completed; \"not "
        "drained\": not back within it before the next reconfiguration or the run's end), and "
        "the phases of each pause (stop, new application start, migration or repartition, "
        "reopen).",
        "",
        spike_table([stats[r.name] for r in results], {r.name: r.phases for r in results}),
        "",
        backend_line(ctx.backend_rates),
        "",
        "Findings:",
        "",
        *[f"- {line}" for line in findings(stats, ctx.backend_rates)],
        *[f"- {line}" for line in targets[1]],
        "",
        *([targets[0], ""] if any(deadline_target(r.name) for r in results) else []),
        "Run notes:",
        "",
        *[f"- {r.name}: load average {r.load_avg[0]:.1f} at the start, {r.load_avg[1]:.1f} at "
          f"the end, {stats[r.name]['load_mean']:.1f} on average; " + "; ".join(r.notes)
          for r in results],
        "",
    ]
    text = "\n".join(lines)
    (cfg.out / "summary.md").write_text(text)
    payload = {"config": {k: str(v) if isinstance(v, Path) else v
                          for k, v in asdict(cfg).items()},
               "info": info, "backend": ctx.backend_rates,
               "runs": {r.name: {**stats[r.name], "notes": r.notes, "load_avg": r.load_avg,
                                 "records_fed": r.records_fed, "phases": r.phases,
                                 "windows": [asdict(w) for w in r.windows]} for r in results}}
    (cfg.out / "summary.json").write_text(json.dumps(payload, indent=1, default=str))
    return text


# -- main ------------------------------------------------------------------------------------


def run_all(cfg: Config, spark, command: str) -> list[RunResult]:
    """Load (or reuse) the template, run every selected run, write every output."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    sampler = RssSampler()
    sampler.start()
    try:
        spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
        template, total, loaded = prepare_template(cfg, spark)
        workload = Workload(cfg.keys, cfg.per_epoch)
        ctx = Context(cfg, spark, workload, template, total, sampler)
        ctx.backend_rates = measure_backend(cfg, template)
        prime(ctx)
        results: dict[str, RunResult] = earlier_runs(cfg) if cfg.merge else {}
        for name in run_order(cfg.runs):
            result = run_one(ctx, name)
            result.command = command
            write_csv(cfg.out / f"{name}.csv", result.rows)
            if result.decisions:
                write_decisions(cfg.out / f"{name}-decisions.csv", result)
            save_result(cfg.out / f"{name}.json", result, setup_key(cfg))
            results[name] = result
            s = run_stats(result)
            print(f"{name:>18}: steady p99 {ms(s['steady_p99'])} ms, max during migration "
                  f"{ms(s['mig_max'])} ms, migration {secs(s['migration_s'])} s, drain "
                  f"{secs(s['drain_s'])} s, {result.check}", flush=True)
    finally:
        sampler.stop()
    results = [results[name] for name in run_order(list(results))]
    steady = next((run_stats(r) for r in results if r.name == "steady"), None)
    ref = 1.5 * steady["steady_p99"] if steady else math.nan
    targets = {r.name: deadline_target(r.name) for r in results if deadline_target(r.name)}
    plot_timelines(cfg.out / "latency.png", results, "latency", ref, targets)
    plot_timelines(cfg.out / "memory.png", results, "rss")
    info = {"command": command, "machine": machine(), "loaded": loaded}
    print(write_summary(ctx, results, info), flush=True)
    return results


def setup_key(cfg: Config) -> dict[str, Any]:
    """The settings runs must share to be compared (and merged from earlier invocations)."""
    return {k: getattr(cfg, k) for k in (
        "keys", "rate", "interval", "workers", "bins", "scenario", "warmup", "pre", "hold",
        "cooldown", "steady_epochs", "per_worker", "gap", "backend", "master")}


def earlier_runs(cfg: Config) -> dict[str, RunResult]:
    """Runs saved in ``--out`` by earlier invocations with the same setup (``--merge``)."""
    found = {}
    names = [*RUN_ORDER, *(p.stem for p in cfg.out.glob(f"{DEADLINE_RUN}*.json"))]
    for name in run_order(names):
        path = cfg.out / f"{name}.json"
        if name not in cfg.runs and path.exists():
            result = load_result(path, setup_key(cfg))
            if result is not None:
                found[name] = result
    return found


def run_one(ctx: Context, name: str) -> RunResult:
    """Run one of :data:`RUN_ORDER` (or a ``deadline@L`` run) by name."""
    target = deadline_target(name)
    if target is not None:
        return LiveRun(ctx, name, "live", strategy="deadline", target_latency=target).run()
    if name == "native":
        return run_native(ctx)
    if name == "steady":
        return LiveRun(ctx, name, "steady").run()
    if name == "pause-restart":
        return LiveRun(ctx, name, "pause").run()
    if name in RESTART_RUNS:
        return run_restart_baseline(ctx, name)
    return LiveRun(ctx, name, "live", strategy=name).run()


def main(argv: list[str] | None = None, spark=None) -> int:
    """Command line entry; ``spark`` reuses an existing session (tests)."""
    args = parser().parse_args(argv)
    cfg = resolve(args)
    command = "python bench/migration.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if spark is None:
        from megaphone.spark import spark_session

        spark = spark_session(cfg.master, "megaphone-bench",
                              {"spark.driver.memory": cfg.driver_memory})
    started = time.time()
    run_all(cfg, spark, command)
    print(f"benchmark done in {time.time() - started:.1f} s; outputs in {cfg.out}")
    return 0


__all__ = ["Config", "CorrectnessError", "LiveRun", "Workload", "main", "reconfigurations",
           "run_all", "run_native"]

if __name__ == "__main__":
    sys.exit(main())
