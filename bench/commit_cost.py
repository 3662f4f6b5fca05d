"""Cost of an epoch's commit: the undo record, the epoch marker and commit.json.

An epoch of ``--touched`` random existing keys is applied to one RocksDB worker holding
``--keys`` keys, once with the commit metadata megaphone writes (marker, outputs, undo record)
and once with plain puts, and ``commit.json`` is written (fsynced) as the driver does. Also
times the per-bin load bookkeeping every epoch carries: the worker counts its records per bin
and ships the non-zero counts in list columns of its report row, the driver folds them into
the smoothed ``Pipeline.bin_load()``. Prints the medians of ``--epochs`` epochs in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from megaphone.migrator.epoch.run import LOAD_SMOOTHING
from megaphone.migrator.statedir.commit import Commit
from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.task.state_operator import bin_counts
from megaphone.routing.bins import bin_of
from megaphone.routing.fingerprint import Fingerprint
from megaphone.state_backends import open_backend
from megaphone.state_backends.encoding import encode_keys

BINS = 4096


def main() -> None:
    """Load the state, then time epochs with and without the commit metadata."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--keys", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--touched", type=int, default=10_000, help="keys written per epoch")
    p.add_argument("--epochs", type=int, default=15)
    args = p.parse_args()
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        db = open_backend("rocksdb", Path(tmp) / "w", "int64", BINS)
        one = msgpack.packb(1)
        for start in tqdm(range(0, args.keys, 100_000), desc="loading", unit_scale=100_000):
            keys = np.arange(start, min(start + 100_000, args.keys), dtype=np.int64)
            raw = encode_keys(bin_of(keys, BINS), keys, "int64")
            db.write_raw(raw, [one] * len(raw), [None] * len(raw))
        state = StateDir.create(Path(tmp) / "s", Fingerprint("bench", BINS, "int64"), 2, {})
        plain, full, commit, load = [], [], [], []
        bin_load = np.zeros(BINS)
        for epoch in range(args.epochs):
            keys = rng.choice(args.keys, args.touched, replace=False).astype(np.int64)
            bins = bin_of(keys, BINS)  # the worker gets these from the shuffle (``_bin``)
            raw = encode_keys(bins, keys, "int64")
            old = db.get_raw(raw)
            new = [msgpack.packb(msgpack.unpackb(v) + 1) for v in old]
            t0 = time.perf_counter()
            db.write_raw(raw, new, old)
            t1 = time.perf_counter()
            undo = msgpack.packb({"epoch": epoch, "bins": [], "keys": raw, "old": old})
            db.write_raw(raw, new, new, meta={"epoch": struct.pack(">q", epoch),
                                              "outputs": b"x" * (16 * args.touched),
                                              "undo": undo})
            t2 = time.perf_counter()
            state.write_commit(Commit(epoch=epoch, state_version=0))
            t3 = time.perf_counter()
            # Per-bin load, as apply_worker and PipelineEpochs._track_load do it.
            row = [pa.array([c], pa.list_(pa.int32())) for c in bin_counts(bins)]
            hot, counts = (pc.list_flatten(c).to_numpy() for c in row)
            epoch_counts = np.bincount(hot, weights=counts, minlength=BINS)
            bin_load *= 1.0 - LOAD_SMOOTHING
            bin_load += LOAD_SMOOTHING * epoch_counts
            t4 = time.perf_counter()
            load.append((t4 - t3) * 1e3)
            plain.append((t1 - t0) * 1e3)
            full.append((t2 - t1) * 1e3)
            commit.append((t3 - t2) * 1e3)
        db.close()
    mp, mf, mc, ml = (statistics.median(x) for x in (plain, full, commit, load))
    print(f"keys {args.keys:,}, {args.touched:,} keys written per epoch, median of {args.epochs}")
    print(f"  worker write, plain puts          {mp:8.1f} ms")
    print(f"  worker write, + marker/outputs/undo {mf:6.1f} ms "
          f"(commit metadata {mf - mp:+.1f} ms)")
    print(f"  commit.json (fsync + rename)      {mc:8.1f} ms")
    print(f"  commit cost per epoch             {mf - mp + mc:8.1f} ms")
    print(f"  per-bin load bookkeeping          {ml:8.1f} ms ({args.touched:,} records, "
          f"{BINS} bins)")


if __name__ == "__main__":
    main()
