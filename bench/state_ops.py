"""Throughput of the state backend operations the migrator and the operator rely on.

Measures, per backend: batch put (``write_raw`` in batches), batch get, export of a quarter of
the bins, import of that export via chunk puts and via SST ingestion (into a receiver that holds
the other three quarters, i.e. the imported bins are empty there), and drop of the quarter.
Each measurement is repeated (default 3) and the median reported.  ``--sweep`` also times both
import paths for growing import sizes, which is where ``SST_MIN_BYTES`` (the ``auto`` threshold)
comes from.  Everything happens in a temporary directory that is removed afterwards.

    python bench/state_ops.py --keys 1e6 --sweep
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import rocksdict
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megaphone.state_backends import (
    BACKENDS,
    DEFAULT_CHUNK_BYTES,
    StateBackend,
    encode_keys,
    open_backend,
)


def count(text: str) -> int:
    """Parse a count such as ``1000000``, ``1e6`` or ``2.5e5``."""
    value = float(text)
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a positive whole count: {text}")
    return int(value)


@dataclass
class Row:
    """One measured operation: median seconds over the repeats for ``keys`` keys/``nbytes``."""

    backend: str
    op: str
    keys: int
    nbytes: int
    seconds: list[float]

    @property
    def median(self) -> float:
        """Median wall time in seconds."""
        return statistics.median(self.seconds)


def bins_for(keys: np.ndarray, num_bins: int) -> np.ndarray:
    """Bins of int64 keys: the routing module when present, else xxhash64 (seed 42) per key."""
    try:
        from megaphone.routing.bins import bin_of  # type: ignore[import-not-found]

        return np.asarray(bin_of(keys, num_bins), dtype=np.int64)
    except ImportError:
        import xxhash

        shift = 64 - (num_bins.bit_length() - 1)
        digest = xxhash.xxh64_intdigest
        return np.fromiter(
            (digest(k.to_bytes(8, "little", signed=True), seed=42) >> shift if shift < 64 else 0
             for k in keys.tolist()),
            dtype=np.int64, count=keys.size)


def make_data(n: int, num_bins: int, value_bytes: int, seed: int
              ) -> tuple[list[bytes], list[bytes], np.ndarray]:
    """Raw keys, raw msgpack values and bins of ``n`` distinct random int64 keys."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(-(2**62), 2**62, size=n + n // 100 + 10))[:n]
    rng.shuffle(keys)
    bins = bins_for(keys, num_bins)
    raw = encode_keys(bins, keys, "int64")
    if value_bytes < 256:  # msgpack bin8 / bin16 header
        header = b"\xc4" + bytes([value_bytes])
    else:
        header = b"\xc5" + value_bytes.to_bytes(2, "big")
    payload = rng.integers(0, 256, size=(n, value_bytes), dtype=np.uint8)
    values = [header + row for row in payload.view(f"V{value_bytes}").ravel().tolist()]
    return raw, values, bins


def timed(fn: Callable[[], object]) -> float:
    """Wall time of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def copy_store(src: str, dst: str) -> None:
    """Copy a closed store directory; immutable SST files are hard-linked, the rest copied."""
    def link_or_copy(a: str, b: str) -> None:
        if a.endswith(".sst"):
            os.link(a, b)
        else:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link_or_copy)


def batches_of(table: pa.Table, n: int) -> list[pa.RecordBatch]:
    """The first ``n`` exported rows, keeping the export chunking."""
    return table.slice(0, n).to_batches()


class Bench:
    """Runs every phase for one backend and collects :class:`Row` results."""

    def __init__(self, kind: str, args: argparse.Namespace, data: tuple, root: str) -> None:
        """Remember the backend kind, options, data set and scratch directory."""
        self.kind, self.args, self.root = kind, args, root
        self.raw, self.values, self.bins = data
        self.nbytes = sum(map(len, self.raw)) + sum(map(len, self.values))
        rng = np.random.default_rng(args.seed + 1)
        self.quarter = np.sort(rng.choice(args.bins, size=max(1, args.bins // 4), replace=False))
        # keys the receiver owns (outside the moved quarter), for warming its memtable
        self.own = np.flatnonzero(~np.isin(self.bins, self.quarter))[: args.batch]
        self.rows: dict[str, Row] = {}
        self.sweep: dict[tuple[int, str], list[float]] = {}

    def add(self, op: str, keys: int, nbytes: int, seconds: float) -> None:
        """Record one repetition of ``op``."""
        row = self.rows.setdefault(op, Row(self.kind, op, keys, nbytes, []))
        row.seconds.append(seconds)

    def open(self, path: str) -> StateBackend:
        """Open the backend under test at ``path``."""
        return open_backend(self.kind, path, "int64", self.args.bins)

    def repeat(self, rep: int) -> None:
        """One full repetition of every phase in a fresh directory."""
        a, raw, values = self.args, self.raw, self.values
        base = os.path.join(self.root, f"{self.kind}-{rep}")
        src = self.open(os.path.join(base, "src"))
        step = a.batch
        bar = tqdm(total=len(raw), desc=f"{self.kind} put #{rep + 1}", unit="key", leave=False,
                   disable=None)

        def put() -> None:
            for i in range(0, len(raw), step):
                ks = raw[i:i + step]
                src.write_raw(ks, values[i:i + step], old_values=[None] * len(ks))
                bar.update(len(ks))
        self.add("batch put (write_raw)", len(raw), self.nbytes, timed(put))
        bar.close()

        order = np.random.default_rng(rep).permutation(len(raw))
        probe = [raw[i] for i in order]

        def get() -> None:
            for i in tqdm(range(0, len(probe), step), desc=f"{self.kind} get #{rep + 1}",
                          leave=False, disable=None):
                src.get_raw(probe[i:i + step])
        if "get" not in a.skip:
            self.add("batch get (get_raw)", len(raw), self.nbytes, timed(get))

        exported: list[pa.RecordBatch] = []
        t = timed(lambda: exported.extend(src.export_bins(self.quarter, a.chunk_bytes)))
        moved = sum(b.num_rows for b in exported)
        moved_bytes = sum(pc.sum(pc.binary_length(c)).as_py() for b in exported for c in b.columns)
        self.add("export 1/4 of bins", moved, moved_bytes, t)

        # receiver = the source without the quarter (its own state in the other bins)
        src.flush()
        rcv = os.path.join(base, "rcv")
        src.checkpoint(rcv)
        with self.open(rcv) as r:
            r.drop_bins(self.quarter)
        quarter = set(self.quarter.tolist())
        for method in ("chunk", "sst"):
            dst_path = os.path.join(base, f"dst-{method}")
            copy_store(rcv, dst_path)
            with self.open(dst_path) as dst:
                warm_up(dst, raw, values, self.own)
                t = timed(lambda dst=dst, m=method: dst.import_bins(exported, method=m))
                t_flush = timed(dst.flush)
                got = sum(s.keys for b, s in dst.bin_stats().items() if b in quarter)
                assert got == moved, (got, moved)
            self.add(f"import via {method}", moved, moved_bytes, t)
            self.add(f"import via {method} + flush", moved, moved_bytes, t + t_flush)
            shutil.rmtree(dst_path)

        self.add("drop 1/4 of bins", moved, moved_bytes, timed(lambda: src.drop_bins(self.quarter)))
        src.close()
        if a.sweep and self.kind == "rocksdb":
            self.run_sweep(rcv, pa.Table.from_batches(exported), rep)
        shutil.rmtree(base)

    def run_sweep(self, rcv: str, table: pa.Table, rep: int) -> None:
        """Time chunk vs SST import for growing import sizes (the ``auto`` crossover)."""
        sizes = [n for n in (1_000, 4_000, 16_000, 64_000, 250_000, 500_000)
                 if n < table.num_rows] + [table.num_rows]
        for n in tqdm(sizes, desc=f"sweep #{rep + 1}", leave=False, disable=None):
            batches = batches_of(table, n)
            for method in ("chunk", "sst"):
                path = os.path.join(self.root, f"sweep-{method}-{n}")
                copy_store(rcv, path)
                with self.open(path) as dst:
                    warm_up(dst, self.raw, self.values, self.own)
                    t = timed(lambda dst=dst, m=method, b=batches: dst.import_bins(b, method=m))
                    t_flush = timed(dst.flush)
                self.sweep.setdefault((n, method), []).append(t)
                self.sweep.setdefault((n, method + "+flush"), []).append(t + t_flush)
                shutil.rmtree(path)


def warm_up(be: StateBackend, raw: list[bytes], values: list[bytes], idx: np.ndarray) -> None:
    """Overwrite one batch of the receiver's own keys so its memtable is not empty (as live)."""
    be.write_raw([raw[i] for i in idx], [values[i] for i in idx])


def fmt_rate(x: float) -> str:
    """Human-friendly rate."""
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def report(benches: list[Bench], args: argparse.Namespace) -> str:
    """Markdown tables of the medians (and the SST/chunk ratio and sweep when measured)."""
    lines = [
        "| backend | operation | keys | median s | keys/s | MB/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for b in benches:
        for row in b.rows.values():
            med = row.median
            lines.append(f"| {row.backend} | {row.op} | {row.keys:,} | {med:.3f} | "
                         f"{fmt_rate(row.keys / med)} | {row.nbytes / med / 1e6:.1f} |")
    lines.append("")
    for b in benches:
        for suffix in ("", " + flush"):
            chunk = b.rows[f"import via chunk{suffix}"].median
            sst = b.rows[f"import via sst{suffix}"].median
            lines.append(f"- {b.kind}: import via SST{suffix} runs at {chunk / sst:.2f}x the "
                         f"speed of chunk puts{suffix} ({sst:.3f} s vs {chunk:.3f} s)")
    for b in benches:
        if b.sweep:
            lines += ["", f"Import-size sweep ({b.kind}, median of {args.repeats}, receiver holds "
                      "the other bins):", "",
                      "| keys imported | MB | chunk ms | sst ms | sst speed-up "
                      "| chunk+flush ms | sst+flush ms | sst speed-up (+flush) |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|"]
            per_key = b.rows["import via chunk"].nbytes / b.rows["import via chunk"].keys
            for n in sorted({n for n, _ in b.sweep}):
                c, s, cf, sf = (statistics.median(b.sweep[(n, m)])
                                for m in ("chunk", "sst", "chunk+flush", "sst+flush"))
                lines.append(f"| {n:,} | {n * per_key / 1e6:.2f} | {c * 1e3:.1f} | "
                             f"{s * 1e3:.1f} | {c / s:.2f}x | {cf * 1e3:.1f} | {sf * 1e3:.1f} | "
                             f"{cf / sf:.2f}x |")
    return "\n".join(lines)


def machine() -> str:
    """One line describing the machine and library versions."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores (nproc), {mem:.0f} GiB RAM, {platform.system()} "
            f"{platform.machine()}, Python {platform.python_version()}, "
            f"rocksdict {rocksdict_version()}, numpy {np.__version__}, pyarrow {pa.__version__}")


def rocksdict_version() -> str:
    """Installed rocksdict version."""
    from importlib.metadata import version

    try:
        return version("rocksdict")
    except Exception:
        return getattr(rocksdict, "__version__", "?")


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print the tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=count, default=1_000_000, help="number of keys (e.g. 1e6)")
    p.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    p.add_argument("--bins", type=count, default=4096, help="num_bins (power of two)")
    p.add_argument("--chunk-bytes", type=count, default=DEFAULT_CHUNK_BYTES,
                   help="export chunk bound in bytes")
    p.add_argument("--batch", type=count, default=10_000, help="keys per write_raw/get_raw")
    p.add_argument("--value-bytes", type=count, default=32, help="payload bytes per value")
    p.add_argument("--repeats", type=count, default=3)
    p.add_argument("--sweep", action="store_true", help="also sweep import sizes (rocksdb)")
    p.add_argument("--skip", nargs="*", default=[], choices=["get"],
                   help="phases to skip (random gets are slow once state outgrows the cache)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmp-dir", default=None, help="scratch directory parent")
    args = p.parse_args(argv)

    kinds = BACKENDS if args.backend == "both" else (args.backend,)
    print(f"# state_ops: {args.keys:,} keys, {args.bins} bins, {args.value_bytes}-byte payloads, "
          f"chunk {args.chunk_bytes:,} B, batch {args.batch:,}, median of {args.repeats}",
          flush=True)
    print(f"# {machine()}", flush=True)
    data = make_data(args.keys, args.bins, args.value_bytes, args.seed)
    root = tempfile.mkdtemp(prefix="megaphone-bench-", dir=args.tmp_dir)
    try:
        benches = []
        for kind in kinds:
            bench = Bench(kind, args, data, root)
            for rep in range(args.repeats):
                bench.repeat(rep)
            benches.append(bench)
        print(report(benches, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
