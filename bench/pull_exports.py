"""A moving epoch with the receivers pulling their bins against the export tasks, paired.

Two pipelines in one process (keyed count, RocksDB, ``--bins`` bins, 4 workers, ``local[2]``,
no checkpoint location) are loaded alike; each then moves ``--moves`` bins from workers 2 and
3 to 0 and 1, ``--per-epoch`` bins an epoch, while ``--records`` records arrive per epoch. One
pipeline's receivers pull their bins (docs/transfer.md, "Receivers that pull"), the other's
epochs run export tasks as on a cluster. The two alternate epoch by epoch, each first every
other epoch; prints the median epoch of each (quiet epochs before the plan, then moving
epochs) and the ratio.

    python bench/pull_exports.py --moves 40 --per-epoch 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from epoch_floor import epoch_frame

import megaphone
from megaphone.migrator.epoch import run as epoch_run
from megaphone.spark import spark_session

PULL = epoch_run.receivers_pull


def main() -> None:
    """Parse the options, run both pipelines epoch by epoch, print the medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bins", type=int, default=4096)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--moves", type=int, default=40)
    p.add_argument("--per-epoch", type=int, default=2)
    p.add_argument("--quiet", type=int, default=10)
    args = p.parse_args()
    spark = spark_session("local[2]", "pull-exports")
    tmp = tempfile.mkdtemp(prefix="pull-exports-")
    pipes = {name: megaphone.Pipeline(spark, f"{tmp}/{name}", key="key", update="count",
                                      workers=4, num_bins=args.bins, backend="rocksdb")
             for name in ("pull", "export")}
    times: dict[tuple[str, str], list[float]] = {}

    def epoch(name: str, e: int, n: int, phase: str) -> None:
        epoch_run.receivers_pull = PULL if name == "pull" else (lambda *a: False)
        t0 = time.perf_counter()
        pipes[name].process_arrow(epoch_frame(spark, e, n, args.keys))
        times.setdefault((name, phase), []).append(time.perf_counter() - t0)

    for e in range(4):  # load: every key once
        for name in pipes:
            epoch(name, e, args.keys // 4, "load")
    order = list(pipes)
    for e in range(4, 4 + args.quiet):
        for name in order if e % 2 else order[::-1]:  # each goes first every other epoch
            epoch(name, e, args.records, "quiet")
    owners = pipes["pull"].routing.owners()
    moves = [megaphone.Move(int(b), int(owners[b]), int(owners[b]) - 2)
             for w in (2, 3) for b in np.flatnonzero(owners == w)[:args.moves // 2]]
    steps = [moves[i:i + args.per_epoch] for i in range(0, len(moves), args.per_epoch)]
    for pipe in pipes.values():
        pipe.migrate(megaphone.MigrationPlan.from_moves(pipe.routing, steps))
    e = 4 + args.quiet
    for _ in tqdm(steps, desc="moving epochs", leave=False):
        for name in order if e % 2 else order[::-1]:
            epoch(name, e, args.records, "moving")
        e += 1
    for name, pipe in pipes.items():
        moved = sum(m["bins_moved"] for m in pipe.metrics())
        print(f"{name}: {moved} bins moved, {sum(1 for _ in pipe.state().collect())} keys")
    for phase in ("quiet", "moving"):
        med = {n: statistics.median(times[(n, phase)]) for n in pipes}
        print(f"{phase}: pull {med['pull'] * 1000:.0f} ms, export tasks "
              f"{med['export'] * 1000:.0f} ms, pull / export {med['pull'] / med['export']:.2f}x "
              f"({len(times[('pull', phase)])} epochs each)")
    for pipe in pipes.values():
        pipe.close()
    epoch_run.receivers_pull = PULL


if __name__ == "__main__":
    main()
