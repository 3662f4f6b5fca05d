"""A worker store's commits through one group of epochs: does an epoch late in a group cost
what an early one does?

A store inside a group keeps each earlier epoch's undo record and outputs until the driver
commits the group (docs/groups.md), so a retried task can replay them and a crash can roll
them back. Each epoch writes ``--keys`` keys (undo record: their old values) and outputs of
``12 * keys`` bytes; the run commits ``--epochs`` epochs of one group and prints the mean
commit time of the first four and of the last four, and the total, per backend.

    python bench/group_commits.py                    # 64 epochs of 20,000 keys, rocksdb and memory
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megaphone.routing.bins import bin_of
from megaphone.state_backends.encoding import encode_keys
from megaphone.state_backends.worker_store import WorkerStore

BINS = 64


def run(kind: str, keys: int, epochs: int) -> list[float]:
    """Seconds of each epoch's commit (with the next epoch's begin) through one group."""
    k = np.arange(keys, dtype=np.int64)
    raw = list(encode_keys(bin_of(k, BINS), k, "int64"))
    outputs = b"x" * (12 * keys)
    took = []
    with tempfile.TemporaryDirectory() as d, \
            WorkerStore.open(kind, f"{d}/w", "int64", BINS) as store:
        for epoch in tqdm(range(epochs), desc=kind, leave=False):
            old = store.read(raw)
            new = [msgpack.packb(epoch)] * keys
            t0 = time.perf_counter()
            store.commit(epoch, raw, new, old, outputs, [], "run", 0)
            store.check_can_apply(epoch + 1, group_start=0)
            took.append(time.perf_counter() - t0)
    return took


def main(argv: list[str] | None = None) -> int:
    """Print each backend's first/last commit times and the total."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--epochs", type=int, default=64)
    p.add_argument("--backends", default="rocksdb,memory")
    args = p.parse_args(argv)
    print(f"one group of {args.epochs} epochs, {args.keys:,} keys written per epoch")
    print("| backend | first 4 commits (ms, mean) | last 4 commits (ms, mean) | last / first "
          "| group total (s) |")
    print("|---|---:|---:|---:|---:|")
    for kind in args.backends.split(","):
        took = run(kind, args.keys, args.epochs)
        first, last = statistics.mean(took[:4]), statistics.mean(took[-4:])
        print(f"| {kind} | {first * 1e3:.1f} | {last * 1e3:.1f} | {last / first:.2f} | "
              f"{sum(took):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
