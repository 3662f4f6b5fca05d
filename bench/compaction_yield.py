"""Epoch work while a store compacts: RocksDB's compactions at equal priority or yielding.

A sender that dropped half of its bins (one range deletion each) makes RocksDB rewrite the
whole store at once (docs/transfer.md, "The senders' compaction"). This benchmark reproduces
that on one store and measures what it costs work beside it. Each variant runs in its own
process (the priority is process-wide):

- ``equal``: compactions at the priority of everything else (RocksDB's default);
- ``yield``: :func:`~megaphone.state_backends.rocksdb_tuning.compactions_yield` and
  :func:`~megaphone.state_backends.rocksdb_tuning.compaction_threads_idle` (the idle I/O class
  and Linux's ``SCHED_IDLE``, else nice 19), as every megaphone store runs.

A variant loads ``--keys`` keys into ``--bins`` bins as one ingested table file, starts two
"epoch" processes (two cores' worth of Spark tasks) that each do a fixed piece of CPU work
every ``--period`` seconds, deletes every other bin by range and flushes, and waits for the
compaction RocksDB starts. It reports the epochs' work time before and during the compaction
and the compaction's wall time. Variants alternate for ``--runs`` rounds; the summary gives
medians and the ratio yield / equal.

    python bench/compaction_yield.py --keys 2e7 --runs 3 --out bench/results/compaction-yield
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from rocksdict import Rdict, SstFileWriter, WriteBatch

import megaphone.state_backends.rocksdb_tuning as tuning
from megaphone.state_backends.encoding import bin_prefix, bin_range

VARIANTS = ("equal", "yield")
WORK_ROWS = 8_000_000  # one epoch's piece of CPU work: numpy sorts of this many floats


def epoch_loop(period: float, rows: int, stop: mp.Event, out: mp.Queue) -> None:
    """Every ``period`` seconds, time one piece of work; put (start, seconds) pairs on ``out``."""
    rng = np.random.default_rng()
    data = rng.random(rows)
    times = []
    while not stop.is_set():
        start = time.time()
        np.sort(data)
        np.sort(data[::-1])
        times.append((start, time.time() - start))
        time.sleep(max(0.0, period - (time.time() - start)))
    out.put(times)


def load(path: str, keys: int, bins: int) -> None:
    """``keys`` keys spread over ``bins`` bins (4-byte bin prefix, 8-byte key), one SST file,
    ingested into a new store: the store as a bulk load leaves it, every key in the last level."""
    db = Rdict(path, options=tuning.db_options())
    sst = str(Path(path).parent / "load.sst")
    writer = SstFileWriter(options=tuning.db_options())
    writer.open(sst)
    per_bin = keys // bins
    value = b"\x01"
    for b in tqdm(range(bins), desc="load", unit="bin", leave=False):
        prefix = bin_prefix(b)
        for k in range(per_bin):
            writer[prefix + k.to_bytes(8, "big")] = value
    writer.finish()
    db.ingest_external_file([sst])
    db.close()


def run_variant(variant: str, keys: int, bins: int, period: float, rows: int
                ) -> dict[str, float]:
    """One variant in this process: load, start the epochs, drop every other bin, compact."""
    if variant == "equal":
        tuning._COMPACTIONS_YIELD = True  # db_options() then leaves RocksDB's priorities alone
    root = tempfile.mkdtemp(prefix="compaction-yield-")
    try:
        path = str(Path(root) / "db")
        load(path, keys, bins)
        db = Rdict(path, options=tuning.db_options())
        if variant == "yield":
            tuning.compaction_threads_idle()  # as a store's open does
        stop, out = mp.Event(), mp.Queue()
        epochs = [mp.Process(target=epoch_loop, args=(period, rows, stop, out))
                  for _ in range(2)]
        for p in epochs:
            p.start()
        time.sleep(1.0 + 10 * period)  # the processes start, then epochs before the compaction
        started = time.time()
        wb = WriteBatch(raw_mode=True)
        for b in range(0, bins, 2):  # every other bin, as the billion-key half-out sender
            wb.delete_range(*bin_range(b))
        db.write(wb)
        for round_ in range(4):  # enough level-0 files to start a compaction
            for k in range(0, bins, 7):
                db[bin_prefix(k) + round_.to_bytes(8, "big")] = b"\x02"
            db.flush()
        time.sleep(0.5)
        while (db.property_int_value("rocksdb.num-running-compactions")
               or db.property_int_value("rocksdb.compaction-pending")):
            time.sleep(0.1)
        finished = time.time()
        keys_after = db.property_int_value("rocksdb.estimate-num-keys") or 0
        time.sleep(5 * period)  # epochs after it
        stop.set()
        times = [t for _ in epochs for t in out.get()]
        for p in epochs:
            p.join()
        db.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    before = [s for t, s in times if t + s < started]
    during = sorted(s for t, s in times if started <= t < finished)
    return {"compaction_s": finished - started, "keys_after": keys_after,
            "before_p50_ms": 1e3 * statistics.median(before),
            "during_p50_ms": 1e3 * statistics.median(during),
            "during_p99_ms": 1e3 * during[min(len(during) - 1, int(0.99 * len(during)))],
            "during_max_ms": 1e3 * during[-1], "epochs_during": len(during)}


def main(argv: list[str] | None = None) -> int:
    """Alternate the variants for ``--runs`` rounds, each in a new process; print medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=float, default=2e7)
    p.add_argument("--bins", type=int, default=1024)
    p.add_argument("--period", type=float, default=0.5, help="seconds between epochs' work")
    p.add_argument("--work-rows", type=int, default=WORK_ROWS,
                   help="floats an epoch's work sorts (twice)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one child run
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args.variant, int(args.keys), args.bins, args.period,
                                     args.work_rows)))
        return 0
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for _ in tqdm(range(args.runs), desc="rounds"):
        for v in VARIANTS:
            child = subprocess.run(
                [sys.executable, __file__, "--variant", v, "--keys", str(args.keys),
                 "--bins", str(args.bins), "--period", str(args.period),
                 "--work-rows", str(args.work_rows)], capture_output=True, text=True)
            if child.returncode:
                raise RuntimeError(f"variant {v} failed:\n{child.stderr[-2000:]}")
            results[v].append(json.loads(child.stdout.strip().splitlines()[-1]))
    medians = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for v, rs in results.items()}
    print(f"{int(args.keys):,} keys, {args.bins} bins, every other bin dropped; epochs of "
          f"{args.work_rows:,}-row sorts every {args.period} s in 2 processes; medians of "
          f"{args.runs} runs")
    print("| variant | compaction s | epoch work before, p50 ms | during: p50 ms | p99 ms "
          "| max ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for v, m in medians.items():
        print(f"| {v} | {m['compaction_s']:.1f} | {m['before_p50_ms']:.0f} | "
              f"{m['during_p50_ms']:.0f} | {m['during_p99_ms']:.0f} | {m['during_max_ms']:.0f} |")
    y, e = medians["yield"], medians["equal"]
    print(f"yield / equal: epoch work during the compaction p50 "
          f"{y['during_p50_ms'] / e['during_p50_ms']:.2f}x, p99 "
          f"{y['during_p99_ms'] / e['during_p99_ms']:.2f}x; compaction "
          f"{y['compaction_s'] / e['compaction_s']:.2f}x as long")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compaction-yield.json").write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                        "runs": results, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
