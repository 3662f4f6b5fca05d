"""What the runs of the migration benchmark share: settings, workload, context and helpers.

``bench/migration.py`` (the live and steady runs, native Spark, the report) and
``bench/restart_baselines.py`` (the runs that restart the application) both build on this
module, so neither imports the other.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from load import clone_state_dir
from procmem import RssSampler
from report import EpochRow

from megaphone import Pipeline
from megaphone.routing.bins import xxhash64_unsigned
from megaphone.routing.table import initial_owners

#: Throw-away epochs run once before the first run, so no run pays for a cold JVM or cold
#: Python workers.
PRIMER_EPOCHS = {"smoke": 2, "full": 5}


class CorrectnessError(AssertionError):
    """The counts in the state do not add up to the initial counts plus the records fed."""


def count(text: str) -> int:
    """Parse a count such as ``100000``, ``1e5`` or ``2.5e6``."""
    value = float(text)
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a positive whole count: {text}")
    return int(value)


@dataclass(frozen=True)
class Config:
    """Resolved benchmark settings (command line plus the size profile)."""

    keys: int
    rate: float
    interval: float
    workers: int
    bins: int
    scenario: str
    runs: tuple[str, ...]
    warmup: int
    pre: int
    hold: int
    cooldown: int
    steady_epochs: int
    per_worker: int
    gap: int
    drain_epochs: int
    out: Path
    state_root: Path
    keep_state: bool
    merge: bool
    backend: str
    master: str
    driver_memory: str
    native_preload_max: int
    progress: bool
    profile: str

    @property
    def per_epoch(self) -> int:
        """Records in one epoch: rate times interval."""
        return max(1, round(self.rate * self.interval))


@dataclass(frozen=True)
class Workload:
    """The input: epoch ``e`` holds ids ``[e*n, (e+1)*n)``, key ``pmod(xxhash64(id), keys)``."""

    keys: int
    per_epoch: int
    partitions: int = 2

    def frame(self, spark, epoch: int):
        """Epoch ``epoch``'s records as a Spark DataFrame (column ``key``), built in the JVM."""
        from pyspark.sql import functions as F

        lo = epoch * self.per_epoch
        return spark.range(lo, lo + self.per_epoch, 1, self.partitions).select(
            F.pmod(F.xxhash64("id"), F.lit(self.keys)).alias("key"))

    def keys_of(self, epoch: int) -> np.ndarray:
        """The same keys computed in numpy (Spark's ``xxhash64`` is megaphone's own hash)."""
        ids = np.arange(epoch * self.per_epoch, (epoch + 1) * self.per_epoch, dtype=np.int64)
        return np.mod(xxhash64_unsigned(ids).view(np.int64), self.keys)


Target = dict[int, int] | int
"""A reconfiguration: a ``{bin: worker}`` map or a number of workers to rescale to."""


def reconfigurations(cfg: Config) -> list[tuple[str, Target]]:
    """The scenario's reconfigurations in order, as ``(label, target)``."""
    if cfg.scenario == "scale-out":
        return [("scale-out", 2 * cfg.workers)]
    owners = initial_owners(cfg.bins, cfg.workers)
    half = cfg.workers // 2
    out: dict[int, int] = {}
    for w in range(half, cfg.workers):
        mine = np.flatnonzero(owners == w)
        for b in mine[::2].tolist():
            out[b] = w - half
    back = {b: int(owners[b]) for b in out}
    if cfg.scenario == "half-out":
        return [("out", out)]
    return [("out", out), ("back", back)]


@dataclass
class Context:
    """What every run shares: settings, Spark, input, the loaded template and the sampler."""

    cfg: Config
    spark: Any
    workload: Workload
    template: Path
    initial_total: int
    sampler: RssSampler
    backend_rates: dict[str, float] = field(default_factory=dict)


def open_pipeline(ctx: Context, path: Path) -> Pipeline:
    """Open a run's state directory as a count pipeline (the bulk-loaded layout)."""
    return Pipeline(ctx.spark, str(path), key="key", update="count", num_bins=ctx.cfg.bins,
                    backend=ctx.cfg.backend)


def check_total(total: int | None, expected: int, run: str) -> str:
    """Fail loudly unless the counts add up; returns the check's one-line verdict."""
    if total != expected:
        raise CorrectnessError(
            f"{run}: the counts in the state add up to {total}, expected {expected:,} "
            "(bulk-loaded counts + records fed)")
    return f"ok ({expected:,})"


def state_total(pipe: Pipeline) -> int:
    """The sum of every key's count in the pipeline's state (one Spark job)."""
    from pyspark.sql import functions as F

    value = pipe.state().agg(F.sum("state")).first()[0]
    return int(value) if value is not None else 0


def phase_seconds(m: dict[str, Any], name: str) -> float:
    """A worker phase's seconds in an epoch's metrics, summed over its workers."""
    return round(sum(w.get(name) or 0.0 for w in m.get("per_worker", {}).values()), 4)


def load_avg() -> float:
    """The one-minute load average (other work on the machine skews the numbers)."""
    return os.getloadavg()[0]


def epoch_row(run: str, t0: float, m: dict[str, Any], times: tuple[int, float, float, float],
              rss) -> EpochRow:
    """An epoch's row from its metrics ``m``, ``(epoch, input end, started, finished)`` (epoch
    seconds) and the peak RSS during it; times in the row are seconds since ``t0``."""
    epoch, end, started, finished = times
    return EpochRow(
        run=run, epoch=epoch, interval_end_s=end - t0, started_s=started - t0,
        finished_s=finished - t0, records=int(m["records_in"]), latency_s=finished - end,
        duration_s=finished - started, bins_moved=int(m["bins_moved"]),
        keys_moved=int(m["keys_moved"]), bytes_moved=int(m["bytes_moved"]),
        export_s=phase_seconds(m, "export_s"), install_s=phase_seconds(m, "install_s"),
        rss_driver_mb=round(rss.driver, 1), rss_jvm_mb=round(rss.jvm, 1),
        rss_workers_mb=round(rss.workers, 1), load1=load_avg())


def machine() -> str:
    """The machine and library versions, for the record (one line)."""
    import pyspark

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({model}), {mem:.1f} GiB RAM, {platform.system()} "
            f"{platform.machine()}, Python {platform.python_version()}, PySpark "
            f"{pyspark.__version__}, numpy {np.__version__}, pyarrow {pa.__version__}")


NATIVE_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.numRecentProgressUpdates": "100000",
}


@contextmanager
def native_conf(spark, partitions: int) -> Iterator[None]:
    """:data:`NATIVE_CONF` and ``partitions`` shuffle partitions set for a native run, then
    the session's own settings back."""
    names = [*NATIVE_CONF, "spark.sql.shuffle.partitions"]
    saved = {k: spark.conf.get(k, None) for k in names}
    for k, v in {**NATIVE_CONF, "spark.sql.shuffle.partitions": str(partitions)}.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def iso_seconds(stamp: str) -> float:
    """Epoch seconds of an ISO-8601 time stamp (Spark's progress reports)."""
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def prime(ctx: Context) -> None:
    """Run a few epochs on a throw-away copy of the template (JIT, Python workers, caches)."""
    path = ctx.cfg.state_root / "primer"
    shutil.rmtree(path, ignore_errors=True)
    clone_state_dir(ctx.template, path)
    pipe = open_pipeline(ctx, path)
    try:
        for epoch in range(PRIMER_EPOCHS[ctx.cfg.profile]):
            pipe.process(ctx.workload.frame(ctx.spark, epoch))
    finally:
        pipe.close()
        shutil.rmtree(path, ignore_errors=True)
