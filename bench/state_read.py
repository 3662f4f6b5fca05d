"""Reading a worker's whole state the way ``Pipeline.state()`` does, against the per-key path.

One RocksDB worker holds ``--keys`` int64 keys (4096 bins). Each run reads all of it into
Arrow ``(key, state)`` batches twice, side by side: the way ``pipe.state()`` reads it now
(export chunks, int keys and msgpack integers decoded with numpy, no Python object per key;
``megaphone.state_backends.kv_batches.state_rows``) and the way it read it before
(``backend.items()``, one decoded Python tuple per key, then ``pa.array``). States are counts
(msgpack integers) and, as a second case, float sums (no vectorized decoder: values go per
key in both paths, keys stay vectorized). Prints keys/s per path and the speed-up, medians of
``--repeats``.

    python bench/state_read.py --keys 2e6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megaphone.routing.bins import bin_of
from megaphone.state_backends import open_backend
from megaphone.state_backends.encoding import encode_keys, pack_values
from megaphone.state_backends.kv_batches import kv_columns, state_rows

BINS = 4096
#: Rows per Arrow batch of the per-key path (what the earlier reader used).
BATCH_ROWS = 65_536


def vectorized(db, schema: pa.Schema) -> int:
    """Read every bin through export chunks and the vectorized decoder; rows read."""
    rows = 0
    for chunk in db.export_bins(range(BINS)):
        k, v = kv_columns(chunk)
        rows += state_rows(schema, "int64", k, v, True).num_rows
    return rows


def per_key(db, schema: pa.Schema) -> int:
    """Read every bin through ``items()`` (a Python tuple per key); rows read."""
    rows, keys, values = 0, [], []

    def flush() -> int:
        batch = pa.RecordBatch.from_arrays([pa.array(keys, schema.field(0).type),
                                            pa.array(values, schema.field(1).type)],
                                           schema=schema)
        keys.clear()
        values.clear()
        return batch.num_rows

    for _, k, v in db.items(range(BINS)):
        keys.append(k)
        values.append(v)
        if len(keys) >= BATCH_ROWS:
            rows += flush()
    return rows + (flush() if keys else 0)


def main(argv: list[str] | None = None) -> int:
    """Load one worker per value kind, then time both readers on it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=lambda s: int(float(s)), default=2_000_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(f"# state_read: {args.keys:,} int64 keys, {BINS} bins, one RocksDB worker, "
          f"median of {args.repeats}")
    print("| states | path | seconds | keys/s | speed-up |")
    print("|---|---|---:|---:|---:|")
    for kind, value_type, make in (("int counts", pa.int64(), lambda k: (k % 1000) + 1),
                                   ("float sums", pa.float64(), lambda k: k * 0.5)):
        schema = pa.schema([("key", pa.int64()), ("state", value_type)])
        with tempfile.TemporaryDirectory() as tmp:
            db = open_backend("rocksdb", Path(tmp) / "w", "int64", BINS)
            for start in tqdm(range(0, args.keys, 200_000), desc=f"loading {kind}",
                              leave=False):
                keys = np.arange(start, min(start + 200_000, args.keys), dtype=np.int64)
                raw = encode_keys(bin_of(keys, BINS), keys, "int64")
                db.write_raw(raw, pack_values(make(keys).tolist()), [None] * len(raw))
            db.flush()
            times: dict[str, list[float]] = {"per key (before)": [], "vectorized (now)": []}
            for _ in range(args.repeats):
                for name, fn in (("per key (before)", per_key), ("vectorized (now)", vectorized)):
                    t0 = time.perf_counter()
                    rows = fn(db, schema)
                    times[name].append(time.perf_counter() - t0)
                    if rows != args.keys:
                        raise AssertionError(f"{name} read {rows} rows, expected {args.keys}")
            db.close()
        base = statistics.median(times["per key (before)"])
        for name, ts in times.items():
            s = statistics.median(ts)
            print(f"| {kind} | {name} | {s:.2f} | {args.keys / s / 1e3:,.0f} k | "
                  f"{base / s:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
