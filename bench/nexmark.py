"""NEXMark through a live rescale: per query, the latency timeline of megaphone's strategies
next to native Spark's stop, repartition and restart, all in one run.

Queries Q3, Q4, Q5, Q7 and Q8 (:mod:`megaphone.nexmark.queries`; ``--queries`` to choose).
Input is open loop: the generator's events at ``--rate`` events per second of processing
time (its ``events_per_second`` is the same, so event time advances with wall time), cut into
epochs of ``--interval`` seconds: epoch ``e`` holds events ``[e*N, (e+1)*N)``, ``N = rate *
interval``, and its input interval ends at ``t0 + (e+1) * interval``. For megaphone and native
Spark alike a feeder thread generates each epoch's events when its interval ends and writes
them as parquet files, which the epoch reads (``bench/nexmark_input.py``). An epoch runs once its
interval has ended and the previous epoch finished, so a slow epoch leaves a backlog that
shows as latency (completion time - end of the input interval). The first ``--warmup``
epochs run back to back (closed loop: latency = duration) to warm the JVM, the Python workers
and the query's plans; ``t0`` is set after them. Runs per query, on the same events:

* ``fluid``, ``batched``, ``all-at-once``, ``deadline@L`` -- megaphone: after ``--pre``
  epochs, every stateful stage of the query (Q4's two; the join of Q3 and Q8; the window
  stage of Q5 and Q7, whose top-of-window stage keeps no state) is rescaled from 2 to 4
  workers live (``megaphone.rescale(stage, workers=4, strategy=...)``; ``deadline@L`` with
  latency target ``L`` seconds), then ``--cooldown`` epochs and until the backlog drained (at
  most ``--drain-epochs`` more). Every run's outputs must equal the batch SQL
  (:mod:`megaphone.nexmark.sql`) for what it finalized, with nothing late, or the benchmark
  stops with an error. ``--operator-paths vectorized,per-key`` runs each of them twice: with
  the windows and joins computing an epoch in columns (``vectorized``, the default) and key
  by key (``per-key``, runs named ``<run>-per-key``), a before/after in one run;
  ``per-stage`` runs a chain's stages (Q4, Q5, Q7) as a Spark job each instead of one job
  per epoch (``Chain(one_job=False)``, runs named ``<run>-per-stage``);
* ``steady`` -- megaphone with no rescale: ``--steady-epochs`` open-loop epochs, checked the
  same way;
* ``native`` -- the query in Structured Streaming (``bench/nexmark_native.py``; Q4 cannot be
  written there), no restart: its steady state;
* ``native-repartition`` -- the same query stopped between triggers where megaphone rescales,
  its state repartitioned offline from 2 to 4 partitions and restarted (Spark's only way to
  rescale state). Native outputs are checked against the batch SQL too.

Outputs under ``--out`` (default ``bench/results/nexmark-<size>``): ``<query>-<run>.csv`` per
run (one line per epoch: latency, records, rows emitted, bins moved, the plan's progress),
``<query>.png`` (latency over time per run, the rescale shaded) and ``summary.md`` /
``summary.json`` (tables per query; ``bench/nexmark_report.py``).

``--sweep`` measures capacity instead (``bench/nexmark_sweep.py``): per query, megaphone's
``steady`` run (once per ``--operator-paths`` entry) and native Spark's ``native`` run, each on
fresh state, at rising rates (``--sweep-rates``, default 10,000 to 200,000 events/s) for
``--sweep-seconds`` (default 60) of open-loop epochs each, until a system's first failed rate,
then ``--sweep-bisect`` (default 1) geometric midpoints between its last sustained and first
failed rate; a failed rate is run again (``--sweep-retries``, default 1) before it counts.
Sustained: latency p99 under 2x the epoch length and the backlog not growing (the last third's
median latency at most half an epoch above the first third's); a run stops early once its p99
cannot come back under the limit. Every point's outputs are checked against the batch SQL as
above. Outputs (default ``bench/results/nexmark-sweep-<size>``): ``sweep.md`` (each system's
highest sustained rate and megaphone's over native's, then every point), ``sweep.json``,
``sweep.png`` (p99 and p50 latency against the rate, one panel per query, the 2x-epoch line)
and ``points/<query>-<run>-<rate>.csv`` (the last run of each rate).

    python bench/nexmark.py --quick      # all queries and runs, a few minutes
    python bench/nexmark.py              # the full size, 20-40 minutes on 2 quiet cores
    python bench/nexmark.py --queries q4,q5 --runs fluid,batched,deadline@2,native
    python bench/nexmark.py --quick --runs fluid --operator-paths vectorized,per-key
    python bench/nexmark.py --sweep --queries q3,q5,q7,q8   # capacity: 1-1.5 h on 2 quiet cores
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from nexmark_input import InputFeeder
from nexmark_native import NATIVE_RUNS, UNSUPPORTED, run_native
from nexmark_report import PER_KEY, PER_STAGE, NexRow, deadline_target, write_outputs
from nexmark_sweep import NATIVE, Point, climb, hopeless, judge, write_sweep
from procmem import RssSampler
from report import RunResult, Window, label_phases, write_csv
from restart_baselines import steady_threshold
from run_setup import CorrectnessError, load_avg, machine, phase_seconds

from megaphone import rescale
from megaphone.nexmark import definitions as D
from megaphone.nexmark import sql
from megaphone.nexmark.functions import TopOfWindow
from megaphone.nexmark.generator import NexmarkConfig, generate
from megaphone.nexmark.queries import QUERIES, NexmarkQuery

STRATEGIES = ("all-at-once", "fluid", "batched")
DEADLINE = "deadline@"
#: The megaphone run that rescales nothing: the sweep's, and the reference for ``native``.
STEADY = "steady"
#: How the windows and joins run an epoch: in columns, or key by key (their ``vectorized``);
#: or in columns with a chain's stages as a job each.
OPERATOR_PATHS = ("vectorized", PER_KEY, PER_STAGE)
#: Settings by size. ``quick``: every query and run in a few minutes; ``full``: 20-40 minutes
#: on two quiet cores. ``sweep_rates`` and ``sweep_seconds``: the capacity sweep's.
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"rate": 250.0, "interval": 1.0, "bins": 4, "warmup": 1, "pre": 2, "cooldown": 2,
              "drain_epochs": 2, "window_s": 4.0, "sweep_rates": "500,2000,8000",
              "sweep_seconds": 10.0},
    "full": {"rate": 1000.0, "interval": 2.0, "bins": 32, "warmup": 3, "pre": 10,
             "cooldown": 10, "drain_epochs": 15, "window_s": 10.0,
             "sweep_rates": "10000,20000,50000,100000,200000", "sweep_seconds": 60.0},
}


@dataclass(frozen=True)
class BenchConfig:
    """Resolved settings (command line over the size profile)."""

    size: str
    queries: tuple[str, ...]
    runs: tuple[str, ...]
    paths: tuple[str, ...]
    rate: float
    interval: float
    bins: int
    workers: int
    warmup: int
    pre: int
    cooldown: int
    drain_epochs: int
    steady_epochs: int
    per_worker: int
    window_s: float
    in_flight: int
    backend: str
    out: Path
    state_root: Path
    keep_state: bool
    master: str
    driver_memory: str
    progress: bool
    #: The capacity sweep (``--sweep``): its rate ladder, seconds per rate, midpoints, runs
    #: again of a failed rate.
    sweep: bool = False
    sweep_rates: tuple[float, ...] = ()
    sweep_seconds: float = 0.0
    sweep_bisect: int = 0
    sweep_retries: int = 0

    @property
    def per_epoch(self) -> int:
        """Events in one epoch: rate times interval."""
        return max(1, round(self.rate * self.interval))

    @property
    def nexmark(self) -> NexmarkConfig:
        """The generated stream: ``rate`` events per second of event time, ``in_flight``
        auctions in flight (0: a tenth of the rate, so auctions last up to ~3.3 s)."""
        return NexmarkConfig(events_per_second=self.rate, num_in_flight_auctions=self.in_flight
                             or max(1, round(self.rate / 10)))

    def sizes(self, query: str) -> dict[str, int]:
        """The query's window sizes in microseconds (Q5 slides by a fifth of its size)."""
        size = round(self.window_s * D.SECOND_US)
        return {"q5": {"size_us": size, "slide_us": size // 5}, "q7": {"size_us": size},
                "q8": {"window_us": size}}.get(query, {})


def parser() -> argparse.ArgumentParser:
    """The command line; unset sizes come from the profile (``--quick`` or the full one)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the small configuration")
    p.add_argument("--queries", default=",".join(QUERIES), help="comma-separated queries")
    p.add_argument("--runs", help="comma-separated runs: fluid, batched, all-at-once, "
                                  "deadline@L, steady (no rescale), native, native-repartition "
                                  "(default: fluid, batched, deadline@<2x interval>, native, "
                                  "native-repartition)")
    p.add_argument("--operator-paths", default="vectorized",
                   help="comma-separated: vectorized (windows and joins in columns), per-key "
                        "(key by key; runs named <run>-per-key), per-stage (a chain's stages as "
                        "a Spark job each; <run>-per-stage); several for a before/after")
    p.add_argument("--rate", type=float, help="events per second")
    p.add_argument("--interval", type=float, help="epoch length in seconds")
    p.add_argument("--bins", type=int, help="bins per stage (a power of two)")
    p.add_argument("--warmup", type=int, help="closed-loop epochs before the clock starts")
    p.add_argument("--pre", type=int, help="open-loop epochs before the rescale")
    p.add_argument("--cooldown", type=int, help="epochs after the rescale, at least")
    p.add_argument("--drain-epochs", type=int, help="epochs after --cooldown, at most, to wait "
                                                    "for a backlog to drain")
    p.add_argument("--steady-epochs", type=int, help="open-loop epochs of the steady and "
                                                     "native runs (default --pre + --cooldown)")
    p.add_argument("--per-worker", type=int, default=1, help="bins per worker per batched step")
    p.add_argument("--window-s", type=float, help="window size in seconds (Q5, Q7, Q8)")
    p.add_argument("--in-flight", type=int, help="generator's auctions in flight (default "
                                                 "rate / 10: auctions last up to ~3.3 s)")
    p.add_argument("--backend", choices=("rocksdb", "memory"), default="rocksdb")
    p.add_argument("--out", type=Path, help="output directory")
    p.add_argument("--state-root", type=Path, help="state directories (default OUT/state)")
    p.add_argument("--keep-state", action="store_true")
    p.add_argument("--master", default="local[2]", help="Spark master")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--sweep", action="store_true",
                   help="the capacity sweep instead of the runs: per query the highest rate "
                        "megaphone's steady run and native Spark each sustain (--runs and "
                        "--rate are not used)")
    p.add_argument("--sweep-rates", help="comma-separated events/s, climbed until the first "
                                         "failed rate (default 10000,20000,50000,100000,200000;"
                                         " --quick 500,2000,8000)")
    p.add_argument("--sweep-seconds", type=float, help="open-loop seconds per rate (default "
                                                        "60; --quick 10)")
    p.add_argument("--sweep-bisect", type=int, default=1,
                   help="geometric midpoints tried between the highest sustained and the "
                        "lowest failed rate")
    p.add_argument("--sweep-retries", type=int, default=1,
                   help="runs again of a failed rate before it counts (its last run decides)")
    return p


def resolve(args: argparse.Namespace) -> BenchConfig:
    """Fill unset options from the profile and check them."""
    size = "quick" if args.quick else "full"
    base = PROFILES[size]

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return base[name] if value is None else value

    interval = pick("interval")
    queries = tuple(q.strip() for q in args.queries.split(",") if q.strip())
    runs = tuple(r.strip() for r in (args.runs or f"fluid,batched,{DEADLINE}{2 * interval:g},"
                                                  "native,native-repartition").split(","))
    bad = [q for q in queries if q not in QUERIES]
    bad += [r for r in runs
            if r not in (*STRATEGIES, STEADY, *NATIVE_RUNS) and not deadline_target(r)]
    paths = tuple(dict.fromkeys(p.strip() for p in args.operator_paths.split(",") if p.strip()))
    bad += [p for p in paths if p not in OPERATOR_PATHS]
    if bad or not queries or not runs or not paths:
        raise SystemExit(f"unknown queries or runs {bad}: queries {','.join(QUERIES)}; runs "
                         f"{','.join((*STRATEGIES, STEADY, *NATIVE_RUNS))} or {DEADLINE}L "
                         "(seconds); "
                         f"operator paths {','.join(OPERATOR_PATHS)}")
    sweep_rates = sweep_ladder(pick("sweep_rates"))
    sweep_seconds = pick("sweep_seconds")
    if args.sweep and (sweep_seconds < interval or min(args.sweep_bisect,
                                                       args.sweep_retries) < 0):
        raise SystemExit(f"--sweep-seconds {sweep_seconds:g} is under one epoch ({interval:g} s)"
                         f", or --sweep-bisect {args.sweep_bisect} or --sweep-retries "
                         f"{args.sweep_retries} is negative")
    name = f"nexmark-sweep-{size}" if args.sweep else f"nexmark-{size}"
    out = args.out or Path(__file__).resolve().parent / "results" / name
    rate = pick("rate")
    return BenchConfig(
        size=size, queries=queries, runs=runs, paths=paths, rate=rate, interval=interval,
        bins=pick("bins"), workers=2, warmup=pick("warmup"), pre=pick("pre"),
        cooldown=pick("cooldown"), drain_epochs=pick("drain_epochs"),
        steady_epochs=args.steady_epochs or pick("pre") + pick("cooldown"),
        per_worker=args.per_worker, window_s=pick("window_s"),
        in_flight=args.in_flight or 0, backend=args.backend, out=out,
        state_root=args.state_root or out / "state", keep_state=args.keep_state,
        master=args.master, driver_memory=args.driver_memory, progress=not args.no_progress,
        sweep=args.sweep, sweep_rates=sweep_rates, sweep_seconds=sweep_seconds,
        sweep_bisect=args.sweep_bisect, sweep_retries=args.sweep_retries)


def sweep_ladder(text: str) -> tuple[float, ...]:
    """``--sweep-rates``: positive rates, ascending; a clear error otherwise."""
    try:
        rates = tuple(float(r) for r in text.split(",") if r.strip())
    except ValueError:
        rates = ()
    if not rates or any(not r > 0 or not math.isfinite(r) for r in rates) \
            or list(rates) != sorted(set(rates)):
        raise SystemExit(f"--sweep-rates {text!r}: comma-separated events/s, positive and "
                         "ascending")
    return rates


def stateful_stages(query: NexmarkQuery) -> list[int]:
    """The stages that keep state (Q5's and Q7's top-of-window stage keeps none)."""
    return [i for i, s in enumerate(query.stages)
            if not isinstance(s.config.update, TopOfWindow)]


def final(name: str, rows: list) -> Counter:
    """The rows a run must have emitted in total (Q4: each category's last average)."""
    if name == "q4":
        rows = list({r.category: r for r in rows}.values())
    return Counter(tuple(r) for r in rows)


class Bench:
    """What every run shares: settings, Spark, the memory sampler."""

    def __init__(self, cfg: BenchConfig, spark, sampler: RssSampler):
        self.cfg, self.spark, self.sampler = cfg, spark, sampler


class LiveRun:
    """One megaphone run of one query: warm-up, open-loop epochs, a live rescale of every
    stateful stage from 2 to 4 workers, cool-down and drain, then the correctness check.
    ``path``: one of :data:`OPERATOR_PATHS` (the per-key run is named ``<name>-per-key``).
    The ``steady`` run rescales nothing: ``--steady-epochs`` open-loop epochs, fewer if
    ``give_up`` (given the open-loop latencies so far) says to stop."""

    def __init__(self, bench: Bench, query: str, name: str, path: str = "vectorized",
                 give_up: Callable[[list[float]], bool] | None = None):
        self.bench, self.cfg, self.query_name = bench, bench.cfg, query
        self.name = name if path == "vectorized" else f"{name}-{path}"
        self.vectorized = path != PER_KEY
        self.one_job = path != PER_STAGE
        self.steady, self.give_up = name == STEADY, give_up
        self.target = deadline_target(name)
        self.strategy = "deadline" if self.target else name
        self.rows: list[NexRow] = []
        self.windows: list[Window] = []
        self.notes: list[str] = []
        self.handles: list[Any] = []
        self.got: list[Any] = []
        self.feeder: InputFeeder  # the run's input files, made by run()

    def run(self) -> RunResult:
        cfg = self.cfg
        path = cfg.state_root / self.query_name / self.name
        shutil.rmtree(path, ignore_errors=True)
        query = QUERIES[self.query_name](
            self.bench.spark, path, config=cfg.nexmark, workers=cfg.workers,
            num_bins=cfg.bins, backend=cfg.backend, vectorized=self.vectorized,
            **cfg.sizes(self.query_name))
        query.chain.one_job = self.one_job
        self.feeder = InputFeeder(query, cfg.nexmark, cfg.per_epoch, path / "input-files",
                                  cfg.interval)
        load_before = load_avg()
        try:
            self._loop(query)
            check = self._check(query)
        finally:
            self.feeder.stop()
            query.close()
            if not cfg.keep_state:
                shutil.rmtree(path, ignore_errors=True)
        label_phases(self.rows, self.windows, cfg.warmup)
        return RunResult(self.name, self.rows, self.windows, len(self.rows) * cfg.per_epoch,
                         check, self.notes, (load_before, load_avg()))

    def _epoch(self, query: NexmarkQuery, epoch: int, end: float | None, t0: float) -> NexRow:
        n = self.cfg.per_epoch
        frames, high = self.feeder.frames(self.bench.spark, epoch)
        started = time.time()  # the input is there (its file written)
        out = query.run_frames(frames, high, input_end=end if end is not None else started)
        finished = time.time()
        self.got += out
        ms = [s.metrics(last=1)[0] for s in query.stages]
        progress = [h.progress for h in self.handles]
        end = started if end is None else end  # closed loop: the input was there at the start
        return NexRow(
            run=self.name, epoch=epoch, interval_end_s=end - t0, started_s=started - t0,
            finished_s=finished - t0, records=n, latency_s=finished - end,
            duration_s=finished - started, outputs=len(out),
            bins_moved=sum(int(m["bins_moved"]) for m in ms),
            keys_moved=sum(int(m["keys_moved"]) for m in ms),
            bytes_moved=sum(int(m["bytes_moved"]) for m in ms),
            export_s=sum(phase_seconds(m, "export_s") for m in ms),
            install_s=sum(phase_seconds(m, "install_s") for m in ms),
            bins_done=sum(p.bins_done for p in progress),
            bins_total=sum(p.bins_total for p in progress), **self._rss())

    def _rss(self) -> dict[str, float]:
        peak = self.bench.sampler.take_peak()
        return {"rss_driver_mb": round(peak.driver, 1), "rss_jvm_mb": round(peak.jvm, 1),
                "rss_workers_mb": round(peak.workers, 1), "load1": load_avg()}

    def _loop(self, query: NexmarkQuery) -> None:
        cfg = self.cfg
        start_at = cfg.warmup + cfg.pre
        # A rescale not done by then failed. The deadline policy moves a bin every 20 epochs
        # (its max_behind) while the pipeline is behind its target: half the bins move.
        limit = start_at + 21 * (cfg.bins // 2) + 20
        with tqdm(desc=f"{self.query_name} {self.name}", unit="epoch", leave=False,
                  disable=not cfg.progress) as bar:
            for epoch in range(cfg.warmup):  # their files are there from the start
                self.feeder.write(epoch)
            clock = time.time()
            for epoch in range(cfg.warmup):  # closed loop
                self.rows.append(self._epoch(query, epoch, None, clock))
                bar.update(1)
            t0 = time.time() - cfg.warmup * cfg.interval
            for row in self.rows:  # on the run's clock
                for f in ("interval_end_s", "started_s", "finished_s"):
                    setattr(row, f, getattr(row, f) + clock - t0)
            self.feeder.start(cfg.warmup, t0)
            epoch, done_at, threshold = cfg.warmup, None, math.nan
            while True:
                end = t0 + (epoch + 1) * cfg.interval
                time.sleep(max(0.0, end - time.time()))
                if epoch == start_at and not self.steady:
                    threshold = steady_threshold([r.latency_s for r in self.rows
                                                  if r.epoch >= cfg.warmup])
                    self._rescale(query, time.time() - t0)
                row = self._epoch(query, epoch, end, t0)
                self.rows.append(row)
                bar.update(1)
                bar.set_postfix(latency=f"{row.latency_s:.2f}s", moved=row.bins_done)
                epoch += 1
                if self.steady:
                    if epoch >= cfg.warmup + cfg.steady_epochs or (self.give_up and self.give_up(
                            [r.latency_s for r in self.rows[cfg.warmup:]])):
                        break
                    continue
                if done_at is None and self.handles and all(h.done for h in self.handles):
                    for h in self.handles:
                        h.wait(0)  # raises the plan's error, if it failed
                    window = self.windows[0]
                    window.end_s = row.finished_s
                    window.keys_moved = sum(r.keys_moved for r in self.rows)
                    window.bytes_moved = sum(r.bytes_moved for r in self.rows)
                    done_at = epoch
                if done_at is None and epoch >= limit:
                    raise RuntimeError(f"{self.query_name} {self.name}: the rescale did not "
                                       f"finish in {limit - start_at} epochs (an overloaded "
                                       "machine? see the latencies in the progress bar)")
                if done_at is not None and epoch >= done_at + cfg.cooldown and (
                        row.latency_s <= threshold
                        or epoch >= done_at + cfg.cooldown + cfg.drain_epochs):
                    break

    def _rescale(self, query: NexmarkQuery, at: float) -> None:
        """Submit a plan to 4 workers for every stateful stage; they run side by side."""
        for i in stateful_stages(query):
            stage = query.stages[i]
            plan = rescale(stage, workers=2 * self.cfg.workers, strategy=self.strategy,
                           per_worker=self.cfg.per_worker, target_latency=self.target)
            self.handles.append(stage.migrate(plan))
            steps = "chosen live" if plan.adaptive else str(len(plan.steps))
            self.notes.append(f"stage {i}: {len(plan.moves)} bins to move, steps {steps}")
        self.windows.append(Window("scale-out", at, math.nan))

    def _check(self, query: NexmarkQuery) -> str:
        """The outputs against the batch SQL; raises :class:`CorrectnessError`."""
        name = self.query_name
        fed = len(self.rows) * self.cfg.per_epoch
        want = sql.batch_rows(query, generate(self.cfg.nexmark, 0, fed))
        got, expected = final(name, self.got), final(name, want)
        if got != expected:
            raise CorrectnessError(
                f"{name} {self.name}: {sum(got.values())} rows, batch SQL "
                f"{sum(expected.values())}; extra {sorted(got - expected)[:3]}, missing "
                f"{sorted(expected - got)[:3]}")
        late = sum(m["late_records"] for s in query.stages for m in s.metrics())
        if late:
            raise CorrectnessError(f"{name} {self.name}: {late} records dropped as late")
        moved = sum(r.bins_moved for r in self.rows)
        total = sum(h.progress.bins_total for h in self.handles)
        if not self.steady and (not moved or moved != total):
            raise CorrectnessError(f"{name} {self.name}: moved {moved} of {total} bins")
        return f"ok ({sum(expected.values())} rows = batch SQL)"


def run_query(bench: Bench, query: str) -> list[RunResult]:
    """Every selected run of ``query`` (a megaphone run once per operator path), each written
    to its CSV."""
    results = []
    for name in bench.cfg.runs:
        if name in NATIVE_RUNS:
            if query in UNSUPPORTED:
                continue
            done = [run_native(bench, query, name, NexRow)]
        else:
            done = [LiveRun(bench, query, name, path).run() for path in bench.cfg.paths]
        for result in done:
            write_csv(bench.cfg.out / f"{query}-{result.name}.csv", result.rows)
            results.append(result)
            print(f"{query} {result.name:>18}: {result.check}", flush=True)
    return results


def sweep_systems(cfg: BenchConfig, query: str) -> list[tuple[str, str]]:
    """The sweep's systems on ``query`` as (run name, operator path): megaphone's steady run
    per operator path, then native Spark's unless it cannot express the query."""
    mega = [(STEADY if path == "vectorized" else f"{STEADY}-{path}", path) for path in cfg.paths]
    return mega + ([] if query in UNSUPPORTED else [(NATIVE, "")])


def sweep_point(bench: Bench, query: str, system: str, path: str, rate: float) -> Point:
    """``system`` on ``query`` at ``rate``: ``--sweep-seconds`` of open-loop epochs (fewer once
    the rate is lost for certain), its outputs checked against the batch SQL, its CSV under
    ``OUT/points``, judged."""
    epochs = max(1, round(bench.cfg.sweep_seconds / bench.cfg.interval))
    cfg = replace(bench.cfg, rate=rate, steady_epochs=epochs)
    at = Bench(cfg, bench.spark, bench.sampler)

    def give_up(latencies: list[float]) -> bool:
        return hopeless(latencies, epochs, cfg.interval)

    started = time.time()
    if system == NATIVE:
        result = run_native(at, query, NATIVE, NexRow, give_up)
    else:
        result = LiveRun(at, query, STEADY, path, give_up).run()
    (cfg.out / "points").mkdir(parents=True, exist_ok=True)
    write_csv(cfg.out / "points" / f"{query}-{result.name}-{rate:.0f}.csv", result.rows)
    # The first ``epochs`` open-loop epochs (a native run may commit one more as it stops).
    latencies = [r.latency_s for r in result.rows if r.epoch >= cfg.warmup][:epochs]
    v = judge(latencies, cfg.interval, epochs)
    return Point(query, system, rate, len(latencies), epochs, v.p50, v.p99, v.growth_s,
                 v.sustained, v.reason, result.check, time.time() - started)


def sweep_setup(cfg: BenchConfig) -> str:
    """The sweep's settings in one paragraph."""
    return (f"epochs of {cfg.interval:g} s; per rate {cfg.warmup} warm-up epochs back to back, "
            f"then {cfg.sweep_seconds:g} s of open-loop epochs, fresh state; rates "
            f"{', '.join(f'{r:,.0f}' for r in cfg.sweep_rates)} events/s until the first "
            f"failed one (a failed rate run {cfg.sweep_retries} more time(s), its last run "
            f"deciding), then {cfg.sweep_bisect} geometric midpoint(s); {cfg.workers} workers "
            f"(megaphone) and state partitions (native), {cfg.bins} bins per stage; windows "
            f"{cfg.window_s:g} s (Q5 sliding every {cfg.window_s / 5:g} s); auctions in flight "
            f"{cfg.in_flight or 'a tenth of the rate'}; operator paths {', '.join(cfg.paths)}; "
            f"backend {cfg.backend}; Spark master {cfg.master}.")


def run_sweep(bench: Bench, info: dict[str, Any]) -> list[Point]:
    """The capacity sweep (:mod:`nexmark_sweep`): every query's systems up their rate ladder,
    the outputs rewritten after every point."""
    cfg, points = bench.cfg, []
    with tqdm(desc="sweep", unit="point", disable=not cfg.progress) as bar:
        for query in cfg.queries:
            for system, path in sweep_systems(cfg, query):
                def run(rate: float, query: str = query, system: str = system,
                        path: str = path) -> Point:
                    point = sweep_point(bench, query, system, path, rate)
                    points.append(point)
                    bar.update(1)
                    tqdm.write(f"{query} {system} {rate:,.0f}/s: p50 {point.p50:.2f} s, p99 "
                               f"{point.p99:.2f} s, {point.reason}; {point.check}")
                    write_sweep(cfg.out, points, cfg.interval, info)
                    return point

                climb(cfg.sweep_rates, cfg.sweep_bisect, run, cfg.sweep_retries)
    return points


def main(argv: list[str] | None = None, spark=None) -> int:
    """Command line entry; ``spark`` reuses an existing session (tests)."""
    argv = sys.argv[1:] if argv is None else argv
    cfg = resolve(parser().parse_args(argv))
    command = "python bench/nexmark.py " + " ".join(argv)
    if spark is None:
        from megaphone.spark import spark_session

        spark = spark_session(cfg.master, "megaphone-nexmark",
                              {"spark.driver.memory": cfg.driver_memory})
    cfg.out.mkdir(parents=True, exist_ok=True)
    info = {"command": command, "machine": machine(), "load_start": os.getloadavg()[0],
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if cfg.sweep:
        info["setup"] = sweep_setup(cfg)
    sampler = RssSampler()
    sampler.start()
    bench = Bench(cfg, spark, sampler)
    results: dict[str, list[RunResult]] = {}
    points: list[Point] = []
    started = time.time()
    try:
        if cfg.sweep:
            points = run_sweep(bench, info)
        else:
            for query in cfg.queries:
                results[query] = run_query(bench, query)
                write_outputs(cfg, results, info)
    finally:
        sampler.stop()
        if not cfg.keep_state:  # the runs removed their state; remove what held it
            for d in sorted(cfg.state_root.glob("**/"), reverse=True):
                if d.is_dir() and not any(d.iterdir()):
                    d.rmdir()
    info["load_end"] = os.getloadavg()[0]
    info["took_s"] = time.time() - started
    if cfg.sweep:
        print(write_sweep(cfg.out, points, cfg.interval, info), flush=True)
    else:
        print(write_outputs(cfg, results, info), flush=True)
    print(f"NEXMark benchmark done in {time.time() - started:.0f} s; outputs in {cfg.out}")
    return 0


__all__ = ["BenchConfig", "CorrectnessError", "LiveRun", "deadline_target", "main", "resolve"]

if __name__ == "__main__":
    sys.exit(main())
