"""The capacity sweep of the NEXMark benchmark (``bench/nexmark.py --sweep``): per query, the
highest input rate megaphone's steady run and native Spark's each sustain, its rules and its
outputs.

A *point* is one run of one system at one rate: its warm-up epochs, then ``--sweep-seconds``
of open-loop epochs (latency = completion minus the end of the epoch's input interval, so a
backlog shows). The rate is *sustained* (:func:`judge`) when, over those epochs,

* the latency p99 is under :data:`LIMIT_FACTOR` (2) times the epoch length, and
* the backlog does not grow: the median latency of the last third of the epochs is at most
  :data:`TREND_FACTOR` (half) an epoch above that of the first third (a pipeline a little
  slower than its input falls behind steadily, and can stay under the p99 limit for a
  minute).

A run stops early once its p99 cannot come back under the limit whatever the epochs left do
(:func:`hopeless`): an overloaded point costs a few epochs, not minutes of backlog.

Rates (:func:`next_rate`): a system climbs the ladder (``--sweep-rates``) until its first
failed rate, then tries ``--sweep-bisect`` geometric midpoints between its highest sustained
rate and its lowest failed one (rounded to two significant digits). A failed rate is run
again (``--sweep-retries`` times, default once) before it counts, and its last run decides:
one spike -- a cold start, a collection, a neighbour on the machine -- fails a minute's p99,
and a failed run is short (it stops early). Its capacity (:func:`capacity`) is the highest
sustained rate below the lowest failed one: ``>= r`` when it sustained every rate tried,
``< r`` when it failed the first.

Outputs under ``--out``: ``sweep.json`` (settings and every point), ``sweep.md`` (the
capacities side by side and every point) and ``sweep.png`` (p99 and p50 latency against the
rate, one panel per query, the limit drawn; skipped with a note without matplotlib).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

from report import pct

#: A rate is sustained while the latency p99 is under this many epoch lengths.
LIMIT_FACTOR = 2.0
#: ... and the last third's median latency at most this many epoch lengths over the first's.
TREND_FACTOR = 0.5
#: Native Spark's run; the other systems are megaphone's steady runs (``steady``, or
#: ``steady-per-key``).
NATIVE = "native"


@dataclass(frozen=True)
class Verdict:
    """Whether one run sustained its rate, and the figures that decided it (seconds)."""

    p50: float
    p99: float
    growth_s: float
    sustained: bool
    reason: str


@dataclass(frozen=True)
class Point:
    """One run of the sweep: a system (``steady``/``native``) on a query at a rate."""

    query: str
    system: str
    rate: float
    epochs: int
    expected: int
    p50: float
    p99: float
    growth_s: float
    sustained: bool
    reason: str
    check: str
    took_s: float


def judge(latencies: Sequence[float], interval: float, expected: int) -> Verdict:
    """The verdict on a run's open-loop epoch latencies (in epoch order) for epochs of
    ``interval`` seconds; a run with fewer than ``expected`` epochs stopped early and failed."""
    if not latencies:
        return Verdict(math.nan, math.nan, math.nan, False, "no epochs")
    third = max(1, len(latencies) // 3)
    growth = median(latencies[-third:]) - median(latencies[:third])
    p50, p99 = pct(latencies, 50), pct(latencies, 99)
    limit = LIMIT_FACTOR * interval
    reasons = []
    if p99 >= limit:
        reasons.append(f"p99 {p99:.2f} s >= {limit:g} s")
    if growth > TREND_FACTOR * interval:
        reasons.append(f"falling behind: +{growth:.2f} s from the first third to the last")
    if len(latencies) < expected:
        reasons.append(f"stopped after {len(latencies)} of {expected} epochs")
    return Verdict(p50, p99, growth, not reasons, "; ".join(reasons) or "sustained")


def hopeless(latencies: Sequence[float], expected: int, interval: float) -> bool:
    """Whether a run's p99 stays at or over the limit however fast its remaining epochs
    (``expected`` in all) are: it does even if they took no time at all."""
    rest = max(0, expected - len(latencies))
    return bool(latencies) and pct([*latencies, *[0.0] * rest], 99) >= LIMIT_FACTOR * interval


def nice(rate: float) -> float:
    """``rate`` rounded to two significant digits (a midpoint's label)."""
    if rate <= 0:
        return rate
    digits = 1 - math.floor(math.log10(rate))
    return float(round(rate, digits))


def _bracket(tried: Sequence[tuple[float, bool]]) -> tuple[float | None, float | None]:
    """The highest sustained rate below the lowest failed one, and that failed one (a rate
    run more than once counts as its last run)."""
    last = dict(tried)
    hi = min((r for r, ok in last.items() if not ok), default=None)
    lo = max((r for r, ok in last.items() if ok and (hi is None or r < hi)), default=None)
    return lo, hi


def next_rate(ladder: Sequence[float], tried: Sequence[tuple[float, bool]], bisect: int,
              retries: int = 1) -> float | None:
    """The next rate for a system that has tried ``tried`` (rate, sustained) in order, or None
    when it is done: a failed rate again, up to ``retries`` times; the ladder's next rung
    until a rate fails; then up to ``bisect`` geometric midpoints between the bracket
    (:func:`_bracket`); none if the first rung failed."""
    if tried and not tried[-1][1] and sum(r == tried[-1][0] for r, _ in tried) <= retries:
        return tried[-1][0]
    lo, hi = _bracket(tried)
    done = {r for r, _ in tried}
    if hi is None:
        return next((r for r in ladder if r not in done), None)
    if lo is None or sum(r not in ladder for r in done) >= bisect:
        return None
    mid = nice(math.sqrt(lo * hi))
    return mid if lo < mid < hi and mid not in done else None


def climb(ladder: Sequence[float], bisect: int, run: Callable[[float], Point],
          retries: int = 1) -> list[Point]:
    """One system's points: ``run`` at each rate :func:`next_rate` gives, in order."""
    points: list[Point] = []
    while (rate := next_rate(ladder, [(p.rate, p.sustained) for p in points], bisect,
                             retries)) is not None:
        points.append(run(rate))
    return points


def capacity(points: Sequence[Point]) -> tuple[float, float]:
    """A system's capacity as an interval of rates: ``(r, r)`` for the highest sustained rate
    below a failed one, ``(r, inf)`` when every rate tried was sustained, ``(0, r)`` when the
    lowest (``r``) failed; ``(nan, nan)`` without points."""
    lo, hi = _bracket([(p.rate, p.sustained) for p in points])
    if lo is None:
        return (0.0, hi) if hi is not None else (math.nan, math.nan)
    return (lo, lo) if hi is not None else (lo, math.inf)


def fmt_capacity(cap: tuple[float, float]) -> str:
    """``32,000``, ``>= 200,000``, ``< 10,000`` or ``-``."""
    lo, hi = cap
    if math.isnan(lo):
        return "-"
    if math.isinf(hi):
        return f">= {lo:,.0f}"
    return f"< {hi:,.0f}" if lo == 0 else f"{lo:,.0f}"


def fmt_ratio(num: tuple[float, float], den: tuple[float, float]) -> str:
    """Capacity ``num`` over ``den``: ``1.60x``, or a bound (``>= 2.00x``, ``<= 0.50x``) when
    one side is one, ``-`` when nothing follows."""
    if any(math.isnan(v) for v in (*num, *den)):
        return "-"
    lo = num[0] / den[1] if den[1] > 0 else math.nan
    hi = num[1] / den[0] if den[0] > 0 else math.inf
    if lo == hi:
        return f"{lo:.2f}x"
    if lo > 0 and math.isinf(hi):
        return f">= {lo:.2f}x"
    if lo == 0 and math.isfinite(hi):
        return f"<= {hi:.2f}x"
    return "-"


def by_system(points: Sequence[Point], query: str) -> dict[str, list[Point]]:
    """A query's points per system, in the order the systems ran."""
    out: dict[str, list[Point]] = {}
    for p in points:
        if p.query == query:
            out.setdefault(p.system, []).append(p)
    return out


def capacity_table(points: Sequence[Point]) -> str:
    """Per query: every system's capacity (events/s) and each megaphone run's over native's."""
    systems = list(dict.fromkeys(p.system for p in points))
    mega = [s for s in systems if s != NATIVE]
    lines = ["| query | " + " | ".join(f"{s} max sustained events/s" for s in systems)
             + "".join(f" | {s} / native" for s in mega) + " |",
             "|---|" + "---:|" * (len(systems) + len(mega))]
    for query in dict.fromkeys(p.query for p in points):
        caps = {s: capacity(pts) for s, pts in by_system(points, query).items()}
        none = (math.nan, math.nan)
        lines.append(f"| {query.upper()} | "
                     + " | ".join(fmt_capacity(caps.get(s, none)) for s in systems)
                     + "".join(f" | {fmt_ratio(caps.get(s, none), caps.get(NATIVE, none))}"
                               for s in mega) + " |")
    return "\n".join(lines)


def points_table(points: Sequence[Point]) -> str:
    """Every point in the order it ran."""
    lines = ["| query | system | events/s | epochs | p50 ms | p99 ms | trend ms | sustained "
             "| check | took s |", "|---|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for p in points:
        verdict = "yes" if p.sustained else f"no: {p.reason}"
        lines.append(f"| {p.query.upper()} | {p.system} | {p.rate:,.0f} | {p.epochs} "
                     f"| {p.p50 * 1000:,.0f} | {p.p99 * 1000:,.0f} | {p.growth_s * 1000:+,.0f} "
                     f"| {verdict} | {p.check} | {p.took_s:.0f} |")
    return "\n".join(lines)


def plot_sweep(path: Path, points: Sequence[Point], interval: float) -> str | None:
    """p99 (solid) and p50 (dashed) latency against the rate, one panel per query, one colour
    per system, failed rates hollow, the limit dotted; a rate run more than once shows its
    last (deciding) run. Returns a note instead when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return "no plot: matplotlib is not installed"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    queries = list(dict.fromkeys(p.query for p in points))
    fig, axes = plt.subplots(1, len(queries), figsize=(4.2 * len(queries) + 0.6, 3.8),
                             squeeze=False, sharey=True)
    colors = dict(zip(dict.fromkeys(p.system for p in points),
                      ("tab:blue", "tab:orange", "tab:green", "tab:purple"), strict=False))
    for ax, query in zip(axes[0], queries, strict=True):
        for system, runs in by_system(points, query).items():
            pts = sorted({p.rate: p for p in runs}.values(), key=lambda p: p.rate)
            color = colors.get(system, "tab:gray")
            xs = [p.rate for p in pts]
            ax.plot(xs, [p.p99 for p in pts], color=color, label=f"{system} p99")
            ax.plot(xs, [p.p50 for p in pts], color=color, linestyle="--", linewidth=0.9,
                    label=f"{system} p50")
            for p in pts:
                ax.plot(p.rate, p.p99, marker="o", color=color,
                        markerfacecolor=color if p.sustained else "white")
        ax.axhline(LIMIT_FACTOR * interval, color="tab:red", linestyle=":", linewidth=1.2,
                   label=f"{LIMIT_FACTOR:g}x epoch ({LIMIT_FACTOR * interval:g} s)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # 1-2-5 steps, plain numbers
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10
                                                   else f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_title(query.upper(), fontsize=10)
        ax.set_xlabel("events/s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].set_ylabel("latency s (hollow: not sustained)")
    axes[0, -1].legend(fontsize=7)
    fig.suptitle("NEXMark capacity: latency against the input rate", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_sweep(out: Path, points: Sequence[Point], interval: float,
                info: dict[str, Any]) -> str:
    """``sweep.json``, ``sweep.png`` and ``sweep.md`` of the points so far; the markdown."""
    note = plot_sweep(out / "sweep.png", points, interval) if points else "no points"
    capacities = {q: {s: dict(zip(("low", "high"), capacity(pts), strict=True))
                      for s, pts in by_system(points, q).items()}
                  for q in dict.fromkeys(p.query for p in points)}
    (out / "sweep.json").write_text(json.dumps(
        {**info, "points": [asdict(p) for p in points], "capacity": capacities},
        indent=1, default=str))
    text = "\n".join([
        "# NEXMark capacity sweep", "", f"Command: `{info['command']}`", "",
        f"Machine: {info['machine']}", "", f"Setup: {info['setup']}", "",
        f"Sustained: latency p99 over the open-loop epochs under {LIMIT_FACTOR:g}x the epoch "
        f"({LIMIT_FACTOR * interval:g} s) and the last third's median latency at most "
        f"{TREND_FACTOR:g} epoch over the first third's (trend); a run stops early once its "
        "p99 cannot come back under the limit.", "",
        capacity_table(points), "",
        note or "![sweep](sweep.png)", "", "Every point:", "", points_table(points), ""])
    (out / "sweep.md").write_text(text)
    return text
