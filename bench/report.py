"""Per-epoch records of a benchmark run, their statistics, CSV files, plots and the summary.

A run is a list of :class:`EpochRow` plus the time windows in which a reconfiguration was in
progress. Epochs are labelled ``warmup`` (excluded from every statistic), ``steady``,
``migration`` (the epoch ran, or its input interval ended, inside a window) and ``drain``
(after a window, still behind the input: the backlog it left). Statistics "during migration"
cover ``migration`` and ``drain`` epochs.

The drain time of a reconfiguration is the same for every run (:func:`drain_times`): from the
end of its window (the restart of a pause-and-restart run) until the backlog is worked off --
the completion of the last epoch still over :data:`DRAIN_FACTOR` times the run's own steady
median latency before the first epoch back within it (0 when the first epoch completing at
or after the window's end already is).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

WARMUP, STEADY, MIGRATION, DRAIN = "warmup", "steady", "migration", "drain"
#: Runs in the order they are reported and plotted.
RUN_ORDER = ("steady", "all-at-once", "fluid", "batched", "pause-restart", "restart-app",
             "native", "native-repartition")
#: A backlog has drained once an epoch's latency is within this factor of the steady median.
DRAIN_FACTOR = 1.5
#: Epochs over this factor of the run's own steady p99 count as over the target.
TARGET_FACTOR = 1.5


@dataclass
class EpochRow:
    """One epoch of one run; times are seconds since the run's start ``t0``.

    ``load1`` is the machine's one-minute load average when the epoch ended: anything else
    running on the machine shows there.
    """

    run: str
    epoch: int
    interval_end_s: float
    started_s: float
    finished_s: float
    records: int
    latency_s: float
    duration_s: float
    bins_moved: int = 0
    keys_moved: int = 0
    bytes_moved: int = 0
    #: Seconds the exporters spent reading and shipping the moving bins (summed over senders).
    export_s: float = 0.0
    #: Seconds the receivers spent installing them, waiting for input excluded (summed).
    install_s: float = 0.0
    rss_driver_mb: float = 0.0
    rss_jvm_mb: float = 0.0
    rss_workers_mb: float = 0.0
    load1: float = 0.0
    phase: str = STEADY

    @property
    def rss_total_mb(self) -> float:
        """Peak resident memory of driver + JVM + workers during the epoch (MiB)."""
        return self.rss_driver_mb + self.rss_jvm_mb + self.rss_workers_mb


@dataclass
class Window:
    """A reconfiguration in progress from ``start_s`` to ``end_s`` (seconds since ``t0``).

    ``busy_s`` is the time spent moving state when it can be told apart (the offline migration
    of pause-and-restart); for live strategies :func:`run_stats` estimates it as the time the
    epochs that moved bins took beyond a steady epoch's median.
    """

    label: str
    start_s: float
    end_s: float
    keys_moved: int = 0
    bytes_moved: int = 0
    busy_s: float = 0.0


@dataclass
class RunResult:
    """Everything measured in one run: epochs, reconfiguration windows and run facts."""

    name: str
    rows: list[EpochRow]
    windows: list[Window] = field(default_factory=list)
    records_fed: int = 0
    check: str = ""
    notes: list[str] = field(default_factory=list)
    load_avg: tuple[float, float] = (0.0, 0.0)
    command: str = ""
    decisions: list[dict[str, Any]] = field(default_factory=list)  # adaptive plans' policy
    #: Restart baselines: per reconfiguration, the seconds of each phase of the pause.
    phases: list[dict[str, Any]] = field(default_factory=list)


def prediction_ratios(result: RunResult) -> list[float]:
    """Actual over predicted duration of the epochs whose moves the deadline policy chose."""
    duration = {r.epoch: r.duration_s for r in result.rows}
    return [duration[d["epoch"]] / d["predicted_s"] for d in result.decisions
            if d["bins"] and d["predicted_s"] > 0 and d["epoch"] in duration]


def save_result(path: Path, result: RunResult, setup: dict[str, Any]) -> None:
    """Write a run (every epoch, window and note) as JSON, with the ``setup`` it ran under."""
    path.write_text(json.dumps({"setup": setup, "result": asdict(result)}, indent=0))


def load_result(path: Path, setup: dict[str, Any]) -> RunResult | None:
    """A run saved by :func:`save_result`, or ``None`` if it ran under another setup."""
    data = json.loads(path.read_text())
    if data.get("setup") != setup:
        return None
    raw = data["result"]
    rows = [EpochRow(**row) for row in raw.pop("rows")]
    windows = [Window(**w) for w in raw.pop("windows")]
    raw["load_avg"] = tuple(raw["load_avg"])
    return RunResult(rows=rows, windows=windows, **raw)


def label_phases(rows: list[EpochRow], windows: Sequence[Window], warmup: int) -> None:
    """Set every row's ``phase`` from the windows (see the module docstring)."""
    previous = STEADY
    prev_finished = -math.inf
    for row in rows:
        behind = prev_finished > row.interval_end_s + 1e-3
        in_window = any(
            w.start_s <= row.started_s <= w.end_s
            or (row.interval_end_s <= w.end_s and row.finished_s >= w.start_s)
            for w in windows
        )
        if row.epoch < warmup:
            row.phase = WARMUP
        elif in_window:
            row.phase = MIGRATION
        elif behind and previous in (MIGRATION, DRAIN):
            row.phase = DRAIN
        else:
            row.phase = STEADY
        previous, prev_finished = row.phase, row.finished_s


def write_csv(path: Path, rows: Sequence[EpochRow]) -> None:
    """One CSV line per epoch (the dataclass fields plus the total RSS); rows of a subclass of
    :class:`EpochRow` add their own fields."""
    names = [f.name for f in fields(rows[0] if rows else EpochRow)] + ["rss_total_mb"]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        for row in rows:
            writer.writerow({**asdict(row), "rss_total_mb": round(row.rss_total_mb, 1)})


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation), NaN for no values."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def drain_threshold(rows: Sequence[EpochRow]) -> float:
    """The latency under which a backlog counts as drained: :data:`DRAIN_FACTOR` times the
    median latency of the ``steady`` epochs (NaN without any)."""
    return DRAIN_FACTOR * pct([r.latency_s for r in rows if r.phase == STEADY], 50)


def drain_times(result: RunResult) -> list[float]:
    """Per window, seconds from its end until the backlog drained (see the module docstring).

    NaN when no epoch was back within the threshold before the next window or the run's end.
    """
    limit = drain_threshold(result.rows)
    out = []
    windows = sorted(result.windows, key=lambda w: w.start_s)
    for i, w in enumerate(windows):
        until = windows[i + 1].start_s if i + 1 < len(windows) else math.inf
        after = [r for r in result.rows if w.end_s - 1e-6 <= r.finished_s < until]
        ok = next((j for j, r in enumerate(after) if r.latency_s <= limit), None)
        if ok is None:
            out.append(math.nan)
        else:
            out.append(max(0.0, after[ok - 1].finished_s - w.end_s) if ok else 0.0)
    return out


def run_stats(result: RunResult) -> dict[str, Any]:
    """Latency, memory and transfer statistics of one run (seconds, MiB, keys, bytes)."""
    steady = [r for r in result.rows if r.phase == STEADY]
    during = [r for r in result.rows if r.phase in (MIGRATION, DRAIN)]
    lat_s = [r.latency_s for r in steady]
    lat_m = [r.latency_s for r in during]
    migration_s = sum(w.end_s - w.start_s for w in result.windows)
    keys = sum(w.keys_moved for w in result.windows)
    nbytes = sum(w.bytes_moved for w in result.windows)
    base = pct([r.duration_s for r in steady], 50)
    moving = [r for r in result.rows if r.bins_moved]
    extra = sum(max(0.0, r.duration_s - base) for r in moving)
    busy = sum(w.busy_s for w in result.windows) or (extra if math.isfinite(extra) else 0.0)
    transfer_s = sum(r.export_s + r.install_s for r in moving)
    bins = sum(r.bins_moved for r in moving)
    measured = [r for r in result.rows if r.phase != WARMUP]
    records = sum(r.records for r in measured)
    busy_all = sum(r.duration_s for r in measured)
    drains = drain_times(result)
    target = TARGET_FACTOR * pct(lat_s, 99)
    return {
        "run": result.name,
        "epochs": len(result.rows),
        "steady_p50": pct(lat_s, 50), "steady_p99": pct(lat_s, 99),
        "steady_max": max(lat_s, default=math.nan),
        "mig_p50": pct(lat_m, 50), "mig_p99": pct(lat_m, 99),
        "mig_max": max(lat_m, default=math.nan),
        "migration_s": migration_s if result.windows else math.nan,
        "keys_moved": keys, "bytes_moved": nbytes,
        "keys_per_s": keys / migration_s if migration_s > 0 else math.nan,
        "bytes_per_s": nbytes / migration_s if migration_s > 0 else math.nan,
        "busy_keys_per_s": keys / busy if busy > 0 else math.nan,
        "transfer_s": transfer_s, "bins_moved": bins,
        "transfer_s_per_bin": transfer_s / bins if bins else math.nan,
        "transfer_keys_per_s": keys / transfer_s if transfer_s > 0 else math.nan,
        "steady_duration_p50": pct([r.duration_s for r in steady], 50),
        "capacity_rps": records / busy_all if busy_all > 0 else math.nan,
        "rss_steady": max((r.rss_total_mb for r in steady), default=math.nan),
        "rss_mig": max((r.rss_total_mb for r in during), default=math.nan),
        "rss_workers_steady": max((r.rss_workers_mb for r in steady), default=math.nan),
        "rss_workers_mig": max((r.rss_workers_mb for r in during), default=math.nan),
        "load_mean": float(np.mean([r.load1 for r in result.rows])) if result.rows else 0.0,
        "check": result.check,
        # The spike and its backlog: epochs over 1.5x this run's steady p99, drain times.
        "target_s": target, "over_target": sum(r.latency_s > target for r in during),
        "epochs_during": len(during), "drains_s": drains,
        "drain_s": math.nan if not drains or any(map(math.isnan, drains)) else max(drains),
        "drain_threshold_s": drain_threshold(result.rows),
    }


# -- formatting ------------------------------------------------------------------------------


def ms(value: float) -> str:
    """Seconds as whole milliseconds, ``-`` for NaN."""
    return "-" if not math.isfinite(value) else f"{value * 1000:,.0f}"


def rate(value: float) -> str:
    """A per-second rate with a k/M suffix, ``-`` for NaN."""
    if not math.isfinite(value):
        return "-"
    for div, suffix in ((1e6, " M"), (1e3, " k")):
        if value >= div:
            return f"{value / div:.2f}{suffix}"
    return f"{value:.0f}"


def secs(value: float) -> str:
    """Seconds with one decimal, ``-`` for NaN."""
    return "-" if not math.isfinite(value) else f"{value:.1f}"


def mib(value: float) -> str:
    """Bytes (per second) as MiB with one decimal, ``-`` for NaN."""
    return "-" if not math.isfinite(value) else f"{value / 2**20:.1f}"


def ratio(num: float, den: float) -> float:
    """``num / den`` or NaN when either is missing."""
    return num / den if math.isfinite(num) and math.isfinite(den) and den > 0 else math.nan


def fmt_x(value: float) -> str:
    """A ratio as ``1.23x``, ``-`` for NaN."""
    return "-" if not math.isfinite(value) else f"{value:.2f}x"


def fmt_mb(value: float) -> str:
    """MiB with no decimals, ``-`` for NaN."""
    return "-" if not math.isfinite(value) else f"{value:,.0f}"


def stats_table(stats: Sequence[dict[str, Any]], ref_p99: float) -> str:
    """The markdown summary table; ``ref_p99`` is the steady-state p99 of the steady run."""
    head = ("| run | steady p50 ms | steady p99 ms | p50 ms during | p99 ms during | "
            "max ms during | max / steady p99 | migration s | keys moved | keys/s | MB/s | "
            "keys/s busy | peak RSS steady MiB | peak RSS during MiB | workers RSS steady/during "
            "MiB | check |")
    lines = [head, "|" + "---|" * 16]
    for s in stats:
        lines.append(
            f"| {s['run']} | {ms(s['steady_p50'])} | {ms(s['steady_p99'])} | {ms(s['mig_p50'])} "
            f"| {ms(s['mig_p99'])} | {ms(s['mig_max'])} | {fmt_x(ratio(s['mig_max'], ref_p99))} "
            f"| {secs(s['migration_s'])} | {s['keys_moved']:,} | {rate(s['keys_per_s'])} "
            f"| {mib(s['bytes_per_s'])} | {rate(s['busy_keys_per_s'])} "
            f"| {fmt_mb(s['rss_steady'])} | {fmt_mb(s['rss_mig'])} "
            f"| {fmt_mb(s['rss_workers_steady'])} / {fmt_mb(s['rss_workers_mig'])} "
            f"| {s['check']} |"
        )
    return "\n".join(lines)


#: The phases of a pause, in the order they happen, as :attr:`RunResult.phases` names them.
PHASES = (("stop_s", "stop"), ("app_start_s", "app start"), ("migrate_s", "migrate"),
          ("reopen_s", "reopen"))


def phases_text(phases: Sequence[dict[str, Any]]) -> str:
    """A run's pauses as ``out: stop 0.4 + app start 6.1 + ... = 7.0 s; back: ...``."""
    parts = []
    for p in phases:
        steps = " + ".join(f"{label} {p[key]:.2f}" for key, label in PHASES
                           if p.get(key) is not None)
        parts.append(f"{p['label']}: {steps} = {p['pause_s']:.2f} s")
    return "; ".join(parts) or "-"


def spike_table(stats: Sequence[dict[str, Any]], phases: dict[str, list[dict[str, Any]]]) -> str:
    """The cost of each run's reconfigurations side by side (markdown): the latency spike, the
    epochs over 1.5x the run's own steady p99, the drain times and the pauses' phases."""
    lines = ["| run | max ms during (spike) | p99 ms during | epochs over 1.5x own steady p99 "
             "/ during | drain s per reconfiguration | pause phases s |", "|" + "---|" * 6]
    for s in stats:
        if not s["epochs_during"]:
            continue
        drains = ", ".join("not drained" if math.isnan(d) else f"{d:.1f}"
                           for d in s["drains_s"]) or "-"
        lines.append(f"| {s['run']} | {ms(s['mig_max'])} | {ms(s['mig_p99'])} | "
                     f"{s['over_target']} / {s['epochs_during']} | {drains} | "
                     f"{phases_text(phases.get(s['run'], []))} |")
    return "\n".join(lines)


# -- plots -----------------------------------------------------------------------------------


def plot_timelines(path: Path, results: Sequence[RunResult], what: str = "latency",
                   ref: float | dict[str, float] = math.nan,
                   targets: dict[str, float] | None = None, title: str = "") -> None:
    """One panel per run over the time epochs completed, reconfigurations shaded.

    ``what`` is ``"latency"`` (seconds, log scale, with a dashed line at ``ref`` when given,
    e.g. 1.5x the steady-state p99 -- one for every run, or per run name -- and a dotted one
    at a run's latency target in ``targets``) or ``"rss"`` (MiB of driver + JVM + workers).
    ``title`` goes above the panels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.8 * n + 0.9), sharex=True, sharey=True,
                             squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        rows = [r for r in result.rows if r.phase != WARMUP]
        xs = [r.finished_s for r in rows]
        if what == "latency":
            ys = [max(r.latency_s, 1e-3) for r in rows]
            ax.set_yscale("log")
            # 1-2-5 steps, so a range within one decade still has labels
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylabel("latency s")
            line = ref.get(result.name, math.nan) if isinstance(ref, dict) else ref
            if math.isfinite(line):
                ax.axhline(line, color="tab:red", linestyle="--", linewidth=0.8)
            if targets and result.name in targets:
                ax.axhline(targets[result.name], color="tab:green", linestyle=":",
                           linewidth=1.2)
        else:
            ys = [r.rss_total_mb for r in rows]
            ax.set_ylabel("RSS MiB")
        ax.plot(xs, ys, marker=".", linewidth=1, markersize=3)
        for w in result.windows:
            ax.axvspan(w.start_s, w.end_s, color="tab:orange", alpha=0.3, linewidth=0)
        for r in rows:
            if r.phase == DRAIN:
                ax.axvspan(r.started_s, r.finished_s, color="tab:orange", alpha=0.1, linewidth=0)
        ax.set_title(result.name, fontsize=9, loc="left")
        ax.grid(True, which="major", alpha=0.3)
    refs = ref.values() if isinstance(ref, dict) else [ref]
    note = "; dashed: 1.5x steady p99" if what == "latency" and any(
        math.isfinite(r) for r in refs) else ""
    if what == "latency" and targets:
        note += "; dotted: latency target"
    axes[-1, 0].set_xlabel("time the epoch completed (s since the run started); migration "
                           f"shaded, backlog drain lightly shaded{note}")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
