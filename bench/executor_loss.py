"""Executor loss: how long a checkpointed pipeline takes to recover when a host dies mid-epoch.

Starts the two simulated hosts of ``tests/helpers/cluster.py`` (a Spark standalone master and
two single-core workers on 127.0.0.1, each in its own mount namespace: needs root), and drives a
keyed count with a checkpoint location both hosts see. It loads ``--keys`` keys in one epoch,
runs ``--before`` epochs of ``--records`` records, then kills host 1 (every process in its
namespace: its Spark worker, executor and store services; SIGKILL) ``--kill-at`` of a steady
epoch into the next one, and runs ``--after`` more epochs on host 0 alone. Prints the steady
epoch before, the epoch host 1 died in (Spark notices the lost executor, reruns the lost map
output, and host 1's workers are restored on host 0 from the checkpoint), the epochs after,
every restore, and checks that the final state counts every record exactly once.

    python bench/executor_loss.py
    python bench/executor_loss.py --keys 1e6 --json bench/results/executor-loss/run1.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megaphone
from bench.epoch_floor import epoch_frame, machine
from megaphone.spark import spark_session
from tests.helpers.cluster import CLUSTER_CONF, kill_host, namespaces_permitted, two_hosts


def restores(pipe: megaphone.Pipeline) -> list[dict]:
    """The restores of the pipeline's last epoch, one per restored worker."""
    per_worker = pipe.metrics(last=1)[0]["per_worker"]
    return [{"worker": int(w), **m["restored"]} for w, m in per_worker.items()
            if m.get("restored")]


def main(argv: list[str] | None = None) -> int:
    """Run the pipeline on two hosts, kill one mid-epoch, print the recovery numbers."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--records", type=lambda s: int(float(s)), default=20_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--bins", type=int, default=4096)
    p.add_argument("--before", type=int, default=15)
    p.add_argument("--after", type=int, default=15)
    p.add_argument("--kill-at", type=float, default=0.5,
                   help="when to kill host 1, as a fraction of the median steady epoch")
    p.add_argument("--snapshot-every", type=int, default=50)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="epoch times over the run (PNG)")
    args = p.parse_args(argv)
    mach = machine()
    command = "python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    print(f"# executor loss: nproc {mach['nproc']}, {mach['platform']}, "
          f"PySpark {mach['pyspark']}")
    print(f"# command: {command}")
    with tempfile.TemporaryDirectory(prefix="executor-loss-") as tmp:
        base = Path(tmp)
        if not namespaces_permitted(base / "probe"):
            print("mount namespaces are not permitted here (needs root)", file=sys.stderr)
            return 2
        with two_hosts(base) as hosts:
            spark = spark_session(hosts.master, "executor-loss", CLUSTER_CONF)
            pipe = megaphone.Pipeline(
                spark, str(hosts.hidden / "state"), key="key", update="count",
                workers=args.workers, num_bins=args.bins, local_dir=str(hosts.hidden / "local"),
                checkpoint=str(hosts.shared / "checkpoint"), snapshot_every=args.snapshot_every)
            try:
                t0 = time.perf_counter()
                pipe.process_arrow(spark.range(args.keys, numPartitions=2)
                                   .withColumnRenamed("id", "key"))
                load_s = time.perf_counter() - t0
                run = _run(spark, pipe, hosts.procs[2], args)
                total = pipe.state().groupBy().sum("state").first()[0]
            finally:
                pipe.close()
                spark.stop()
    expected = args.keys + args.records * (args.before + 1 + args.after)
    before, after = run["epoch_s"][:args.before], run["epoch_s"][args.before + 1:]
    kill_epoch_s = run["epoch_s"][args.before]
    steady, steady_after = statistics.median(before), statistics.median(after)
    print(f"\n## {args.keys:,} keys loaded in {load_s:.1f} s; {args.records:,} records per "
          f"epoch, {args.workers} workers on 2 hosts of 1 core")
    print("| | epochs | median s | max s |")
    print("|---|---:|---:|---:|")
    print(f"| before (2 hosts) | {len(before)} | {steady:.2f} | {max(before):.2f} |")
    print(f"| host 1 killed {run['kill_after_s']:.2f} s into this epoch | 1 | "
          f"{kill_epoch_s:.2f} | |")
    print(f"| after (host 0 alone) | {len(after)} | {steady_after:.2f} | {max(after):.2f} |")
    print(f"\nrecovery: the epoch host 1 died in took {kill_epoch_s:.2f} s, "
          f"{kill_epoch_s - steady:.2f} s over a steady epoch")
    print(f"Spark ran the killed epoch's job {run['kill_job_attempts']} time(s); "
          f"its phases (s): {run['kill_phases_s']}")
    for r in run["restores"]:
        start = "empty" if r["snapshot"] is None else f"snapshot {r['snapshot']}"
        how = (f"caught up from epoch {r['since']}" if r.get("since") is not None else
               f"rebuilt from {start}")
        print(f"  epoch {r['at']}: worker {r['worker']} {how}: {r['changelogs']} changelogs, "
              f"{r['rows']:,} rows in {r['seconds']:.2f} s")
    swaps = [r for r in run["restores"] if r["at"] < args.before]
    full = [r for r in swaps if r.get("since") is None]
    print(f"restores before the kill (a worker's task ran on the other host): {len(swaps)}, "
          f"{len(full)} of them rebuilt from empty; median "
          f"{statistics.median(r['seconds'] for r in swaps) if swaps else 0:.2f} s")
    ok = total == expected
    print(f"final state: {total:,} counted, {expected:,} expected: {'OK' if ok else 'WRONG'}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": command, "machine": mach,
            "config": {k: str(v) for k, v in vars(args).items()}, "load_s": load_s, **run,
            "state_total": total, "expected_total": expected}, indent=2) + "\n")
    if args.plot is not None:
        _plot(run, args)
    return 0 if ok else 1


def _run(spark, pipe: megaphone.Pipeline, host1, args: argparse.Namespace) -> dict:
    """The measured epochs: ``before``, the one host 1 dies in, ``after``."""
    times: list[float] = []
    found: list[dict] = []
    kill_after = attempts = phases = None
    for i in tqdm(range(args.before + 1 + args.after), desc="epochs", leave=False):
        frame = epoch_frame(spark, i + 1, args.records, args.keys)
        timer = None
        if i == args.before:
            kill_after = args.kill_at * statistics.median(times)
            timer = threading.Timer(kill_after, kill_host, (host1,))
        t0 = time.perf_counter()
        if timer is not None:
            timer.start()
        pipe.process_arrow(frame)
        times.append(time.perf_counter() - t0)
        found += [{"at": i, **r} for r in restores(pipe)]
        if timer is not None:
            last = pipe.metrics(last=1)[0]
            attempts, phases = last.get("job_attempts"), last.get("phases_s")
            timer.join()
            host1.wait()
    return {"epoch_s": times, "restores": found, "kill_after_s": kill_after,
            "kill_job_attempts": attempts,
            "kill_phases_s": {k: round(v, 2) for k, v in (phases or {}).items()}}


def _plot(run: dict, args: argparse.Namespace) -> None:
    """Epoch times over the run, the kill marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(range(len(run["epoch_s"])), run["epoch_s"], marker=".")
    ax.axvline(args.before, color="red", linestyle=":", label="host 1 killed")
    ax.set_xlabel("epoch")
    ax.set_ylabel("epoch time (s)")
    ax.set_title(f"{args.keys:,} keys, {args.workers} workers: losing one of two hosts")
    ax.legend()
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
