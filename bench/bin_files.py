"""Where shipping a bin as a file beats shipping it as rows: the crossover behind FILE_MIN_BYTES.

For bins of growing size, one RocksDB store exports a bin and another installs it, both ways,
alternating, several times each (the median is printed):

* **rows**: ``export_bins`` (the row chunks a live export ships), then ``import_bins``
  (``"auto"``: chunk puts, or SST ingestion for a large stream);
* **files**: ``write_bin_file`` (one SST file), its bytes copied into the receiver's transfer
  directory (what the shuffle and the receiving task do), then ``ingest_bin_files``.

The receiver is a store of 1e6 keys in other bins (a live receiver is never empty), whose
memtable holds recent writes, as between two epochs.

    python bench/bin_files.py                  # about a minute
    python bench/bin_files.py --json bench/results/bin-files.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from megaphone.state_backends import open_backend
from megaphone.state_backends.bin_files import (
    FILE_MIN_BYTES,
    FileAssembler,
    file_parts,
    transfer_dir,
)

BINS = 4096
SIZES = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)  # keys per bin
PART_BYTES = 4 << 20


def fill(store, bins: np.ndarray, keys_per_bin: int, start: int = 0) -> None:
    """``keys_per_bin`` int keys with count 1 in each of ``bins``."""
    for b in bins:
        keys = np.arange(start, start + keys_per_bin, dtype=np.int64)
        store.put_many(np.full(keys_per_bin, b), keys, [1] * keys_per_bin)


def one_move(sender, receiver, b: int, how: str) -> float:
    """Seconds to move bin ``b`` from ``sender`` into ``receiver`` by ``how``; undone after."""
    started = time.perf_counter()
    if how == "rows":
        receiver.import_bins(sender.export_bins([b]), method="auto")
    else:
        made = sender.write_bin_file(b)
        assembler = FileAssembler(transfer_dir(receiver.path, "in"))
        for offset, data in file_parts(made.path, PART_BYTES):
            assembler.add(made, offset, data)
        made_path = made.path
        receiver.ingest_bin_files(assembler.complete())
        Path(made_path).unlink()
    took = time.perf_counter() - started
    receiver.drop_bins([b])
    receiver.put_many([0], [b], [1])  # a write in the memtable, as an epoch leaves one
    return took


def main(argv: list[str] | None = None) -> int:
    """Print (and optionally save) the per-bin time of both paths for each bin size."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sender = open_backend("rocksdb", Path(tmp) / "sender", "int64", BINS)
        receiver = open_backend("rocksdb", Path(tmp) / "receiver", "int64", BINS)
        fill(receiver, np.arange(2, 2 + 1000), 1000)
        sender_bins = {}
        for i, n in enumerate(tqdm(SIZES, desc="loading")):
            b = 2000 + i
            fill(sender, np.array([b]), n)
            sender_bins[n] = b
        for n in tqdm(SIZES, desc="moving"):
            b = sender_bins[n]
            times: dict[str, list[float]] = {"rows": [], "files": []}
            for _ in range(args.reps):
                for how in ("rows", "files"):
                    times[how].append(one_move(sender, receiver, b, how))
            nbytes = sender.bin_stats()[b].bytes
            rows.append({"keys": n, "bytes": nbytes,
                         "rows_ms": statistics.median(times["rows"]) * 1e3,
                         "files_ms": statistics.median(times["files"]) * 1e3})
        sender.close()
        receiver.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"| keys per bin | bytes | rows ms | files ms | files / rows |  (FILE_MIN_BYTES = "
          f"{FILE_MIN_BYTES:,})")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['keys']:,} | {r['bytes']:,} | {r['rows_ms']:.2f} | {r['files_ms']:.2f} | "
              f"{r['files_ms'] / r['rows_ms']:.2f}x |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
