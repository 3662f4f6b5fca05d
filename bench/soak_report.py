"""The soak's verdict: the final state against the reference, backlog, memory and disk trends.

Read by ``bench/soak.py`` after a run from the run directory's JSON lines (epochs, actions,
writes, resource samples). An epoch is *quiet* when it is past the warm-up, outside DS2 slots
(their rate steps up), moves nothing, has no plan in flight and is not inside a kill's
recovery; the backlog criterion compares quiet epochs of the first and last third of the run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bench.soak_driver import Schedule, read_lines
from megaphone.routing.placement import homes_enforced

#: Allowed growth of the last third over the first third (backlog, memory, disk).
GROWTH = 0.10
#: Backlog: an absolute allowance (s) under which a change of the median latency is noise.
LATENCY_SLACK_S = 0.5
#: Disk reported but not judged: input files not read yet, and the query's checkpoint, whose
#: file source log (Spark's) lists every file the stream ever read.
NOT_STATE = {"input-pending", "stream-checkpoint"}
#: Seconds after a kill within which an epoch never counts as quiet.
KILL_SHADOW_S = 120.0
#: The columns of a driver kill's recovery, in order (:func:`driver_recoveries`).
DRIVER_PHASES = ("at_s", "restart_pause", "interpreter", "pyspark_jvm_session",
                 "executors_after_session", "pipeline_open", "workers_probe", "stream_start",
                 "to_first_epoch",
                 "first_epoch_duration", "first_epoch_restores", "first_epoch_restore_s",
                 "first_epoch_begin_s", "backlog", "recovered")
#: Shorter runs (CI's two minutes) only report the trends: warm-up, restarts and a few samples
#: dominate them. The state check always counts.
TREND_MIN_S = 20 * 60


def check_state(run: Path, reference: np.ndarray) -> dict[str, Any]:
    """Compare ``final.parquet`` (key, count) with the counts of everything written."""
    path = run / "final.parquet"
    if not path.exists():
        return {"ok": False, "error": "the driver wrote no final state"}
    final = pq.read_table(path)
    keys = final.column("k").to_numpy()
    counts = final.column("count").to_numpy()
    got = np.zeros_like(reference)
    outside = int(((keys < 0) | (keys >= len(reference))).sum())
    inside = (keys >= 0) & (keys < len(reference))
    np.add.at(got, keys[inside], counts[inside])
    return {"ok": bool(outside == 0 and len(np.unique(keys)) == len(keys)
                      and np.array_equal(got, reference)),
            "keys": len(keys), "duplicate_keys": int(len(keys) - len(np.unique(keys))),
            "unknown_keys": outside, "records_written": int(reference.sum()),
            "records_counted": int(got.sum()),
            "lost": int(np.clip(reference - got, 0, None).sum()),
            "doubled": int(np.clip(got - reference, 0, None).sum()),
            "keys_wrong": int((got != reference).sum())}


def annotate(epochs: list[dict], writes: list[dict]) -> None:
    """Add to each epoch its backlog: records written after its newest applied event time."""
    times = np.array([w["time"] for w in writes])
    written = np.cumsum([w["n"] for w in writes]) if writes else np.zeros(0)

    def upto(t: float) -> int:
        i = int(np.searchsorted(times, t, side="right"))
        return int(written[i - 1]) if i else 0

    for e in epochs:
        lat = e["latency_s"]
        e["backlog"] = None if lat is None else upto(e["time"]) - upto(e["time"] - lat - 1e-3)


def mark_replays(epochs: list[dict], phases: list[dict]) -> None:
    """Mark the lines of batches a restarted driver replayed (``replay``): an epoch the killed
    driver committed before its sink ran, whose line carries that epoch's metrics (it started
    before the driver that wrote the line did), not a sign of the new driver's progress."""
    born = {p["pid"]: p["time"] for p in phases if p["phase"] == "process"}
    for e in epochs:
        e["replay"] = e.get("started") is not None and e["started"] < born.get(e["pid"], 0.0)


def recoveries(epochs: list[dict], kills: list[dict], steady: float) -> list[float | None]:
    """Seconds from each kill to the first epoch run after it whose latency is back near
    ``steady`` (a replayed batch's line, :func:`mark_replays`, does not count)."""
    out: list[float | None] = []
    bound = max(1.5 * steady, steady + 1.0)
    for k in kills:
        after = [e for e in epochs if e["time"] > k["time"] + 1 and e["latency_s"] is not None
                 and not e.get("replay")]
        back = next((e for e in after if e["latency_s"] <= bound), None)
        out.append(None if back is None else back["time"] - k["time"])
    return out


def driver_recoveries(result: dict[str, Any], epochs: list[dict], phases: list[dict],
                      kills: list[dict], recovered: list[float | None]) -> list[dict[str, Any]]:
    """Where each driver kill's recovery went, in seconds: the soak's pause before the restart,
    the new driver's start-up phases (``phases.jsonl``: interpreter, PySpark with its JVM and
    SparkSession, the executors registering beside the rest, the pipeline opened from its state
    directory, the probe of the Python workers a first epoch runs, the stream started), the
    wait until its first epoch started, that epoch's own duration (its worker restores, their
    longest, the longest store opening) and the backlog drained after it. ``epochs``: the
    epochs' lines in time order, replays marked (:func:`mark_replays`)."""
    events = result["events"]
    out = []
    for k, back in zip(kills, recovered, strict=True):
        start = next((e for e in events if e["event"] == "start" and e["time"] > k["time"]),
                     None)
        if k["event"] != "kill-driver" or start is None:
            continue
        at = {p["phase"]: p["time"] for p in phases if p["pid"] == start["pid"]}
        first = next((e for e in epochs if e["pid"] == start["pid"] and not e["replay"]),
                     None)

        def gap(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(b - a, 1)

        until = None if back is None else k["time"] + back
        out.append({
            "at_s": round(k["time"] - result["schedule"].t0, 1),
            "restart_pause": gap(k["time"], start["time"]),
            "interpreter": gap(start["time"], at.get("process")),
            "pyspark_jvm_session": gap(at.get("process"), at.get("session")),
            "executors_after_session": gap(at.get("session"), at.get("executors")),
            "pipeline_open": gap(at.get("session"), at.get("pipeline")),
            "workers_probe": gap(at.get("pipeline"), at.get("workers")),
            "stream_start": gap(at.get("workers", at.get("pipeline")), at.get("stream")),
            "to_first_epoch": gap(at.get("stream"), first and first.get("started")),
            "first_epoch_duration": None if first is None else round(first["duration_s"], 1),
            "first_epoch_restores": None if first is None else first["restored"],
            "first_epoch_restore_s": None if first is None else
            round(first.get("restore_s", 0.0), 1),
            "first_epoch_begin_s": None if first is None else round(first.get("begin_s", 0.0), 1),
            "first_epoch_phases_s": None if first is None else first.get("phases_s"),
            "backlog": gap(first and first["time"], until),
            "recovered": None if back is None else round(back, 1)})
    return out


def restores_outside_kills(epochs: list[dict], s: Schedule, kills: list[dict],
                           recovered: list[float | None]) -> dict[str, Any]:
    """Worker restores in the epochs after the warm-up outside every kill's recovery (its first
    ``KILL_SHADOW_S`` seconds, or until it recovered if that took longer): with homes, a
    worker's store is restored only after a loss."""
    spans = [(k["time"], k["time"] + max(KILL_SHADOW_S, math.inf if r is None else r))
             for k, r in zip(kills, recovered, strict=True)]
    calm = [e for e in epochs if e["time"] >= s.t0 + s.warmup_s
            and not any(a <= e["time"] <= b for a, b in spans)]
    restores = int(sum(e["restored"] for e in calm))
    return {"epochs": len(calm), "restores": restores, "ok": restores == 0}


def quiet(e: dict, s: Schedule, kills: list[dict]) -> bool:
    """Whether epoch ``e`` is quiet (see the module docstring)."""
    slot = s.slot(e["time"])
    return (slot >= 0 and s.action(slot) != "ds2" and not e["in_flight"]
            and not e["bins_moved"] and e["latency_s"] is not None
            and not any(0 <= e["time"] - k["time"] <= KILL_SHADOW_S for k in kills))


def thirds(s: Schedule) -> tuple[tuple[float, float], tuple[float, float]]:
    """The first and last third of the run after the warm-up, in wall time."""
    start, end = s.t0 + s.warmup_s, s.t0 + s.seconds
    third = (end - start) / 3
    return (start, start + third), (end - third, end)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def trend(samples: list[dict], value, s: Schedule) -> dict[str, Any]:
    """Median of ``value(sample)`` in the first and last third, and their ratio."""
    (a0, a1), (b0, b1) = thirds(s)
    first = _median([value(x) for x in samples if a0 <= x["time"] < a1])
    last = _median([value(x) for x in samples if b0 <= x["time"] <= b1])
    ratio = None if not first or last is None else last / first
    return {"first": first, "last": last, "ratio": ratio,
            "ok": ratio is not None and ratio <= 1 + GROWTH}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Every number of the run and the four criteria."""
    run, s = result["run"], result["schedule"]
    by_epoch = {e["epoch"]: e for e in read_lines(run / "epochs.jsonl")}
    epochs = sorted(by_epoch.values(), key=lambda e: e["time"])
    writes = read_lines(run / "writer.jsonl")
    samples = read_lines(run / "resources.jsonl")
    actions = read_lines(run / "actions.jsonl")
    kills = [e for e in result["events"] if e["event"].startswith("kill")]
    annotate(epochs, writes)
    phases = read_lines(run / "phases.jsonl")
    mark_replays(epochs, phases)
    calm = [e for e in epochs if quiet(e, s, kills)]
    steady = _median([e["latency_s"] for e in calm]) or 1.0
    recovered = recoveries(epochs, kills, steady)
    (a0, a1), (b0, b1) = thirds(s)
    first = _median([e["latency_s"] for e in calm if a0 <= e["time"] < a1])
    last = _median([e["latency_s"] for e in calm if b0 <= e["time"] <= b1])
    backlog_ok = first is not None and last is not None and \
        last <= max(first * (1 + GROWTH), first + LATENCY_SLACK_S)
    latencies = [e["latency_s"] for e in epochs if e["latency_s"] is not None]
    kinds = sorted({k for x in samples for k in x["rss"]})
    disk_names = sorted({k for x in samples for k in x["disk"]} - NOT_STATE)
    migrations: dict[str, int] = {}
    for a in actions:
        if a["action"] not in ("start", "finish"):
            migrations[a["action"]] = migrations.get(a["action"], 0) + 1
    return {
        "state": check_state(run, result["reference"]),
        "backlog": {"first_third_latency_s": first, "last_third_latency_s": last,
                    "quiet_epochs": len(calm), "ok": backlog_ok},
        "rss": trend(samples, lambda x: sum(x["rss"].values()), s),
        "rss_by_kind": {k: trend(samples, lambda x, k=k: x["rss"].get(k, 0.0), s)
                        for k in kinds},
        "disk": trend(samples, lambda x: sum(x["disk"][n] for n in disk_names), s),
        "disk_by_kind": {n: trend(samples, lambda x, n=n: x["disk"].get(n, 0.0), s)
                         for n in sorted({k for x in samples for k in x["disk"]})},
        "epochs": len(epochs), "records_written": int(sum(w["n"] for w in writes)),
        "latency_s": {"p50": float(np.percentile(latencies, 50)) if latencies else None,
                      "p99": float(np.percentile(latencies, 99)) if latencies else None,
                      "max": max(latencies, default=None), "quiet_p50": steady},
        "backlog_records_max": max((e["backlog"] or 0 for e in epochs), default=0),
        "migrations": migrations,
        "bins_moved": int(sum(e["bins_moved"] for e in epochs)),
        "bytes_moved": int(sum(e["bytes_moved"] for e in epochs)),
        "epochs_retried": sum(1 for e in epochs if e["job_attempts"] > 1),
        "workers_restored": int(sum(e["restored"] for e in epochs)),
        "restores_outside_kills": restores_outside_kills(epochs, s, kills, recovered),
        "kills": [{"at_s": round(k["time"] - s.t0, 1), "what": k["event"][5:],
                   "recovered_s": None if r is None else round(r, 1)}
                  for k, r in zip(kills, recovered, strict=True)],
        "driver_recoveries": driver_recoveries(result, epochs, phases, kills, recovered),
        "driver_starts": sum(1 for e in result["events"] if e["event"] == "start"),
        "cluster": result["cluster"],
    }


def markdown(summary: dict[str, Any], command: str) -> str:
    """The summary as the Markdown that goes into ``bench/RESULTS.md``."""
    st, bl, rss, disk = summary["state"], summary["backlog"], summary["rss"], summary["disk"]

    def r(x: float | None, f: str = ".2f") -> str:
        return "-" if x is None else format(x, f)

    lat, out = summary["latency_s"], summary["restores_outside_kills"]
    lines = [
        f"command: `{command}`", "",
        "| criterion | first third | last third | ratio | pass |", "|---|---:|---:|---:|---|",
        f"| state equals the reference ({st.get('records_counted', 0):,} of "
        f"{st.get('records_written', 0):,} records; lost {st.get('lost', '-')}, doubled "
        f"{st.get('doubled', '-')}) | | | | {'yes' if st['ok'] else 'NO'} |",
        f"| backlog: median latency of quiet epochs (s) | {r(bl['first_third_latency_s'])} | "
        f"{r(bl['last_third_latency_s'])} | | {'yes' if bl['ok'] else 'NO'} |",
        f"| resident memory, all processes (MiB) | {r(rss['first'], '.0f')} | "
        f"{r(rss['last'], '.0f')} | {r(rss['ratio'], '.3f')} | {'yes' if rss['ok'] else 'NO'} |",
        f"| disk: state, checkpoints, Spark local (MiB) | {r(disk['first'], '.1f')} | "
        f"{r(disk['last'], '.1f')} | {r(disk['ratio'], '.3f')} | "
        f"{'yes' if disk['ok'] else 'NO'} |", "",
        f"{summary['epochs']} epochs, {summary['records_written']:,} records; latency p50 "
        f"{r(lat['p50'])} s, p99 {r(lat['p99'])} s, max {r(lat['max'])} s (quiet p50 "
        f"{r(lat['quiet_p50'])} s); largest backlog {summary['backlog_records_max']:,} records.",
        f"Migrations: {summary['migrations']}; {summary['bins_moved']} bins "
        f"({summary['bytes_moved'] / 2**20:.1f} MiB) moved; {summary['driver_starts']} driver "
        f"starts; {summary['epochs_retried']} epochs retried by Spark; "
        f"{summary['workers_restored']} worker restores.", "",
        f"Worker restores after the warm-up outside the kills' recoveries (at least "
        f"{KILL_SHADOW_S:.0f} s each): {out['restores']} in {out['epochs']} epochs.", "",
        "| kill at (s) | what | recovered after (s) |", "|---:|---|---:|",
        *(f"| {k['at_s']:.0f} | {k['what']} | {r(k['recovered_s'], '.1f')} |"
          for k in summary["kills"]), "",
        "Where a driver kill's recovery went (s): the soak's pause before the restart; the new "
        "driver's interpreter; PySpark, its JVM and SparkSession; the pipeline opened; the "
        "probe of Spark's Python workers (a one-task-per-slot job); the stream started; until "
        "its first epoch started; that epoch's own duration (its "
        "restores, the longest restore, the longest store opening); the backlog drained after "
        "it. Executors register beside the pipeline's opening (seconds after the session).", "",
        "| kill at | pause | interpreter | JVM+session | executors | pipeline | probe | stream | "
        "to 1st epoch | 1st epoch | restores | restore | opening | backlog | recovered |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *("| " + " | ".join(r(d[c], ".1f") if isinstance(d[c], float) else
                            "-" if d[c] is None else str(d[c]) for c in DRIVER_PHASES) + " |"
          for d in summary["driver_recoveries"]), "",
        "| memory by kind (MiB) | first third | last third | ratio |", "|---|---:|---:|---:|",
        *(f"| {k} | {r(v['first'], '.0f')} | {r(v['last'], '.0f')} | {r(v['ratio'], '.3f')} |"
          for k, v in summary["rss_by_kind"].items()),
        *(f"| disk: {k}{' (not judged)' if k in NOT_STATE else ''} | {r(v['first'], '.1f')} | "
          f"{r(v['last'], '.1f')} | {r(v['ratio'], '.3f')} |"
          for k, v in summary["disk_by_kind"].items()),
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Latency and backlog, workers, memory and disk over the run; kills and actions marked."""
    try:
        import matplotlib
    except ImportError:  # the plot extra is optional
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run, s = result["run"], result["schedule"]
    epochs = sorted({e["epoch"]: e for e in read_lines(run / "epochs.jsonl")}.values(),
                    key=lambda e: e["time"])
    samples = read_lines(run / "resources.jsonl")
    actions = [a for a in read_lines(run / "actions.jsonl") if a["slot"] >= 0]

    def minutes(t: float) -> float:
        return (t - s.t0) / 60

    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    te = [minutes(e["time"]) for e in epochs]
    axes[0].plot(te, [e["latency_s"] for e in epochs], ".", ms=2)
    axes[0].set_ylabel("latency (s)")
    axes[0].set_yscale("log")
    axes[1].step(te, [e["workers"] for e in epochs], where="post")
    axes[1].set_ylabel("workers")
    ts = [minutes(x["time"]) for x in samples]
    for kind in sorted({k for x in samples for k in x["rss"]}):
        axes[2].plot(ts, [x["rss"].get(kind, 0) for x in samples], label=kind)
    axes[2].set_ylabel("RSS (MiB)")
    axes[2].legend(fontsize=7, ncol=3)
    for name in sorted({k for x in samples for k in x["disk"]}):
        axes[3].plot(ts, [x["disk"].get(name, 0) for x in samples], label=name)
    axes[3].set_ylabel("disk (MiB)")
    axes[3].legend(fontsize=7, ncol=3)
    axes[3].set_xlabel("minutes")
    for ax in axes:
        for k in result["events"]:
            if k["event"].startswith("kill"):
                ax.axvline(minutes(k["time"]), color="red",
                           linestyle="-" if k["event"] == "kill-driver" else "--", lw=0.8)
        for a in actions:
            ax.axvline(minutes(a["time"]), color="gray", linestyle=":", lw=0.6)
    axes[0].set_title("soak: actions (dotted), driver kills (red), executor kills (red dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(result: dict[str, Any], args: argparse.Namespace, out: Path) -> int:
    """Write summary.json, summary.md and soak.png under ``out``; 0 when every criterion held."""
    summary = summarize(result)
    command = "python bench/soak.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        if v is not None and k != "out")
    text = markdown(summary, command)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "summary.md").write_text(text)
    plot(result, out / "soak.png")
    print(text)
    long = result["schedule"].seconds >= TREND_MIN_S
    enforced = ("state", "backlog", "rss", "disk") if long else ("state",)
    if long and result["cluster"] and homes_enforced():
        enforced += ("restores_outside_kills",)
    ok = all(summary[k]["ok"] for k in enforced)
    if len(enforced) == 1:
        print(f"(a run under {TREND_MIN_S // 60} minutes checks only the state; the trends "
              "above are reported, not enforced)")
    print("soak: PASS" if ok else "soak: FAIL", flush=True)
    return 0 if ok else 1
