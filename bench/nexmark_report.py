"""The NEXMark benchmark's report (``bench/nexmark.py``): its epoch rows, a table and a latency
timeline per query, ``summary.md`` and ``summary.json``.

Statistics are ``report.run_stats``'s, per run: steady p50/p99 over the epochs outside the
rescale and its backlog (warm-up excluded); "during" the rescale covers the epochs that ran (or
whose input interval ended) while it was in progress and those still behind after it; epochs
over 1.5x the run's own steady p99 are counted among those; the drain time runs from the end
of the rescale (the restart, for native) until the backlog was worked off
(``report.drain_times``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from report import EpochRow, RunResult, fmt_x, ms, plot_timelines, ratio, run_stats, secs


@dataclass
class NexRow(EpochRow):
    """An epoch of a NEXMark run: ``records`` are the events fed; ``outputs`` the rows the
    query emitted; ``bins_done`` / ``bins_total`` the rescale's progress over every stage
    (megaphone runs)."""

    outputs: int = 0
    bins_done: int = 0
    bins_total: int = 0


#: The operator path that runs windows and joins key by key, and the suffix of its runs' names.
PER_KEY = "per-key"
#: The path that runs a chain's stages as a Spark job each (``Chain(one_job=False)``), and the
#: suffix of its runs' names.
PER_STAGE = "per-stage"


def deadline_target(run: str) -> float | None:
    """``L`` of a ``deadline@L`` run name (L > 0 seconds; also ``deadline@L-per-key`` and
    ``-per-stage``), else None."""
    run = run.removesuffix(f"-{PER_KEY}").removesuffix(f"-{PER_STAGE}")
    try:
        value = float(run[len("deadline@"):]) if run.startswith("deadline@") else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def pauses(phases: list[dict[str, Any]]) -> str:
    """A native run's pause as ``stop 0.3 + repartition 1.9 + restart 0.8 = 3.0``."""
    return "; ".join(f"stop {p['stop_s']:.2f} + repartition {p['migrate_s']:.2f} + restart "
                     f"{p['reopen_s']:.2f} = {p['pause_s']:.2f}" for p in phases) or "-"


def drains(s: dict[str, Any]) -> str:
    """The drain time after the rescale, or ``not drained`` within the run."""
    if not s["drains_s"]:
        return "-"
    return ", ".join("not drained" if math.isnan(d) else f"{d:.1f}" for d in s["drains_s"])


def query_table(results: list[RunResult]) -> str:
    """One line per run: steady latency, the spike and its backlog, what moved, the check."""
    lines = ["| run | steady p50 ms | steady p99 ms | max ms during rescale | max / steady p99 "
             "| epochs over 1.5x steady p99 / during | drain s | rescale s | bins moved "
             "| pause phases s | epochs | check |", "|" + "---|" * 12]
    for r in results:
        s = run_stats(r)
        during = s["epochs_during"]
        over = f"{s['over_target']} / {during}" if during else "-"
        lines.append(
            f"| {r.name} | {ms(s['steady_p50'])} | {ms(s['steady_p99'])} | {ms(s['mig_max'])} "
            f"| {fmt_x(ratio(s['mig_max'], s['steady_p99']))} "
            f"| {over} "
            f"| {drains(s)} | {secs(s['migration_s'])} | {s['bins_moved'] or '-'} "
            f"| {pauses(r.phases)} | {s['epochs']} | {r.check} |")
    return "\n".join(lines)


def plot_query(path: Path, query: str, results: list[RunResult]) -> None:
    """Latency over time for every run of ``query`` (one panel each, the rescale shaded, a
    dashed line at 1.5x the run's own steady p99, a dotted one at a deadline target)."""
    refs = {r.name: 1.5 * run_stats(r)["steady_p99"] for r in results}
    targets = {r.name: deadline_target(r.name) for r in results if deadline_target(r.name)}
    plot_timelines(path, results, "latency", refs, targets,  # type: ignore[arg-type]
                   title=f"NEXMark {query.upper()}: latency through a rescale from 2 to 4")


def setup_text(cfg: Any) -> str:
    """The settings in one paragraph."""
    n = cfg.nexmark
    return (f"{cfg.rate:,.0f} events/s (the generator's event time at the same rate) in "
            f"epochs of {cfg.interval:g} s ({cfg.per_epoch:,} events); {cfg.bins} bins per "
            f"stage; {cfg.workers} -> {2 * cfg.workers} workers (megaphone) and state "
            f"partitions (native); {cfg.warmup} warm-up epochs back to back, then open loop: "
            f"{cfg.pre} epochs before the rescale, at least {cfg.cooldown} after it and at "
            f"most {cfg.drain_epochs} more until the backlog drained (native: "
            f"{cfg.steady_epochs} open-loop epochs without restart); windows {cfg.window_s:g} s "
            f"(Q5 sliding every {cfg.window_s / 5:g} s); {n.num_in_flight_auctions} auctions "
            f"in flight; operator paths {', '.join(cfg.paths)}; backend {cfg.backend}; "
            f"batched per_worker={cfg.per_worker}; Spark master {cfg.master}.")


RUNS_TEXT = [
    "fluid / batched / all-at-once / deadline@L: megaphone; every stateful stage (Q4: winning "
    "bids and average; Q3, Q8: the join; Q5, Q7: the window stage -- their top-of-window stage "
    "keeps no state) rescaled live from 2 to 4 workers with that strategy (deadline@L: a "
    "deadline plan per stage with latency target L s); outputs checked against the batch SQL "
    "for what the stream finalized, nothing late; `<run>-per-key`: the same with the windows "
    "and joins run key by key instead of an epoch in columns (their `vectorized=False`)",
    "native: the query in Spark Structured Streaming (file source, RocksDB state, foreachBatch "
    "sink), never restarted: its steady state; outputs checked against the batch SQL",
    "native-repartition: the same, stopped between triggers where megaphone rescales, "
    "`spark._streamingCheckpointManager.repartition(checkpoint, 4)`, restarted in the same "
    "SparkSession while the input keeps arriving; outputs checked",
]


def summary_text(cfg: Any, results: dict[str, list[RunResult]], info: dict[str, Any]) -> str:
    """``summary.md``."""
    from nexmark_native import QUERIES as NATIVE
    from nexmark_native import UNSUPPORTED

    lines = [f"# NEXMark through a live rescale ({cfg.size})", "",
             f"Command: `{info['command']}`", "", f"Machine: {info['machine']}", "",
             f"Started {info['started']}; load average {info['load_start']:.1f} at the start"
             + (f", {info['load_end']:.1f} at the end; took {info['took_s']:.0f} s"
                if "load_end" in info else " (still running)") + ".", "",
             f"Setup: {setup_text(cfg)}", "", "Runs:", "", *[f"- {t}" for t in RUNS_TEXT], "",
             "Native Spark expresses " + ", ".join(q.upper() for q in NATIVE) + "; not "
             + "; ".join(f"{q.upper()}: {why}" for q, why in UNSUPPORTED.items()) + ".", "",
             "Columns: steady p50/p99 over the epochs outside the rescale and its backlog; "
             "max during the rescale (and its backlog) and that over the steady p99; epochs "
             "over 1.5x the run's steady p99 among those; drain time from the end of the "
             "rescale (native: the restart) until the backlog was worked off; for native the "
             "pause's phases.", ""]
    for query, runs in results.items():
        lines += [f"## {query.upper()}", "", query_table(runs), "",
                  f"![{query}]({query}.png)", ""]
        if query in UNSUPPORTED and any(r in cfg.runs for r in ("native", "native-repartition")):
            lines += [f"No native run: {UNSUPPORTED[query]}.", ""]
        lines += [f"- {r.name}: load average {r.load_avg[0]:.1f} -> {r.load_avg[1]:.1f}; "
                  + "; ".join(r.notes) for r in runs] + [""]
    return "\n".join(lines)


def write_outputs(cfg: Any, results: dict[str, list[RunResult]], info: dict[str, Any]) -> str:
    """Plots of the queries run so far, ``summary.md`` and ``summary.json``; the markdown."""
    for query, runs in results.items():
        if runs:
            plot_query(cfg.out / f"{query}.png", query, runs)
    text = summary_text(cfg, results, info)
    (cfg.out / "summary.md").write_text(text)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    payload = {"config": config, "info": info, "queries": {
        q: {r.name: {**run_stats(r), "notes": r.notes, "phases": r.phases,
                     "windows": [asdict(w) for w in r.windows]} for r in runs}
        for q, runs in results.items()}}
    (cfg.out / "summary.json").write_text(json.dumps(payload, indent=1, default=str))
    return text
