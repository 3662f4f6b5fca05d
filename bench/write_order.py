"""An epoch's write batch into a worker's RocksDB store, three ways: what ordering its writes
costs in Python and what it saves RocksDB.

A store of ``--keys`` random keys (bin prefix and 8 bytes, 60-byte values, as int64 keys of a
window's state) takes epochs of ``--writes`` writes: three quarters to existing keys, a quarter
new keys; one write in ``--delete-every`` a delete (fired timers, closed windows). Each epoch's
writes go into a ``WriteBatch`` three ways, in turn (the order rotating every epoch), and the
batch is written synced as a commit is:

* **unsorted** -- in the order they came;
* **pairs** -- ``sorted(zip(keys, values))``, the store's way until issue #35's last change;
* **indexes** -- indexes sorted by key, deletes first: the store's own
  ``write_in_key_order``, which ``RocksDBBackend._commit`` calls now.

Prints the median milliseconds of each way's Python (building the batch) and of the write.

    python bench/write_order.py --keys 300000 --writes 220000
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rocksdict import WriteBatch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megaphone.state_backends.rocksdb import _SYNCED, RocksDBBackend, write_in_key_order

WAYS = ("unsorted", "pairs", "indexes")


def unsorted(wb: WriteBatch, keys: list[bytes], values: list[bytes | None]) -> None:
    """The writes in the order they came."""
    for k, v in zip(keys, values, strict=True):
        if v is None:
            wb.delete(k)
        else:
            wb.put(k, v)


def pairs(wb: WriteBatch, keys: list[bytes], values: list[bytes | None]) -> None:
    """The (key, value) pairs sorted, then written in that order."""
    for k, v in sorted(zip(keys, values, strict=True)):
        if v is None:
            wb.delete(k)
        else:
            wb.put(k, v)


def main(argv: list[str] | None = None) -> int:
    """Fill a store, run the epochs, print the medians."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=300_000, help="keys in the store at the start")
    p.add_argument("--writes", type=int, default=220_000, help="writes per epoch")
    p.add_argument("--delete-every", type=int, default=4, help="one write in N deletes")
    p.add_argument("--epochs", type=int, default=9, help="epochs per way")
    args = p.parse_args(argv)
    rng = random.Random(1)

    def new_key() -> bytes:
        return rng.randrange(4096).to_bytes(4, "big") + rng.randbytes(8)

    with tempfile.TemporaryDirectory() as root:
        store = RocksDBBackend(root, "int64", 4096)
        db = store._db
        keys = [new_key() for _ in range(args.keys)]
        wb = WriteBatch(raw_mode=True)
        for k in keys:
            wb.put(k, rng.randbytes(60))
        db.write(wb)
        ways = {"unsorted": unsorted, "pairs": pairs, "indexes": write_in_key_order}
        times: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
        for epoch in tqdm(range(args.epochs), desc="epochs", leave=False):
            old = rng.sample(keys, args.writes * 3 // 4)
            fresh = [new_key() for _ in range(args.writes - len(old))]
            batch = old + fresh
            rng.shuffle(batch)
            values = [None if i % args.delete_every == 0 else rng.randbytes(60)
                      for i in range(len(batch))]
            for way in WAYS[epoch % 3:] + WAYS[:epoch % 3]:
                wb = WriteBatch(raw_mode=True)
                t0 = time.perf_counter()
                ways[way](wb, batch, values)
                t1 = time.perf_counter()
                db.write(wb, _SYNCED)
                times[way].append((t1 - t0, time.perf_counter() - t1))
            keys += fresh
        store.close()
    print(f"# {args.writes:,} writes (1 in {args.delete_every} a delete) per epoch into a store "
          f"of {args.keys:,} keys, {args.epochs} epochs per way; median ms")
    print("| way | Python (the batch) | RocksDB (the write) | both |")
    print("|---|---:|---:|---:|")
    for way in WAYS:
        py = statistics.median(t[0] for t in times[way]) * 1e3
        write = statistics.median(t[1] for t in times[way]) * 1e3
        both = statistics.median(sum(t) for t in times[way]) * 1e3
        print(f"| {way} | {py:,.0f} | {write:,.0f} | {both:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
