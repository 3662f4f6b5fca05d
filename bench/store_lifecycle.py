"""How a worker's store should live: opened per epoch, kept open in-process, or in the service.

One RocksDB worker holding ``--keys`` keys (count 1 each, bulk-loaded through SST ingestion,
as ``bench/load.py`` does) runs ``--epochs`` epochs; each epoch reads ``--touched`` random
existing keys, adds one and commits them with the epoch's marker, outputs and undo record
(:meth:`WorkerStore.commit`). Three lifecycles, each on its own copy of the same loaded state,
the same epochs, run one after another:

* ``per-epoch`` -- open the store, apply, commit, close (the flush in ``close`` puts a small L0
  file of keys from every bin into the DB each epoch: megaphone before the store service);
* ``in-process`` -- one store kept open in this process across epochs (the floor: no hop);
* ``service`` -- the store kept open in the store service, reached over its Unix socket as an
  epoch's task does (:class:`RemoteStore`: ``begin``, ``read``, ``commit``).

Prints per lifecycle the median, p99 and max epoch time, the write stalls, the L0 files and
pending compaction bytes at the end, and the ratios to ``per-epoch``.

    python bench/store_lifecycle.py --keys 1e7 --epochs 300
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from load import raw_batch

from megaphone.routing.bins import bin_of
from megaphone.state_backends.encoding import encode_keys
from megaphone.state_backends.remote import RemoteStore, release_stores
from megaphone.state_backends.worker_store import WorkerStore

BINS = 4096
LOAD_BATCH = 1_000_000


def load(path: Path, keys: int) -> None:
    """``keys`` keys ``0 .. keys-1`` with count 1, ingested as sorted SST files."""
    with WorkerStore.open("rocksdb", path, "int64", BINS) as store:
        batches = []
        for lo in range(0, keys, LOAD_BATCH):
            k = np.arange(lo, min(lo + LOAD_BATCH, keys), dtype=np.int64)
            b = bin_of(k, BINS).astype(np.int64)
            order = np.lexsort((k, b))
            batches.append((b[order], k[order]))
        allb = np.concatenate([b for b, _ in batches])
        allk = np.concatenate([k for _, k in batches])
        order = np.lexsort((allk, allb))
        allb, allk = allb[order], allk[order]
        chunks = (raw_batch(allb[i:i + LOAD_BATCH], allk[i:i + LOAD_BATCH])
                  for i in range(0, keys, LOAD_BATCH))
        store.backend.import_sst(chunks)


def epoch_work(rng: np.random.Generator, keys: int, touched: int) -> list[bytes]:
    """The raw keys one epoch writes (random existing keys)."""
    k = rng.choice(keys, touched, replace=False).astype(np.int64)
    return list(encode_keys(bin_of(k, BINS), k, "int64"))


def apply(store: Any, epoch: int, raw: list[bytes]) -> float:
    """One epoch on a WorkerStore or a RemoteStore: read, add one, commit; returns the
    seconds its writes were stalled by flushes and compactions."""
    remote = isinstance(store, RemoteStore)
    if remote:
        store.begin(epoch)
    else:
        store.check_can_apply(epoch)
    old = store.read(raw)
    new = [msgpack.packb(msgpack.unpackb(v) + 1) for v in old]
    health = store.commit(epoch, raw, new, old, b"x" * (16 * len(raw)), [])
    return health["stall_s"] if remote else store.health()["stall_s"]


def run(name: str, path: Path, local: Path, works: list[list[bytes]],
        progress: bool) -> dict[str, Any]:
    """Time every epoch of one lifecycle; return its figures."""
    times: list[float] = []
    stall = 0.0
    kept: Any = None
    if name == "in-process":
        kept = WorkerStore.open("rocksdb", path, "int64", BINS)
    elif name == "service":
        kept = RemoteStore(str(local), str(path), "rocksdb", "int64", BINS, 0)
    for epoch, raw in enumerate(tqdm(works, desc=name, disable=not progress, leave=False)):
        started = time.perf_counter()
        if kept is None:  # open, apply, commit, close (the close flushes the memtable)
            with WorkerStore.open("rocksdb", path, "int64", BINS) as store:
                stall += apply(store, epoch, raw)
        else:
            stall += apply(kept, epoch, raw)
        times.append(time.perf_counter() - started)
    if name == "in-process":
        health = kept.health()
        kept.close()
    else:
        if name == "service":
            release_stores(str(local), str(path.parent))
        with WorkerStore.open("rocksdb", path, "int64", BINS, read_only=True) as store:
            health = store.health()
    times.sort()
    return {"lifecycle": name, "median_ms": statistics.median(times) * 1e3,
            "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3,
            "max_ms": times[-1] * 1e3, "total_s": sum(times), "stall_s": stall,
            "l0_files": health["l0_files"],
            "pending_compaction_bytes": health["pending_compaction_bytes"]}


def main(argv: list[str] | None = None) -> None:
    """Load once, copy per lifecycle, run the same epochs on each, print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=lambda s: int(float(s)), default=10_000_000)
    p.add_argument("--touched", type=int, default=10_000, help="keys written per epoch")
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    rng = np.random.default_rng(7)
    works = [epoch_work(rng, args.keys, args.touched) for _ in range(args.epochs)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "template"
        started = time.perf_counter()
        load(template, args.keys)
        print(f"loaded {args.keys:,} keys in {time.perf_counter() - started:.1f} s")
        for name in ("per-epoch", "in-process", "service"):
            path = Path(tmp) / name / "w00000"
            shutil.copytree(template, path)
            results.append(run(name, path, Path(tmp) / "local", works, not args.no_progress))
            shutil.rmtree(path)
    base = results[0]["median_ms"]
    print(f"\n{args.keys:,} keys, {args.touched:,} keys written per epoch, {args.epochs} epochs")
    print("| lifecycle | median ms | p99 ms | max ms | total s | stalls s | L0 files at end "
          "| pending compaction | median vs per-epoch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['lifecycle']} | {r['median_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['max_ms']:.1f} | {r['total_s']:.1f} | {r['stall_s']:.2f} | {r['l0_files']} | "
              f"{r['pending_compaction_bytes'] / 2**20:.0f} MiB | "
              f"{r['median_ms'] / base:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
