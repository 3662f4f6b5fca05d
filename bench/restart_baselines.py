"""Restart baselines of the migration benchmark: what stopping the job costs its user.

Two runs of ``bench/migration.py`` on the same open-loop input as the others (epoch ``e``'s
input interval is ``[t0 + e*I, t0 + (e+1)*I)``, the input keeps arriving while the job is
down, and the backlog then drains as latency):

* ``restart-app`` -- megaphone's pause-and-restart paying a real application restart. Each
  stretch of epochs between two reconfigurations runs in its own child process (a new Python
  interpreter, a new SparkSession, a new JVM). The first child primes its JVM like the harness
  does, picks ``t0``, runs the epochs up to the reconfiguration, closes the pipeline, stops
  Spark and exits. The next child -- started as soon as the previous one exited -- plans the
  move from the stopped state directory (``megaphone.rescale`` on the path, all-at-once, the
  plan the warm ``pause-restart`` makes), runs ``migrate_offline`` like ``pause-restart``
  does, then starts its SparkSession, reopens the pipeline and continues the epochs on the
  first child's ``t0``. A child stops when the next epoch's input interval has ended (where
  ``pause-restart`` pauses), not as soon as its last epoch is done. Timed per restart: *stop*
  (pipeline close + Spark stop + process exit), *app start* (interpreter and imports +
  SparkSession start; the restarted application is cold, as a user's is), *migrate* (plan +
  ``migrate_offline``), *reopen* (the pipeline).
  Children write their epochs to a JSON file the harness reads.
* ``native-repartition`` -- Spark Structured Streaming's own ``groupBy(key).count()`` (RocksDB
  state store), stopped between triggers at the epoch where megaphone's reconfiguration
  starts, its state repartitioned offline with
  ``spark._streamingCheckpointManager.repartition`` (PySpark >= 4.2, experimental), and
  restarted on the same checkpoint. The query restarts **in the harness's SparkSession** (no
  new JVM: the application restart a user would also pay is what ``restart-app`` measures).
  Spark cannot move chosen keys, only change the number of state partitions, so each
  reconfiguration goes from ``W`` to ``2W`` shuffle partitions ("out", "scale-out") or from
  ``2W`` back to ``W`` ("back"). Timed per restart: *stop* (``query.stop()``), *migrate* (the
  repartition), *reopen* (starting the query again). The input is one parquet file per epoch,
  written (atomically) by a feeder thread when the epoch's interval ends; the query runs with
  the default trigger and ``maxFilesPerTrigger=1``, so a batch is one epoch, started as soon
  as its file exists and the previous batch ended -- the harness's own rule, which lets a
  backlog drain as fast as Spark can (``native``'s processing-time trigger over files written
  in advance would take a backlog one file per interval and never catch up). At the end the input
  stops, the query is stopped, and the state as of the last batch that reported progress is
  read back with the ``statestore`` data source: it must total the preloaded counts plus the
  records of the batches reported.

Both runs keep going after their last restart for at least ``--cooldown`` epochs and then
until an epoch's latency is back within 1.5x the steady median of the first stretch, so the
drain time (:func:`report.drain_times`, the same for every run) can be measured; at most
``--drain-epochs`` more.

    python bench/restart_baselines.py --child SPEC.json OUT.json   # one child of restart-app
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from load import clone_state_dir
from procmem import RssSampler
from report import DRAIN_FACTOR, EpochRow, RunResult, Window, label_phases, pct
from run_setup import (
    Config,
    Context,
    Target,
    Workload,
    check_total,
    epoch_row,
    iso_seconds,
    load_avg,
    native_conf,
    open_pipeline,
    prime,
    reconfigurations,
    state_total,
)

RESTART_RUNS = ("restart-app", "native-repartition")


@dataclass(frozen=True)
class Stretch:
    """The epochs one application (or one query) runs: ``first`` up to ``stop`` (exclusive).

    The last stretch has no ``stop``: it runs to ``min_end`` at least, then until an epoch's
    latency is within the drain threshold or ``max_end``. ``step`` is the reconfiguration made
    before its first epoch (none for the first stretch).
    """

    first: int
    stop: int | None
    step: tuple[str, Target] | None = None
    min_end: int = 0
    max_end: int = 0


def stretches(cfg: Config) -> list[Stretch]:
    """The scenario cut at its reconfigurations, with ``pause-restart``'s schedule: the first
    at ``warmup + pre``, the next ``max(1, hold)`` epochs after the previous restart."""
    start = cfg.warmup + cfg.pre
    out = [Stretch(0, start)]
    steps = reconfigurations(cfg)
    for i, step in enumerate(steps):
        if i + 1 < len(steps):
            end = start + max(1, cfg.hold)
            out.append(Stretch(start, end, step))
            start = end
        else:
            out.append(Stretch(start, None, step, start + cfg.cooldown,
                               start + cfg.cooldown + cfg.drain_epochs))
    return out


def should_stop(stretch: Stretch, done: int, latency: float, threshold: float) -> bool:
    """Whether a stretch ends after ``done`` epochs in all, the last of them ``latency`` late."""
    if stretch.stop is not None:
        return done >= stretch.stop
    return done >= stretch.max_end or (done >= stretch.min_end and latency <= threshold)


def steady_threshold(latencies: list[float]) -> float:
    """The drain threshold from the steady epochs' latencies (1.5x their median)."""
    return DRAIN_FACTOR * pct(latencies, 50)


# -- restart-app: the parent --------------------------------------------------------------


def run_restart_app(ctx: Context, name: str = "restart-app") -> RunResult:
    """megaphone pause-and-restart with a new application (a child process) per stretch."""
    cfg = ctx.cfg
    path, work = cfg.state_root / name, cfg.state_root / f"{name}-children"
    for d in (path, work):
        shutil.rmtree(d, ignore_errors=True)
    clone_state_dir(ctx.template, path)
    work.mkdir(parents=True)
    load_before = load_avg()
    rows: list[EpochRow] = []
    windows: list[Window] = []
    phases: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        prev: dict[str, Any] = {}
        plan = stretches(cfg)
        for i, stretch in enumerate(plan):
            spec = child_spec(ctx, name, path, stretch, prev.get("t0"), i, len(plan))
            if i:  # from the first application's steady epochs
                spec["threshold"] = steady_threshold(
                    [r.latency_s for r in rows if cfg.warmup <= r.epoch < plan[1].first])
            result = run_child(spec, work / f"child{i}.json")
            rows += [EpochRow(**r) for r in result["rows"]]
            if i:
                assert stretch.step is not None
                phase = restart_phases(stretch.step[0], prev, result)
                phases.append(phase)
                windows.append(restart_window(phase, prev, result))
                notes.append(restart_note(phase, result))
            prev = result
        fed = len(rows) * ctx.workload.per_epoch
        check = check_total(prev["total"], ctx.initial_total + fed, name)
    finally:
        if not cfg.keep_state:
            for d in (path, work):
                shutil.rmtree(d, ignore_errors=True)
    notes.insert(0, "one process per stretch (new interpreter, SparkSession and JVM); the first "
                    "primed, the restarted ones cold")
    label_phases(rows, windows, cfg.warmup)
    return RunResult(name, rows, windows, fed, check, notes, (load_before, load_avg()),
                     phases=phases)


def child_spec(ctx: Context, name: str, path: Path, stretch: Stretch, t0: float | None,
               index: int, count: int) -> dict[str, Any]:
    """What a child needs, as JSON: settings, state directory, its stretch and ``t0``."""
    cfg = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(ctx.cfg).items()}
    step = None
    if stretch.step is not None:
        label, target = stretch.step
        step = [label, target if isinstance(target, int) else sorted(target.items())]
    return {"cfg": cfg, "name": name, "path": str(path), "template": str(ctx.template),
            "initial_total": ctx.initial_total, "t0": t0, "prime": index == 0,
            "final": index == count - 1, "stretch": {**asdict(stretch), "step": step},
            "threshold": math.inf}


def run_child(spec: dict[str, Any], spec_path: Path) -> dict[str, Any]:
    """Start a child on ``spec``, wait for it to exit and return its result.

    The result's ``times`` gain ``spawned`` and ``exited`` (epoch seconds, seen from here).
    """
    spec_path.write_text(json.dumps(spec))
    out = spec_path.with_suffix(".out.json")
    spawned = time.time()
    code = subprocess.call([sys.executable, str(Path(__file__).resolve()), "--child",
                            str(spec_path), str(out)])
    exited = time.time()
    if code != 0:
        raise RuntimeError(f"{spec['name']}: child process {spec_path.name} exited with {code}")
    result = json.loads(out.read_text())
    result["times"].update(spawned=spawned, exited=exited)
    return result


def restart_phases(label: str, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The seconds of each phase between the stop of ``before`` and the reopen in ``after``.

    They add up to the pause: stop + app start + migrate + reopen.
    """
    b, a = before["times"], after["times"]
    return {"label": label, "stop_s": b["exited"] - b["stop_start"],
            "app_start_s": (a["migrate_start"] - b["exited"])
            + (a["session_ready"] - a["migrate_end"]),
            "imports_s": a["ready"] - a["spawned"],
            "session_s": a["session_ready"] - a["migrate_end"],
            "migrate_s": a["migrate_end"] - a["migrate_start"],
            "reopen_s": a["reopened"] - a["session_ready"],
            "pause_s": a["reopened"] - b["stop_start"]}


def restart_window(phase: dict[str, Any], before: dict[str, Any],
                   after: dict[str, Any]) -> Window:
    """The reconfiguration window of a restart: from the stop until the pipeline reopened."""
    t0, moved = after["t0"], after["moved"]
    return Window(phase["label"], before["times"]["stop_start"] - t0,
                  after["times"]["reopened"] - t0, moved["keys_moved"], moved["bytes_moved"],
                  phase["migrate_s"])


def restart_note(phase: dict[str, Any], after: dict[str, Any]) -> str:
    """One restart's phases and moves, as a sentence."""
    moved = after["moved"]
    return (f"{phase['label']}: stop {phase['stop_s']:.2f} s (close + Spark stop + exit), app "
            f"start {phase['app_start_s']:.2f} s (interpreter and imports "
            f"{phase['imports_s']:.2f} s, SparkSession {phase['session_s']:.2f} s), migrate "
            f"{phase['migrate_s']:.2f} s (plan + migrate_offline), reopen "
            f"{phase['reopen_s']:.2f} s; paused {phase['pause_s']:.2f} s; "
            f"{moved['bins_moved']} bins, {moved['keys_moved']:,} keys")


# -- restart-app: a child -------------------------------------------------------------------


def config_from(raw: dict[str, Any]) -> Config:
    """The benchmark's :class:`Config` back from its JSON form."""
    paths = {f.name for f in fields(Config) if f.type in ("Path", Path)}
    return Config(**{k: Path(v) if k in paths else tuple(v) if k == "runs" else v
                     for k, v in raw.items()})


def migrate_step(path: str, target: Any) -> dict[str, int]:
    """Plan (all-at-once, from the stopped state directory) and apply one move offline."""
    from megaphone import rescale
    from megaphone.migrator.control.offline import migrate_offline

    goal = {"workers": target} if isinstance(target, int) else \
        {"target": {int(b): int(w) for b, w in target}}
    plan = rescale(path, **goal, strategy="all-at-once")
    handle = migrate_offline(path, plan)
    return {"bins_moved": int(plan.meta["bins_moved"]),
            "keys_moved": int(plan.meta["keys_moved"]),
            "bytes_moved": int(handle.progress.bytes_moved)}


def child_main(spec_path: Path, out: Path) -> int:
    """One application of ``restart-app``: migrate (if its stretch starts with a move), start
    Spark, run the stretch's epochs, stop; the result goes to ``out`` as JSON."""
    from megaphone.spark import spark_session

    times = {"ready": time.time()}
    spec = json.loads(spec_path.read_text())
    cfg, stretch = config_from(spec["cfg"]), spec["stretch"]
    moved = {"bins_moved": 0, "keys_moved": 0, "bytes_moved": 0}
    times["migrate_start"] = time.time()
    if stretch["step"] is not None:
        moved = migrate_step(spec["path"], stretch["step"][1])
    times["migrate_end"] = time.time()
    spark = spark_session(cfg.master, f"megaphone-bench-{spec['name']}",
                          {"spark.driver.memory": cfg.driver_memory})
    times["session_ready"] = time.time()
    sampler = RssSampler()
    sampler.start()
    try:
        ctx = Context(cfg, spark, Workload(cfg.keys, cfg.per_epoch), Path(spec["template"]),
                      spec["initial_total"], sampler)
        if spec["prime"]:
            prime(ctx)
        pipe = open_pipeline(ctx, Path(spec["path"]))
        times["reopened"] = time.time()
        t0 = spec["t0"] if spec["t0"] is not None else time.time()
        rows = child_epochs(ctx, pipe, spec, t0)
        total = state_total(pipe) if spec["final"] else None
        if stretch["stop"] is not None:  # like pause-restart: once the next input has ended
            time.sleep(max(0.0, t0 + (stretch["stop"] + 1) * cfg.interval - time.time()))
        times["stop_start"] = time.time()
        pipe.close()
        spark.stop()
    finally:
        sampler.stop()
    out.write_text(json.dumps({"t0": t0, "rows": [asdict(r) for r in rows], "times": times,
                               "moved": moved, "total": total}))
    return 0


def child_epochs(ctx: Context, pipe, spec: dict[str, Any], t0: float) -> list[EpochRow]:
    """The stretch's epochs on the open-loop schedule of ``t0`` (the harness's loop)."""
    cfg, raw = ctx.cfg, spec["stretch"]
    stretch = Stretch(raw["first"], raw["stop"], None, raw["min_end"], raw["max_end"])
    rows: list[EpochRow] = []
    epoch = stretch.first
    with tqdm(desc=spec["name"], unit="epoch", disable=not cfg.progress, leave=False) as bar:
        while not rows or not should_stop(stretch, epoch, rows[-1].latency_s,
                                          spec["threshold"]):
            end = t0 + (epoch + 1) * cfg.interval
            time.sleep(max(0.0, end - time.time()))
            started = time.time()
            pipe.process(ctx.workload.frame(ctx.spark, epoch), input_end=end)
            finished = time.time()
            rows.append(epoch_row(spec["name"], t0, pipe.metrics(last=1)[0],
                                  (epoch, end, started, finished), ctx.sampler.take_peak()))
            bar.update(1)
            epoch += 1
    return rows


# -- native-repartition ------------------------------------------------------------------


class Feeder(threading.Thread):
    """Writes epoch ``e``'s input file when its interval ends (``t0 + (e+1)*I``).

    Files are written aside and renamed into the input directory whole. Epochs from ``gate``
    on wait until :meth:`open` moves the gate (the query is stopped between triggers while
    no new file can arrive); :meth:`finish` ends the input after the epochs written so far.
    """

    def __init__(self, workload: Workload, root: Path, interval: float, gate: int,
                 first_file: int):
        super().__init__(daemon=True, name="native-feeder")
        self.workload, self.root, self.interval = workload, root, interval
        self.first_file = first_file
        self.t0 = math.nan
        self.cond = threading.Condition()
        self.gate: float = gate
        self.limit: int | None = None
        self.written = 0
        self.error: BaseException | None = None

    def open(self, gate: float) -> None:
        """Let epochs up to ``gate`` (exclusive) be written."""
        with self.cond:
            self.gate = gate
            self.cond.notify_all()

    def finish(self) -> int:
        """Write no more epochs; returns how many were written."""
        with self.cond:
            self.limit = self.written
            self.cond.notify_all()
            return self.written

    def run(self) -> None:
        try:
            epoch = 0
            while True:
                time.sleep(max(0.0, self.t0 + (epoch + 1) * self.interval - time.time()))
                with self.cond:
                    while epoch >= self.gate and self.limit is None:
                        self.cond.wait()
                    if self.limit is not None:
                        return
                    self.write(epoch)
                epoch += 1
        except BaseException as exc:  # reported by the run's loop
            self.error = exc

    def write(self, epoch: int) -> None:
        """Epoch ``epoch``'s keys as one parquet file in the input directory."""
        name = f"e{self.first_file + epoch:06d}.parquet"
        staged = self.root / "staging" / name
        pq.write_table(pa.table({"key": self.workload.keys_of(epoch)}), staged)
        staged.rename(self.root / "input" / name)
        self.written = epoch + 1


def native_targets(cfg: Config) -> list[tuple[str, int]]:
    """The partition count each reconfiguration repartitions the native state to."""
    return [(label, cfg.workers if label == "back" else 2 * cfg.workers)
            for label, _ in reconfigurations(cfg)]


class NativeRestarts:
    """The ``native-repartition`` run: stop, repartition and restart Spark's own query."""

    name = "native-repartition"
    #: How many times a batch reads its input file (a query reading its source twice, as a
    #: self-join does, reports twice the rows).
    scans = 1

    def __init__(self, ctx: Context, root: Path, preload: bool):
        self.ctx, self.cfg, self.spark, self.root = ctx, ctx.cfg, ctx.spark, root
        self.preload = preload
        self.plan = stretches(self.cfg)
        self.feeder = Feeder(ctx.workload, root, self.cfg.interval, self.plan[1].first,
                             int(preload))
        self.progress: list[dict] = []  # of the queries stopped so far
        self.rss: dict[int, tuple[Any, float]] = {}
        self.last_batch = -1
        self.windows: list[Window] = []
        self.phases: list[dict[str, Any]] = []
        self.query = None

    def start_query(self):
        """The stateful count on the input directory, on the run's checkpoint."""
        return (self.spark.readStream.schema("key long").option("maxFilesPerTrigger", 1)
                .parquet(str(self.root / "input")).groupBy("key").count()
                .writeStream.outputMode("update").format("noop")
                .option("checkpointLocation", str(self.root / "checkpoint")).start())

    def run(self) -> list[EpochRow]:
        """Feed, stop and repartition at each reconfiguration, drain; the epochs' rows."""
        (self.root / "input").mkdir(parents=True)
        (self.root / "staging").mkdir()
        if self.preload:
            pq.write_table(pa.table({"key": pa.array(range(self.cfg.keys), pa.int64())}),
                           self.root / "input" / "e000000.parquet")
        self.query = self.start_query()
        try:
            self.wait_batches(int(self.preload))
            self.feeder.t0 = time.time()
            self.feeder.start()
            targets = dict(native_targets(self.cfg))
            for i, stretch in enumerate(self.plan[1:], start=1):
                self.wait_epochs(stretch.first)
                assert stretch.step is not None
                label = stretch.step[0]
                self.restart(label, targets[label], stretch.first, self.plan[i + 1].first
                             if i + 1 < len(self.plan) else math.inf)
            self.drain(self.plan[-1], steady_threshold(
                [r.latency_s for r in self.rows() if r.epoch >= self.cfg.warmup
                 and r.epoch < self.plan[1].first]))
        finally:
            self.feeder.finish()
            self.stop_query()
        return self.rows()

    def restart(self, label: str, partitions: int, epoch: int, next_gate: float) -> None:
        """Stop the (idle) query, repartition its checkpoint, start it again, reopen input.

        Like the harness's pause before ``epoch``: once its input interval has ended (the
        previous epochs have run), so the pause cannot overlap the wait for its input.
        """
        t0 = self.feeder.t0
        time.sleep(max(0.0, t0 + (epoch + 1) * self.cfg.interval - time.time()))
        started = time.time()
        self.stop_query()
        stopped = time.time()
        self.spark._streamingCheckpointManager.repartition(
            str(self.root / "checkpoint"), partitions)
        repartitioned = time.time()
        self.query = self.start_query()
        reopened = time.time()
        self.feeder.open(next_gate)
        self.windows.append(Window(label, started - t0, reopened - t0,
                                   busy_s=repartitioned - stopped))
        self.phases.append({"label": label, "stop_s": stopped - started, "app_start_s": None,
                            "migrate_s": repartitioned - stopped,
                            "reopen_s": reopened - repartitioned,
                            "pause_s": reopened - started, "partitions": partitions})

    def stop_query(self) -> None:
        """Stop the running query (if any) and keep its progress reports."""
        if self.query is None:
            return
        self.query.stop()
        self.progress += self.query.recentProgress
        self.query = None

    def data_batches(self) -> list[dict]:
        """Progress of every batch that read input, in batch order (preload first)."""
        current = self.query.recentProgress if self.query is not None else []
        seen = {p["batchId"]: p for p in [*self.progress, *current] if p["numInputRows"] > 0}
        return [seen[b] for b in sorted(seen)]

    def poll(self) -> int:
        """Check the query and the feeder, sample memory per new batch; batches with input."""
        if self.query.exception() is not None:
            raise RuntimeError(f"{self.name}: query failed: {self.query.exception()}")
        if self.feeder.error is not None:
            raise RuntimeError(f"{self.name}: input feeder failed: {self.feeder.error}")
        last = self.query.lastProgress
        if last is not None and last["batchId"] > self.last_batch:
            sample = (self.ctx.sampler.take_peak(), load_avg())
            self.rss.update({b: sample for b in range(self.last_batch + 1, last["batchId"] + 1)})
            self.last_batch = last["batchId"]
        time.sleep(0.05)
        return len(self.data_batches())

    def wait_batches(self, n: int) -> None:
        """Until ``n`` batches with input ran."""
        while self.poll() < n:
            pass

    def wait_epochs(self, n: int) -> None:
        """Until the batches of epochs ``0 .. n-1`` ran."""
        self.wait_batches(n + int(self.preload))

    def drain(self, last: Stretch, threshold: float,
              give_up: Callable[[list[float]], bool] | None = None) -> None:
        """Run the last stretch: ``--cooldown`` epochs, then until drained (or ``max_end``),
        or until ``give_up`` (given every epoch's latency so far) says to stop.

        The input then ends; the query is stopped without waiting for a backlog left (the
        state is checked at the last batch that reported progress, see :meth:`counted_batch`).
        """
        done = last.first
        while True:
            self.wait_epochs(done + 1)
            rows = self.rows()
            done = len(rows)
            if should_stop(last, done, rows[-1].latency_s, threshold) or (
                    give_up is not None and give_up([r.latency_s for r in rows])):
                break
        self.feeder.finish()

    def counted_batch(self) -> int:
        """The newest batch with a progress report: committed, and the last one counted."""
        return max(p["batchId"] for p in self.progress)

    def total(self) -> int:
        """Sum of all counts in the state as of :meth:`counted_batch` (``statestore`` source)."""
        from pyspark.sql import functions as F

        value = (self.spark.read.format("statestore").option("batchId", self.counted_batch())
                 .load(str(self.root / "checkpoint")).agg(F.sum("value.count")).first()[0])
        return int(value) if value is not None else 0

    def rows(self) -> list[EpochRow]:
        """One row per epoch from the batches' progress (epoch ``e`` is the ``e``-th batch with
        input after the preload; each read exactly one epoch's file)."""
        batches = self.data_batches()[int(self.preload):]
        cfg, t0 = self.cfg, self.feeder.t0
        rows = []
        per_epoch = self.ctx.workload.per_epoch
        for e, p in enumerate(batches):
            # One file per batch (maxFilesPerTrigger=1) is one epoch. A query that scans its
            # source twice (a self-join) reports it once or twice: Spark counts input rows per
            # plan leaf only when its logical and physical leaves line up.
            read = p["numInputRows"]
            if read % per_epoch or not 1 <= read // per_epoch <= self.scans:
                raise RuntimeError(f"{self.name}: batch {p['batchId']} read {read} rows, "
                                   "not one epoch")
            started = iso_seconds(p["timestamp"])
            duration = p["durationMs"]["triggerExecution"] / 1000.0
            end = t0 + (e + 1) * cfg.interval
            peak, load = self.rss.get(p["batchId"], (None, load_avg()))
            rows.append(EpochRow(
                run=self.name, epoch=e, interval_end_s=end - t0, started_s=started - t0,
                finished_s=started + duration - t0,
                records=per_epoch,
                latency_s=started + duration - end, duration_s=duration,
                rss_driver_mb=round(peak.driver, 1) if peak else 0.0,
                rss_jvm_mb=round(peak.jvm, 1) if peak else 0.0,
                rss_workers_mb=round(peak.workers, 1) if peak else 0.0, load1=load))
        return rows


def run_native_repartition(ctx: Context) -> RunResult:
    """Spark's own stateful count, stopped and repartitioned offline at each reconfiguration."""
    cfg, name = ctx.cfg, NativeRestarts.name
    root = cfg.state_root / name
    shutil.rmtree(root, ignore_errors=True)
    preload = cfg.keys <= cfg.native_preload_max
    run = NativeRestarts(ctx, root, preload)
    load_before = load_avg()
    ctx.sampler.take_peak()
    try:
        with native_conf(ctx.spark, cfg.workers):
            rows = run.run()
            total = run.total()
    finally:
        if not cfg.keep_state:
            shutil.rmtree(root, ignore_errors=True)
    fed = len(rows) * ctx.workload.per_epoch
    check = check_total(total, (cfg.keys if preload else 0) + fed, name)
    label_phases(rows, run.windows, cfg.warmup)
    notes = ["same SparkSession (no application restart); the repartition rewrites the whole "
             "state (keys moved not counted); state "
             + (f"preloaded with {cfg.keys:,} keys" if preload else "NOT preloaded")]
    notes += [f"{p['label']}: stop {p['stop_s']:.2f} s, repartition to {p['partitions']} "
              f"partitions {p['migrate_s']:.2f} s, restart {p['reopen_s']:.2f} s; paused "
              f"{p['pause_s']:.2f} s" for p in run.phases]
    return RunResult(name, rows, run.windows, fed, check, notes, (load_before, load_avg()),
                     phases=run.phases)


def run_restart_baseline(ctx: Context, name: str) -> RunResult:
    """Run one of :data:`RESTART_RUNS` by name."""
    if name == "restart-app":
        return run_restart_app(ctx)
    if name == "native-repartition":
        return run_native_repartition(ctx)
    raise ValueError(f"not a restart baseline: {name}")


def main(argv: list[str] | None = None) -> int:
    """``--child SPEC OUT``: run one child of ``restart-app``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=2, type=Path, required=True, metavar=("SPEC", "OUT"))
    args = p.parse_args(argv)
    return child_main(*args.child)


if __name__ == "__main__":
    sys.exit(main())
