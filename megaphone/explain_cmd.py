"""Explain slow epochs: rank what the driver and the workers did by critical participation.

Reads the SnailTrail traces a pipeline keeps in its state directory (``traces.jsonl``, one per
epoch: :mod:`megaphone.migrator.trace`), builds the program activity graph of the chosen
epochs and ranks its activities by critical participation
(:func:`megaphone.snailtrail.analyze`): the share of the window an activity takes on the
critical paths. Waiting counts too. Prints the top activities, the share by kind, by worker
(stragglers: waiting and scheduling left out), by kind and worker (which work of which worker
holds the epochs back) and by moved bin; ``--plot`` draws each worker's
timeline with the top activities outlined (needs the ``plot`` extra, matplotlib). The driver's
idle time between epochs (a stream waiting for its trigger, a caller between ``process``
calls) is reported apart, as ``idle``, and left out of the ranking: it is waiting for input,
not work an epoch waited for.

Read-only, safe next to a running pipeline.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from megaphone.plans.report import table
from megaphone.snailtrail import (
    GAP,
    RECORDED,
    CriticalReport,
    EpochTrace,
    PagEdge,
    Participation,
    analyze,
)

#: Epochs explained when ``--epochs`` is not given: the newest ones.
DEFAULT_EPOCHS = 50
#: Kinds left out of the straggler ranking: not a worker's own work.
NOT_WORK = ("wait", "schedule")
#: The kind ``explain`` gives the driver's time between epochs.
IDLE = "idle"


def is_idle(edge: PagEdge) -> bool:
    """Whether ``edge`` is the driver idle between epochs (a gap on its timeline: its phases
    of an epoch follow each other without one), waiting for input rather than for work."""
    return edge.role == GAP and edge.worker is None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``explain``'s options."""
    parser.add_argument("--state-dir", required=True, metavar="DIR",
                        help="the pipeline's state directory")
    parser.add_argument("--epochs", metavar="A:B",
                        help=f"the epochs to explain, A to B inclusive (either may be left "
                             f"out; default: the last {DEFAULT_EPOCHS} traced)")
    parser.add_argument("--top", type=int, default=15, metavar="N",
                        help="how many activities to list (default 15)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="draw the workers' timelines with the critical activities")


def parse_epochs(text: str) -> tuple[int | None, int | None]:
    """``"A:B"``, ``"A:"``, ``":B"`` or ``"A"`` as inclusive bounds; ValueError otherwise."""
    lo, sep, hi = text.partition(":")
    try:
        a = int(lo) if lo.strip() else None
        b = (int(hi) if hi.strip() else None) if sep else a
    except ValueError:
        raise ValueError(f"--epochs must be A:B (epoch numbers), got {text!r}") from None
    if (a is not None and a < 0) or (b is not None and b < 0) or (
            a is not None and b is not None and b < a):
        raise ValueError(f"--epochs must be A:B with 0 <= A <= B, got {text!r}")
    return a, b


def load_traces(state_dir: str, epochs: str | None) -> list[EpochTrace]:
    """The traces of the chosen epochs; ValueError for no state directory, no traces, a bad
    ``epochs`` or none in its range."""
    from megaphone.migrator.statedir.directory import StateDir

    bounds = parse_epochs(epochs) if epochs is not None else None
    traces = StateDir.open(state_dir).read_traces()  # NotAStateDir (a ValueError) if not one
    if not traces:
        raise ValueError(f"{state_dir} holds no epoch traces (was tracing off, "
                         "MEGAPHONE_TRACE=0, or has no epoch run?)")
    if bounds is None:
        return traces[-DEFAULT_EPOCHS:]
    lo, hi = bounds
    chosen = [t for t in traces if (lo is None or t.epoch >= lo) and (hi is None or t.epoch <= hi)]
    if not chosen:
        raise ValueError(f"no traced epoch in {epochs} (traced: {traces[0].epoch}.."
                         f"{traces[-1].epoch})")
    return chosen


def window(traces: list[EpochTrace]) -> tuple[float, float]:
    """The window the traces span: their first start to their last end."""
    starts = [a.start for t in traces for a in t.activities]
    ends = [a.end for t in traces for a in t.activities]
    return min(starts), max(max(ends), min(starts) + 1e-9)


def _item(p: Participation) -> dict[str, Any]:
    e = p.edge
    return {"kind": e.kind, "role": e.role, "worker": e.worker, "lane": e.lane,
            "sender": None if e.sender is None else e.sender[0], "bin": e.bin,
            "epoch": e.epoch, "start": e.start, "duration_s": e.weight, "cp": p.cp}


def explain(traces: list[EpochTrace], top: int = 15) -> tuple[dict[str, Any], CriticalReport]:
    """Everything ``explain`` shows, as a JSON-ready dict (the ``--json`` output), and the
    report it comes from."""
    t_s, t_e = window(traces)
    report = analyze(traces, t_s, t_e)
    return {
        "epochs": [traces[0].epoch, traces[-1].epoch],
        "traced_epochs": len(traces),
        "window_s": t_e - t_s,
        "paths": str(report.paths),  # may exceed what JSON readers hold exactly
        "idle": sum(p.cp for p in report.items if is_idle(p.edge)),
        "top": [_item(p) for p in report.top(len(report.items)) if not is_idle(p.edge)][:top],
        "by_kind": report.summarize(lambda e: IDLE if is_idle(e) else e.kind),
        "by_worker": {("driver" if w is None else str(w)): cp
                      for w, cp in report.by_worker(exclude_kinds=NOT_WORK).items()},
        "by_activity": {f"{kind} {_who(w)}": cp for (kind, w), cp in report.summarize(
            lambda e: (e.kind, e.worker) if e.role == RECORDED and e.kind not in NOT_WORK
            else None).items()},
        "by_bin": {str(b): cp for b, cp in report.by_bin().items()},
    }, report


def _who(worker: Any) -> str:
    return "driver" if worker in (None, "driver") else f"w{worker}"


def render(info: dict[str, Any]) -> str:
    """The human-readable report of :func:`explain`'s output."""
    a, b = info["epochs"]
    lines = [f"epochs {a}..{b} ({info['traced_epochs']} traced), {info['window_s']:.3f} s; "
             "critical participation (CP): the share of the window on the critical paths",
             f"idle: {100 * info['idle']:.1f}% of the window the driver waited between epochs "
             "for input (left out of the ranking)", ""]
    rows = []
    for i, item in enumerate(info["top"], 1):
        who = _who(item["worker"])
        if item["role"] == "comm":
            who = f"{_who(item['sender'])}->{who}"
        kind = item["kind"] + (" (gap)" if item["role"] == "gap" else "")
        rows.append([i, kind, who, "" if item["bin"] is None else item["bin"],
                     "" if item["epoch"] is None else item["epoch"],
                     f"{item['duration_s']:.3f}", f"{100 * item['cp']:.1f}%"])
    lines += table(["#", "activity", "worker", "bin", "epoch", "seconds", "CP"], rows)
    lines.append("")
    lines.append("by kind:   " + ", ".join(f"{k} {100 * v:.1f}%"
                                           for k, v in info["by_kind"].items() if v >= 0.001))
    lines.append("by worker: " + ", ".join(f"{_who(w)} {100 * v:.1f}%"
                                           for w, v in info["by_worker"].items())
                 + "  (own work: waiting and scheduling left out)")
    lines.append("by work:   " + ", ".join(f"{k} {100 * v:.1f}%"
                                           for k, v in list(info["by_activity"].items())[:8])
                 + "  (kind and worker, own work)")
    if info["by_bin"]:
        lines.append("by bin:    " + ", ".join(f"{b} {100 * v:.1f}%"
                                               for b, v in list(info["by_bin"].items())[:10]))
    return "\n".join(lines)


def plot(traces: list[EpochTrace], report: CriticalReport, out: str, top: int = 15) -> None:
    """Draw each timeline's activities as bars colored by kind, the ``top`` activities by CP
    outlined, into the PNG ``out``. ValueError if matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'megaphone[plot]'") from None
    critical = {(p.edge.epoch, p.edge.activity) for p in report.top(top)
                if p.edge.role == "recorded"}
    t0 = report.t_s
    timelines = sorted({a.timeline for t in traces for a in t.activities},
                       key=lambda tl: (tl[0] is not None, tl[0] or 0, tl[1]))
    row = {tl: i for i, tl in enumerate(timelines)}
    kinds = sorted({a.kind for t in traces for a in t.activities})
    cmap = plt.get_cmap("tab20")
    color = {k: cmap(i % 20) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.5 * len(timelines)))
    for t in traces:
        for a in t.activities:
            hot = (t.epoch, a.id) in critical
            ax.barh(row[a.timeline], max(a.duration, 1e-4), left=a.start - t0, height=0.6,
                    color=color[a.kind], edgecolor="black" if hot else "none",
                    linewidth=2.0 if hot else 0.0)
    ax.set_yticks(range(len(timelines)))
    ax.set_yticklabels([("driver" if w is None else f"w{w}") + (f"/{lane}" if lane else "")
                        for w, lane in timelines])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the window's start")
    ax.set_title(f"epochs {traces[0].epoch}..{traces[-1].epoch}: outlined = top {top} by CP")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=color[k]) for k in kinds],
              labels=kinds, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Print the report (or JSON with ``--json``), draw ``--plot``; exit 0."""
    if args.top < 1:
        raise ValueError(f"--top must be at least 1, got {args.top}")
    traces = load_traces(args.state_dir, args.epochs)
    info, report = explain(traces, args.top)
    if args.plot:
        plot(traces, report, args.plot, args.top)
    print(json.dumps(info, indent=1) if args.json else render(info))
    return 0
