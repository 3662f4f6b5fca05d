"""Bulk-load a keyed count's state straight into a pipeline's worker state directories.

A benchmark over ``1e7 .. 1e9`` keys cannot build its initial state through epochs (a billion
records through Spark and a random get per key). Instead every key ``0 .. keys-1`` gets the
count 1, written as sorted SST files into the RocksDB of the worker that owns its bin (the
initial routing, contiguous ranges of bins) through the backend's own ``import_sst``, so
the per-bin counters and the descriptor are exactly what the pipeline writes itself. The state
directory itself is created by :class:`megaphone.Pipeline`, so the pipeline opens the result
like any other state directory. The total of all counts after the load is ``keys``.

Two passes keep memory bounded at any size: keys are first bucketed by (group of consecutive
bins, worker) into temporary files, then each worker's buckets are sorted by raw key and
streamed into one SST ingestion per worker. Both passes run in ``procs`` processes.

    python bench/load.py --keys 1e8 --state-dir /tmp/state --workers 2 --bins 256
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megaphone.paths import StateDirPaths
from megaphone.routing.bins import bin_of
from megaphone.routing.table import initial_owners
from megaphone.state_backends import open_backend

#: Keys hashed per pass-1 step (about 0.1 GB of temporaries).
CHUNK_KEYS = 10_000_000
#: Keys of one bucket (one group of bins of one worker) sorted at once in pass 2.
BUCKET_KEYS = 10_000_000
#: Keys per record batch handed to ``import_sst`` (bounds the Python objects it builds).
BATCH_KEYS = 1_000_000
#: Loads up to this many keys run in this process (starting loader processes costs more).
SMALL_KEYS = 2_000_000
#: The value every key starts with: msgpack of the count 1.
ONE = b"\x01"
#: Bits a key may use in the combined sort key ``bin << KEY_BITS | key`` (keys < 2**40).
KEY_BITS = 40
_INT_KEY = np.dtype([("b", ">u4"), ("k", ">u8")])
_SIGN = np.uint64(1 << 63)


@dataclass(frozen=True)
class LoadSpec:
    """What to load and where: passed whole to every loader process (picklable)."""

    state_dir: str
    keys: int
    workers: int
    num_bins: int
    backend: str
    groups: int
    tmp: str
    procs: int

    @property
    def bins_per_group(self) -> int:
        """Consecutive bins per group (the last group may be smaller)."""
        return math.ceil(self.num_bins / self.groups)

    @property
    def key_dtype(self) -> np.dtype:
        """Smallest dtype the bucket files can store the keys in."""
        return np.dtype(np.uint32) if self.keys <= 2**32 else np.dtype(np.int64)

    def bucket_file(self, group: int, worker: int, proc: int) -> Path:
        """Pass-1 output of process ``proc`` for ``group`` of ``worker``."""
        return Path(self.tmp) / f"g{group:05d}-w{worker:05d}-p{proc:03d}.keys"

    def worker_path(self, worker: int) -> Path:
        """The worker's state backend directory in the state directory."""
        return StateDirPaths(self.state_dir).worker(worker)


def raw_batch(bins: np.ndarray, keys: np.ndarray) -> pa.RecordBatch:
    """An exported-state batch ``(k, v)`` for sorted int64 keys, built without Python objects.

    Raw keys are ``4-byte big-endian bin + 8-byte big-endian key XOR 2**63`` (the layout of
    ``megaphone.state_backends.encoding``); every value is the msgpack count 1.
    """
    n = len(keys)
    rec = np.empty(n, dtype=_INT_KEY)
    rec["b"] = bins
    rec["k"] = keys.astype(np.int64).view(np.uint64) ^ _SIGN
    key_offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 12).tobytes())
    k = pa.Array.from_buffers(pa.binary(), n, [None, key_offsets, pa.py_buffer(rec.tobytes())])
    value_offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32).tobytes())
    v = pa.Array.from_buffers(pa.binary(), n, [None, value_offsets, pa.py_buffer(ONE * n)])
    return pa.RecordBatch.from_arrays([k, v], names=["k", "v"])


def _chunks(spec: LoadSpec, proc: int) -> Iterator[tuple[int, int]]:
    """Key ranges ``[lo, hi)`` pass 1 of process ``proc`` hashes (round robin)."""
    for i, lo in enumerate(range(0, spec.keys, CHUNK_KEYS)):
        if i % spec.procs == proc:
            yield lo, min(lo + CHUNK_KEYS, spec.keys)


def bucket_pass(spec: LoadSpec, proc: int, done) -> None:
    """Pass 1: hash this process's key chunks and append each key to its bucket file."""
    buckets = spec.groups * spec.workers
    files = {}
    owners = initial_owners(spec.num_bins, spec.workers)  # the routing table's version 0
    try:
        for lo, hi in _chunks(spec, proc):
            keys = np.arange(lo, hi, dtype=np.int64)
            bins = bin_of(keys, spec.num_bins).astype(np.int64)
            bucket = (bins // spec.bins_per_group) * spec.workers + owners[bins]
            order = np.argsort(bucket, kind="stable")
            counts = np.bincount(bucket, minlength=buckets)
            sorted_keys = keys[order].astype(spec.key_dtype)
            start = 0
            for b, n in enumerate(counts.tolist()):
                if n:
                    if b not in files:
                        path = spec.bucket_file(b // spec.workers, b % spec.workers, proc)
                        files[b] = open(path, "ab")  # noqa: SIM115 - closed below
                    files[b].write(sorted_keys[start:start + n].tobytes())
                start += n
            with done.get_lock():
                done.value += hi - lo
    finally:
        for fh in files.values():
            fh.close()


def _sorted_bucket(spec: LoadSpec, group: int, worker: int) -> tuple[np.ndarray, np.ndarray]:
    """``(bins, keys)`` of one bucket sorted by raw key (bin first, then key)."""
    parts = [np.fromfile(spec.bucket_file(group, worker, p), dtype=spec.key_dtype)
             for p in range(spec.procs) if spec.bucket_file(group, worker, p).exists()]
    keys = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    bins = bin_of(keys, spec.num_bins).astype(np.int64)
    combined = (bins << KEY_BITS) | keys  # keys are < 2**40 and >= 0: one sort does both
    combined.sort()
    return combined >> KEY_BITS, combined & ((1 << KEY_BITS) - 1)


def _worker_batches(spec: LoadSpec, worker: int, done) -> Iterator[pa.RecordBatch]:
    """Every key of ``worker`` in raw-key order, as record batches of the count 1."""
    for group in range(spec.groups):
        bins, keys = _sorted_bucket(spec, group, worker)
        for lo in range(0, len(keys), BATCH_KEYS):
            hi = min(lo + BATCH_KEYS, len(keys))
            yield raw_batch(bins[lo:hi], keys[lo:hi])
            with done.get_lock():
                done.value += hi - lo


def ingest_pass(spec: LoadSpec, proc: int, done) -> None:
    """Pass 2: stream the sorted buckets of this process's workers into their backends."""
    for worker in range(proc, spec.workers, spec.procs):
        backend = open_backend(spec.backend, spec.worker_path(worker), "int64", spec.num_bins)
        try:
            backend.import_sst(_worker_batches(spec, worker, done))
            backend.flush()
        finally:
            backend.close()


class _Counter:
    """The in-process stand-in for a shared ``multiprocessing.Value`` counter."""

    def __init__(self) -> None:
        self.value = 0

    def get_lock(self) -> contextlib.nullcontext:
        """No other process shares it: no lock."""
        return contextlib.nullcontext()


def _run_pass(target, spec: LoadSpec, desc: str, progress: bool) -> None:
    """Run ``target(spec, proc, counter)`` in ``spec.procs`` processes with a progress bar.

    One process means this one: small loads skip the start-up of fresh interpreters.
    """
    if spec.procs == 1:
        target(spec, 0, _Counter())
        return
    ctx = mp.get_context("spawn")  # the parent may hold a JVM gateway: never fork it
    done = ctx.Value("q", 0)
    procs = [ctx.Process(target=target, args=(spec, p, done)) for p in range(spec.procs)]
    for p in procs:
        p.start()
    with tqdm(total=spec.keys, desc=desc, unit="key", unit_scale=True, disable=not progress,
              mininterval=1.0) as bar:
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            bar.update(done.value - bar.n)
        bar.update(done.value - bar.n)
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{desc}: a loader process failed (exit codes {failed})")


def load_counts(state_dir: str | os.PathLike[str], keys: int, workers: int, num_bins: int,
                backend: str = "rocksdb", procs: int | None = None,
                progress: bool = True) -> int:
    """Give keys ``0 .. keys-1`` the count 1 in the worker directories of ``state_dir``.

    ``state_dir`` must be a fresh state directory of an int64-keyed count with ``workers``
    workers (see :func:`create_loaded`); its workers must hold no state yet. Returns the total
    of all counts written (``keys``), which a correctness check adds to the records fed.
    """
    if keys >= 1 << KEY_BITS:
        raise ValueError(f"at most 2**{KEY_BITS} keys can be bulk-loaded, got {keys}")
    procs = max(1, min(procs or os.cpu_count() or 1, workers))
    if keys <= SMALL_KEYS:
        procs = 1
    groups = max(1, math.ceil(keys / (BUCKET_KEYS * workers)))
    groups = min(groups, num_bins)
    tmp = tempfile.mkdtemp(prefix=".bulk-", dir=state_dir)
    spec = LoadSpec(str(state_dir), keys, workers, num_bins, backend, groups, tmp, procs)
    try:
        _run_pass(bucket_pass, spec, "bucket keys", progress)
        _run_pass(ingest_pass, spec, "write SSTs", progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return keys


def create_loaded(spark, state_dir: str | os.PathLike[str], keys: int, workers: int,
                  num_bins: int, backend: str = "rocksdb", procs: int | None = None,
                  progress: bool = True) -> int:
    """Create a count pipeline's state directory (key column ``key``) and bulk-load it.

    The directory is created by :class:`megaphone.Pipeline` itself and closed again, so the
    manifest, routing and commit are the library's own. Returns the initial total count.
    """
    from megaphone import Pipeline

    pipe = Pipeline(spark, str(state_dir), key="key", update="count", workers=workers,
                    num_bins=num_bins, backend=backend, key_type="int64")
    pipe.close()
    return load_counts(state_dir, keys, workers, num_bins, backend, procs, progress)


def clone_state_dir(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copy a stopped pipeline's state directory cheaply: SST files are hard-linked.

    RocksDB never changes an SST file once written (it only deletes whole files), so sharing
    them between the template and the copy is safe; every other file (manifests, logs,
    metadata) is copied because RocksDB appends to some of them.
    """
    def link_or_copy(source: str, dest: str) -> None:
        if source.endswith(".sst"):
            try:
                os.link(source, dest)
                return
            except OSError:
                pass
        shutil.copy2(source, dest)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def main(argv: list[str] | None = None) -> int:
    """Command line: create and bulk-load a state directory (for manual runs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=lambda s: int(float(s)), required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bins", type=int, default=256)
    parser.add_argument("--backend", default="rocksdb")
    args = parser.parse_args(argv)
    from megaphone.spark import spark_session

    spark = spark_session("local[2]", "megaphone-load")
    started = time.time()
    total = create_loaded(spark, args.state_dir, args.keys, args.workers, args.bins,
                          args.backend)
    took = time.time() - started
    print(f"loaded {total:,} keys in {took:.1f} s ({total / took:,.0f} keys/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
