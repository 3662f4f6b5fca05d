"""Two soak runs side by side: epoch durations for the same work, restores, driver recoveries.

A soak's latency figures depend on when its kills' backlogs drained, so two runs of the same
schedule differ by more than their code does. This compares what the runs did alike: the
median duration of the epochs that moved no bins, were not replays and were not a driver's
first (its warm-up, reported with the recoveries), grouped by workers and by records in (1,000,
3,000 and 10,000 records, within 10%); the worker restores; and each driver kill's start-up
(JVM and session, the probe of the Python workers) and backlog.

    MEGAPHONE_PLACEMENT=0 python bench/soak.py --minutes 12 --kill-every-s 240 --out A
    MEGAPHONE_PLACEMENT=1 python bench/soak.py --minutes 12 --kill-every-s 240 --out B
    python bench/soak_compare.py A B
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from bench.soak_driver import read_lines

BANDS = (1_000, 3_000, 10_000)


def durations(run: Path) -> dict[tuple[int, int], list[float]]:
    """Durations of run ``run``'s plain epochs by (workers, records band)."""
    out: dict[tuple[int, int], list[float]] = {}
    drivers: set[int] = set()
    for e in read_lines(run / "run" / "epochs.jsonl"):
        first, _ = e["pid"] not in drivers, drivers.add(e["pid"])
        band = next((b for b in BANDS if abs(e["records_in"] - b) <= b / 10), None)
        plain = not (e.get("bins_moved") or e.get("replayed")) and e.get("duration_s")
        if first or band is None or not plain:
            continue
        out.setdefault((e["workers"], band), []).append(e["duration_s"])
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the two runs' plain epoch durations, restores and driver recoveries."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path, nargs=2, help="two soak output directories (--out)")
    args = p.parse_args(argv)
    a, b = args.runs
    da, db = durations(a), durations(b)
    print(f"| workers | records | {a.name} median s (n) | {b.name} median s (n) | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for key in sorted(set(da) & set(db)):
        ma, mb = statistics.median(da[key]), statistics.median(db[key])
        print(f"| {key[0]} | {key[1]:,} | {ma:.2f} ({len(da[key])}) | {mb:.2f} "
              f"({len(db[key])}) | {mb / ma:.2f}x |")
    for run in (a, b):
        s = json.loads((run / "summary.json").read_text())
        outside = s["restores_outside_kills"]
        print(f"\n{run.name}: {s['workers_restored']} worker restores, {outside['restores']} in "
              f"{outside['epochs']} epochs outside the kills' recoveries")
        for d in s["driver_recoveries"]:
            print(f"  driver kill at {d['at_s']:.0f} s: JVM and session "
                  f"{d['pyspark_jvm_session']} s, probe {d['workers_probe']} s, first epoch "
                  f"{d['first_epoch_duration']} s, backlog {d['backlog']} s, recovered "
                  f"{d['recovered']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
