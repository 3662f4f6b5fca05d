"""The cost of a durable copy: epochs with and without a checkpoint location, and restore speed.

Two pipelines of a keyed count run side by side on the same input (``--records`` per epoch over
``--keys`` keys, generated in the JVM as in bench/epoch_floor.py), one of them with
``checkpoint=`` a local directory (a changelog per worker per epoch, a snapshot every
``--snapshot-every`` epochs); their order alternates. After ``--warmup`` epochs, ``--epochs``
are measured (wall-clock of ``process_arrow``); prints both medians and their ratio.

Then the restore speed: the checkpointed pipeline's worker 0 loses its working copy and its
store service restores it (latest snapshot + changelogs); prints the seconds and the state's
bytes, as seconds per GB.

    python bench/durability.py
    python bench/durability.py --records 20000 --keys 1e6 --epochs 40 --json /tmp/d.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megaphone
from bench.epoch_floor import epoch_frame, machine
from megaphone.paths import checkpoint_worker_root, local_worker_path
from megaphone.spark import spark_session
from megaphone.state_backends.remote import release_stores

#: Acceptance target: steady-state epoch time with a local checkpoint over without.
TARGET_RATIO = 1.10


def main(argv: list[str] | None = None) -> int:
    """Run both pipelines side by side, then time a restore; print the numbers."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=lambda s: int(float(s)), default=20_000)
    p.add_argument("--keys", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bins", type=int, default=4096)
    p.add_argument("--snapshot-every", type=int, default=50)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    mach = machine()
    command = "python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    print(f"# durability: nproc {mach['nproc']}, {mach['platform']}, PySpark {mach['pyspark']}")
    print(f"# command: {command}")
    spark = spark_session(args.master, "durability")
    times: dict[str, list[float]] = {"plain": [], "checkpoint": []}
    with tempfile.TemporaryDirectory(prefix="durability-") as tmp:
        root = Path(tmp)
        pipes = {
            "plain": megaphone.Pipeline(spark, str(root / "plain"), key="key", update="count",
                                        workers=args.workers, num_bins=args.bins),
            "checkpoint": megaphone.Pipeline(
                spark, str(root / "ckpt-state"), key="key", update="count",
                workers=args.workers, num_bins=args.bins, checkpoint=str(root / "checkpoint"),
                snapshot_every=args.snapshot_every),
        }
        try:
            for epoch in tqdm(range(args.warmup + args.epochs), desc="epochs", leave=False):
                order = ("plain", "checkpoint") if epoch % 2 == 0 else ("checkpoint", "plain")
                for name in order:
                    t0 = time.perf_counter()
                    pipes[name].process_arrow(epoch_frame(spark, epoch, args.records, args.keys))
                    if epoch >= args.warmup:
                        times[name].append(time.perf_counter() - t0)
            ck = pipes["checkpoint"]
            worker_dir = local_worker_path(ck.local_dir, ck.fingerprint.pipeline_id, 0)
            release_stores(ck.local_dir, str(worker_dir.parent))  # as if its executor were gone
            state_bytes = sum(f.stat().st_size for f in worker_dir.rglob("*") if f.is_file())
            durable_bytes = sum(f.stat().st_size for f in
                                Path(checkpoint_worker_root(str(root / "checkpoint"), 0)).rglob("*")
                                if f.is_file())
            shutil.rmtree(worker_dir)
            t0 = time.perf_counter()
            ck.process_arrow(epoch_frame(spark, args.warmup + args.epochs, args.records,
                                         args.keys))
            epoch_s = time.perf_counter() - t0
            restored = ck.metrics(last=1)[0]["per_worker"]["0"]["restored"]
        finally:
            for pipe in pipes.values():
                pipe.close()
    plain, ckpt = (statistics.median(times[n]) for n in ("plain", "checkpoint"))
    ratio = ckpt / plain
    gb = durable_bytes / 1e9
    print(f"\n## {args.epochs} epochs of {args.records:,} records over {args.keys:,} keys "
          f"({args.warmup} warm-up), snapshot every {args.snapshot_every} epochs")
    print("| pipeline | median ms | p90 ms |")
    print("|---|---:|---:|")
    for name in ("plain", "checkpoint"):
        ts = sorted(times[name])
        print(f"| {name} | {statistics.median(ts) * 1e3:.1f} | "
              f"{ts[int(0.9 * (len(ts) - 1))] * 1e3:.1f} |")
    print(f"\ncheckpoint / plain: {ratio:.3f}x (target <= {TARGET_RATIO:.2f}x: "
          f"{'within' if ratio <= TARGET_RATIO else 'over'})")
    print(f"restore of worker 0: {restored['rows']:,} rows from snapshot "
          f"{restored['snapshot']} + {restored['changelogs']} changelogs, "
          f"{durable_bytes / 1e6:.1f} MB durable ({state_bytes / 1e6:.1f} MB working copy) in "
          f"{restored['seconds']:.2f} s = {restored['seconds'] / gb:.1f} s/GB of durable copy; "
          f"the epoch that restored took {epoch_s:.2f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": command, "machine": mach, "config": {k: str(v) for k, v in
                                                            vars(args).items()},
            "plain_s": times["plain"], "checkpoint_s": times["checkpoint"], "ratio": ratio,
            "restore": restored, "durable_bytes": durable_bytes,
            "working_copy_bytes": state_bytes, "restore_epoch_s": epoch_s}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
