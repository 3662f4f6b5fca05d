"""Soak: a live pipeline for ``--minutes``, migrating back and forth, killed and restarted.

A keyed count (with the DS2 scenario's synthetic per-record cost, ``--cost-ms``) runs on
Structured Streaming (``Pipeline.start``) over Parquet files this process writes at a steady
``--rate`` (one file a second, event time = when it was written). After a warm-up every slot
of ``--slot-s`` seconds does one thing (see ``bench/soak_driver.py``): a live migration from
``W`` to ``2W`` workers or back with fluid, batched, all-at-once and deadline plans in turn, or
a slot of DS2 autoscaling while the rate steps up ``--high`` times for half the slot. The driver
process is killed with SIGKILL (its Python and its JVM) and started again several times an
hour, and on a cluster one executor is killed in between. On two simulated hosts (a Spark
standalone master and two workers, ``tests/helpers/cluster.py``: needs root) when it may, else
embedded (``local[8]``: only driver kills).

Sampled all along: each epoch's latency (commit time minus the newest event time applied) and
backlog (records written but not yet applied), the resident memory of every process by kind,
and the disk used by state, checkpoints and Spark's local files (the query's own checkpoint is
reported apart: Spark's file source log in it keeps every file name it ever read). At the end
the writer stops, the driver drains and the final state is compared with a count of
everything written. Pass: the state equals the reference (nothing lost or doubled), no backlog
growth (median latency of the quiet epochs in the last third of the run at most 10% or 0.5 s
over the first third), and resident memory and disk flat after the warm-up (last third's
median at most 10% over the first third's). Writes ``summary.json``, ``summary.md`` and
``soak.png`` under ``--out``; exits 1 when a criterion fails.

    python bench/soak.py --minutes 2                   # what CI runs
    python bench/soak.py --minutes 60 --out bench/results/soak-60
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from bench.procmem import descendants, process_table, rss_mib
from bench.soak_driver import Schedule, append_line, read_lines
from bench.soak_report import report
from tests.helpers.cluster import CLUSTER_CONF, namespaces_permitted, two_hosts

ROOT = Path(__file__).resolve().parents[1]
#: Process kinds told apart in the memory samples, by a mark in their command line.
KINDS = (("executor", "CoarseGrainedExecutorBackend"), ("driver-jvm", "SparkSubmit"),
         ("store-service", "service_process"), ("python-worker", "pyspark.daemon"),
         ("python-worker", "pyspark.worker"), ("cluster", "deploy.master.Master"),
         ("cluster", "deploy.worker.Worker"), ("driver", "soak_driver.py"))


def parser() -> argparse.ArgumentParser:
    """The soak's options; the slot, warm-up and kill spacing scale with ``--minutes``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=1000.0, help="records/s (base)")
    p.add_argument("--high", type=float, default=3.0, help="rate factor in DS2 slots")
    p.add_argument("--keys", type=int, default=50_000)
    p.add_argument("--bins", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="W: migrations go W <-> 2W")
    p.add_argument("--cost-ms", type=float, default=0.5, help="synthetic cost per record")
    p.add_argument("--slot-s", type=float, default=None, help="default: 150 s, or 1/6 run")
    p.add_argument("--warmup-s", type=float, default=None, help="default: 300 s, or 1/6 run")
    p.add_argument("--kill-every-s", type=float, default=None,
                   help="a driver and an executor kill per this many seconds (default 600)")
    p.add_argument("--target-latency", type=float, default=6.0, help="deadline plans (s)")
    p.add_argument("--per-worker", type=int, default=4, help="batched: bins per worker-step")
    p.add_argument("--hosts", choices=("auto", "cluster", "local"), default="auto")
    p.add_argument("--out", type=Path, default=None, help="default: a temporary directory")
    return p


def schedule_of(args: argparse.Namespace, t0: float) -> Schedule:
    """The run's schedule: an hour has 150 s slots after 300 s, kills every 300 s."""
    seconds = args.minutes * 60
    short = seconds < 30 * 60
    return Schedule(
        t0=t0, seconds=seconds,
        warmup_s=args.warmup_s if args.warmup_s is not None else
        (seconds / 6 if short else 300.0),
        slot_s=args.slot_s if args.slot_s is not None else (seconds / 6 if short else 150.0),
        rate=args.rate, high=args.high,
        kill_every_s=args.kill_every_s if args.kill_every_s is not None else
        (seconds / 2 if short else 600.0),
        kill_margin_s=min(120.0, seconds / 6))


class Writer(threading.Thread):
    """Writes one Parquet file a second at the schedule's rate and counts every key it wrote."""

    def __init__(self, directory: Path, schedule: Schedule, keys: int, log: Path) -> None:
        super().__init__(daemon=True, name="soak-writer")
        self.directory, self.schedule, self.log = directory, schedule, log
        self.counts = np.zeros(keys, dtype=np.int64)
        self.rng = np.random.default_rng(42)
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        """Write until :meth:`stop` (or the end of the schedule)."""
        try:
            self._loop()
        except BaseException as exc:  # surfaced by the soak at the end
            self.error = exc

    def _loop(self) -> None:
        seq, carry = 0, 0.0
        end = self.schedule.t0 + self.schedule.seconds
        while not self.stopped.is_set():
            due = self.schedule.t0 + seq + 1
            if due > end:
                break
            self.stopped.wait(max(0.0, due - time.time()))
            now = time.time()
            carry += self.schedule.rate_at(now - 0.5)
            n, carry = int(carry), carry - int(carry)
            keys = self.rng.integers(0, len(self.counts), n)
            self.counts += np.bincount(keys, minlength=len(self.counts))
            table = pa.table({"k": pa.array(keys, pa.int64()),
                              "t": pa.array(np.full(n, int(now * 1e6)), pa.timestamp("us"))})
            tmp = self.directory / f".part-{seq:08d}.parquet"
            pq.write_table(table, tmp)
            os.replace(tmp, self.directory / f"part-{seq:08d}.parquet")
            append_line(self.log, {"time": now, "seq": seq, "n": n})
            seq += 1

    def stop(self) -> None:
        """Stop writing and wait for the thread."""
        self.stopped.set()
        self.join()


def disk_mib(path: Path) -> float:
    """Bytes of every file under ``path`` in MiB (0 when it is missing)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total / 2**20


class Sampler(threading.Thread):
    """Every ``period`` seconds: resident memory of this soak's processes by kind, and disk."""

    def __init__(self, mark: str, disks: dict[str, Any], log: Path, period: float = 5.0
                 ) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.mark, self.disks, self.log, self.period = mark, disks, log, period
        self.stopped = threading.Event()

    def run(self) -> None:
        """Sample until :meth:`stop`."""
        while not self.stopped.wait(self.period):
            rss: dict[str, float] = {}
            count: dict[str, int] = {}
            table = process_table()
            ours = descendants(os.getpid(), table)
            for pid, (_, cmd) in table.items():
                kind = next((k for k, mark in KINDS if mark in cmd), None)
                if kind is None or (pid not in ours and self.mark not in cmd):
                    continue
                rss[kind] = rss.get(kind, 0.0) + rss_mib(pid)
                count[kind] = count.get(kind, 0) + 1
            disk = {name: sum(disk_mib(p) for p in paths()) for name, paths in
                    self.disks.items()}
            append_line(self.log, {"time": time.time(), "rss": rss, "procs": count,
                                   "disk": disk})

    def stop(self) -> None:
        """Stop sampling."""
        self.stopped.set()
        self.join()


class Drivers:
    """Starts, kills and restarts the driver process; keeps every start and kill."""

    def __init__(self, run: Path, env: dict[str, str]) -> None:
        self.run, self.env = run, env
        self.proc: subprocess.Popen | None = None
        self.events: list[dict[str, Any]] = []

    def start(self) -> None:
        """Start a driver (a new application: a new Python process and JVM)."""
        n = sum(1 for e in self.events if e["event"] == "start")
        with open(self.run / f"driver-{n}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "soak_driver.py"), str(self.run)],
                stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.events.append({"time": time.time(), "event": "start", "pid": self.proc.pid})

    def wait_started(self, timeout: float = 600) -> None:
        """Wait until the running driver has started its stream."""
        assert self.proc is not None
        deadline = time.time() + timeout
        while not any(a["action"] == "start" and a["pid"] == self.proc.pid
                      for a in read_lines(self.run / "actions.jsonl")):
            self.check()
            if time.time() > deadline:
                raise RuntimeError(f"the driver did not start its stream in {timeout:.0f} s")
            time.sleep(0.5)

    def check(self) -> None:
        """Fail when the driver exited on its own (a crash is a failed soak)."""
        if self.proc is not None and self.proc.poll() is not None:
            n = sum(1 for e in self.events if e["event"] == "start") - 1
            tail = (self.run / f"driver-{n}.log").read_text(errors="replace")[-4000:]
            raise RuntimeError(f"driver {n} exited with {self.proc.returncode}:\n{tail}")

    def kill(self) -> None:
        """SIGKILL the driver's process group (its Python, its JVM, local Python workers)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.events.append({"time": time.time(), "event": "kill-driver", "pid": self.proc.pid})

    def finish(self, timeout: float = 900) -> None:
        """Ask the driver to drain and write the final state; wait for it to exit."""
        (self.run / "finish").touch()
        assert self.proc is not None
        self.proc.wait(timeout=timeout)
        if self.proc.returncode:
            self.check()


def kill_executor(host_pid: int, events: list[dict[str, Any]]) -> None:
    """SIGKILL the executor JVM below the simulated host ``host_pid`` (its worker restarts one)."""
    table = process_table()
    for pid, (_, cmd) in table.items():
        if "CoarseGrainedExecutorBackend" in cmd and pid in descendants(host_pid, table):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            events.append({"time": time.time(), "event": "kill-executor", "pid": pid})
            return
    events.append({"time": time.time(), "event": "no-executor-to-kill", "pid": None})


def main(argv: list[str] | None = None) -> int:
    """Run the soak, check it and write its report; 0 when every criterion held."""
    args = parser().parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="megaphone-soak-"))
    if out.exists():
        shutil.rmtree(out / "run", ignore_errors=True)
    run = out / "run"
    run.mkdir(parents=True)
    base = Path(tempfile.mkdtemp(prefix="soak-", dir=os.environ.get("TMPDIR")))
    cluster = args.hosts == "cluster" or (args.hosts == "auto" and
                                          namespaces_permitted(base / "probe"))
    try:
        with contextlib.ExitStack() as stack:
            hosts = stack.enter_context(two_hosts(base, "3g", cores=4)) if cluster else None
            result = _soak(args, run, base, hosts)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return report(result, args, out)


def _soak(args: argparse.Namespace, run: Path, base: Path, hosts: Any) -> dict[str, Any]:
    """Run the schedule: writer, sampler, the driver with its kills; then the final state."""
    private = hosts.hidden if hosts is not None else base / "driver"
    shared = hosts.shared if hosts is not None else base
    private.mkdir(exist_ok=True)
    (shared / "input").mkdir()
    conf = ({**CLUSTER_CONF, "spark.executor.cores": "4", "spark.cores.max": "8",
             "spark.executor.memory": "2g"} if hosts is not None else
            {"spark.local.dir": str(base / "spark-local")})
    cfg = {"master": hosts.master if hosts else "local[8]",
           "conf": conf, "state_dir": str(private / "state"), "local_dir": str(private / "local"),
           "checkpoint": str(shared / "checkpoint"), "input_dir": str(shared / "input"),
           "stream_checkpoint": str(private / "stream-checkpoint"),
           "workers": args.workers, "bins": args.bins, "cost_s": args.cost_ms / 1000,
           "per_worker": args.per_worker, "target_latency": args.target_latency,
           "ds2_interval_s": 10.0, "max_files_per_trigger": 10, "keys": args.keys,
           "executors": 2 if hosts is not None else 0}
    (run / "config.json").write_text(json.dumps(cfg, indent=2))
    host_roots = [] if hosts is None else [p.pid for p in hosts.procs[1:]]

    def local_dirs() -> list[Path]:  # each host sees its own tmpfs over the private directory
        if hosts is None:
            return [private / "local"]
        return [Path(f"/proc/{pid}/root") / str(private / "local").lstrip("/")
                for pid in host_roots]

    disks = {"driver-state": lambda: [private / "state"],
             "checkpoint": lambda: [shared / "checkpoint"],
             "store-local": local_dirs,
             "spark-local": lambda: ([shared / f"host{i}-local" for i in (0, 1)]
                                     if hosts is not None else [base / "spark-local"]),
             "input-pending": lambda: [shared / "input"],
             "stream-checkpoint": lambda: [private / "stream-checkpoint"]}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    drivers = Drivers(run, env)
    drivers.start()
    drivers.wait_started()  # the run's clock starts once the first stream runs
    schedule = schedule_of(args, time.time())
    t0 = schedule.t0
    (run / "schedule.json").write_text(json.dumps(schedule.__dict__))
    writer = Writer(shared / "input", schedule, args.keys, run / "writer.jsonl")
    sampler = Sampler(str(base), disks, run / "resources.jsonl")
    kills = schedule.kills() if hosts is not None else \
        [(t, kind) for t, kind in schedule.kills() if kind == "driver"]
    writer.start()
    sampler.start()
    print(f"soak: {args.minutes:g} min on {'two simulated hosts' if hosts else 'local[8]'}, "
          f"{len(kills)} kills, output in {run.parent}", flush=True)
    try:
        for at, kind in kills:
            _wait_until(t0 + at, drivers)
            if kind == "driver":
                drivers.kill()
                time.sleep(2)
                drivers.start()
            else:
                kill_executor(host_roots[1], drivers.events)
            print(f"  {time.time() - t0:7.0f} s: killed the {kind}", flush=True)
        _wait_until(t0 + schedule.seconds, drivers)
        writer.stop()
        drivers.finish()
    finally:
        writer.stop()
        sampler.stop()
        if drivers.proc is not None and drivers.proc.poll() is None:
            drivers.kill()
    if writer.error is not None:
        raise RuntimeError(f"the writer failed: {writer.error!r}")
    np.save(run / "reference.npy", writer.counts)
    return {"run": run, "schedule": schedule, "events": drivers.events, "cluster": bool(hosts),
            "reference": writer.counts}


def _wait_until(when: float, drivers: Drivers) -> None:
    while time.time() < when:
        drivers.check()
        time.sleep(min(1.0, max(0.0, when - time.time())))


if __name__ == "__main__":
    sys.exit(main())
