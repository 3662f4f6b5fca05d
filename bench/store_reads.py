"""Point reads on one worker's store: cold pages against warmed ones, per block compression.

An epoch's merge reads its keys from the worker's RocksDB with one multi-get. On a store much
larger than RocksDB's block cache almost every key is a block-cache miss, so what such a read
costs is the table file's page (in the OS page cache or on the disk) and the block's
decompression. This benchmark loads a one-worker count store (every key ``0 .. keys-1`` with
the count 1, as ``bench/load.py`` does) once per block compression, then times rounds of
multi-gets of ``--per`` random keys in two states of the page cache:

- ``cold``: the store's pages dropped before every round (a store just written by RocksDB's
  ``SstFileWriter``, or just reopened, at a size where reads rarely meet a cached page);
- ``warm``: every page cached, read ahead by the store's own
  :class:`~megaphone.state_backends.page_cache.PageCacheWarmer`.

It prints the store's size, the median milliseconds a round and microseconds a key, and writes
them as JSON (``--compressions`` picks the compressions, default zstd, lz4 and none).

    python bench/store_reads.py --keys 2.5e7 --out bench/results/store-reads
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from pyspark.sql import SparkSession
from rocksdict import DBCompressionType
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from load import create_loaded

import megaphone.state_backends.rocksdb as rocksdb_backend
from megaphone.paths import StateDirPaths
from megaphone.routing.bins import bin_of
from megaphone.state_backends import encode_keys, open_backend
from megaphone.state_backends.page_cache import PageCacheWarmer, table_files

BINS = 4096
COMPRESSIONS = {"zstd": DBCompressionType.zstd, "lz4": DBCompressionType.lz4,
                "none": DBCompressionType.none}


_TUNED = rocksdb_backend.db_options  # the product's options


def use_compression(name: str) -> None:
    """Make every store this process opens or writes compress its blocks with ``name``
    (the product's options otherwise)."""
    def options():
        opts = _TUNED()
        opts.set_compression_type(COMPRESSIONS[name]())
        return opts

    rocksdb_backend.db_options = options


def load_store(root: Path, keys: int, compression: str) -> Path:
    """The one worker store of ``keys`` keys compressed with ``compression``, loaded once."""
    state = root / f"{compression}-{keys}"
    store = StateDirPaths(state).worker(0)
    if not (state / "loaded").exists():
        spark = SparkSession.builder.master("local[1]").getOrCreate()
        create_loaded(spark, state, keys, 1, BINS, progress=False)
        (state / "loaded").touch()
    return Path(store)


def drop_pages(store: Path) -> None:
    """Drop the page cache of the store's table files (clean pages only, as after a write)."""
    for name in table_files(str(store)):
        fd = os.open(store / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_rounds(store: Path, keys: int, rounds: int, per: int, cold: bool,
                rng: np.random.Generator) -> list[float]:
    """Seconds per multi-get of ``per`` random keys, ``rounds`` times."""
    backend = open_backend("rocksdb", str(store), "int64", BINS, read_only=True)
    times = []
    try:
        for _ in range(rounds):
            k = rng.integers(0, keys, per, dtype=np.int64)
            raw = encode_keys(np.asarray(bin_of(k, BINS)), k, "int64")
            if cold:
                drop_pages(store)
            t0 = time.perf_counter()
            values = backend.get_raw(raw)
            times.append(time.perf_counter() - t0)
            if any(v is None for v in values):
                raise SystemExit(f"{store}: a loaded key is missing")
    finally:
        backend.close()
    return times


def main(argv: list[str] | None = None) -> int:
    """Command line: load the stores, time their reads cold and warm, print and save."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=lambda s: int(float(s)), default=25_000_000)
    p.add_argument("--compressions", default="zstd,lz4,none")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--per", type=int, default=2500, help="keys per multi-get")
    p.add_argument("--stores", type=Path, default=Path("bench/out/store-reads"),
                   help="where the loaded stores are kept (reused)")
    p.add_argument("--out", type=Path, default=Path("bench/out/store-reads"))
    args = p.parse_args(argv)
    rng = np.random.default_rng(7)
    results = []
    names = args.compressions.split(",")
    for name in tqdm(names, desc="stores"):
        use_compression(name)
        store = load_store(args.stores, args.keys, name)
        size = sum(table_files(str(store)).values())
        cold = read_rounds(store, args.keys, args.rounds, args.per, True, rng)
        drop_pages(store)
        warmer = PageCacheWarmer(str(store)).warm()
        if warmer is None:
            raise SystemExit(f"{store}: too large to warm in this machine's memory")
        warmer.join()
        warm = read_rounds(store, args.keys, args.rounds, args.per, False, rng)
        row = {"compression": name, "keys": args.keys, "table_bytes": size,
               "cold_ms": statistics.median(cold) * 1e3,
               "warm_ms": statistics.median(warm) * 1e3}
        results.append(row)
    print(f"{args.keys:,} keys, {args.per} random keys a multi-get, medians of "
          f"{args.rounds} rounds")
    print(f"{'blocks':>6} {'tables MB':>10} {'cold ms':>8} {'us/key':>7} {'warm ms':>8} "
          f"{'us/key':>7}")
    for r in results:
        print(f"{r['compression']:>6} {r['table_bytes'] / 1e6:>10.0f} {r['cold_ms']:>8.1f} "
              f"{r['cold_ms'] * 1e3 / args.per:>7.1f} {r['warm_ms']:>8.1f} "
              f"{r['warm_ms'] * 1e3 / args.per:>7.1f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"reads-{args.keys}.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
