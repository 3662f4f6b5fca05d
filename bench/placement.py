"""Placement: where workers' state lives on two hosts, before homes and with them, side by side.

Starts the two simulated hosts of ``tests/helpers/cluster.py`` (a Spark standalone master and two
single-core workers on 127.0.0.1, each in its own mount namespace: needs root) and runs the same
checkpointed keyed count twice in one run, each on fresh state: first as before homes
(``MEGAPHONE_PLACEMENT=0`` on the driver: a task uses its own host's copy and catches it up),
then with homes (docs/placement.md: a task away from its worker's home uses the store there).
Each run loads ``--keys`` keys on ``--workers`` workers, runs ``--epochs`` steady epochs of
``--records`` records, reads the working copies' bytes on each host, then loses host 1 (every
process in its namespace, store services too) and runs ``--after`` epochs on host 0. Printed per
run: restores (and catch-ups) per steady epoch after ``--warmup``, tasks away from home and
those that reached their home, working-copy bytes per host against one copy, epoch p50, the
epochs after the loss, and whether the final state counts every record once.

With ``--scale-out`` (2 by default), the run starts on ``--workers - 2`` workers on host 0 alone
(host 1 is stopped before the load and joins, empty, three epochs before the scale-out), and the
last warm-up epoch moves every other bin of the first workers to the two new ones, as files:
with homes, the new workers are homed on the new host (the host with the fewest homes).
Printed for that epoch: the bytes of the moved bins whose sender's home and receiver's host
differ, the bytes the receivers counted times the host boundaries each crossed (docs/placement.md,
step 7: with homes each bin is pulled home to home, so the two are equal, 1.0x), the bytes
pulled home to home, and the new workers' homes.

    python bench/placement.py
    python bench/placement.py --keys 1e7 --json bench/results/placement/run1.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megaphone
from bench.epoch_floor import epoch_frame, machine
from megaphone import MigrationPlan, Move
from megaphone.paths import host_id_path, local_stores_path
from megaphone.spark import spark_session
from tests.helpers.cluster import CLUSTER_CONF, kill_host, namespaces_permitted, two_hosts

RUNS = {"before homes": "0", "homes": "1"}


def worker_bytes(proc, stores: Path) -> dict[str, int]:
    """Bytes of each worker's working copy under ``stores`` as the simulated host of ``proc``
    sees them (by the copy's folder name)."""
    root = Path(f"/proc/{proc.pid}/root") / stores.relative_to("/")
    if not root.is_dir():
        return {}
    return {d.name: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
            for d in sorted(root.iterdir()) if d.is_dir()}


def copies(per_host: list[dict[str, int]]) -> float:
    """Working copies held, in units of one copy: all hosts' bytes over the bytes of each
    worker's largest copy (a host holding every worker once and no other copy is 1.0)."""
    largest: dict[str, int] = {}
    for host in per_host:
        for worker, size in host.items():
            largest[worker] = max(largest.get(worker, 0), size)
    return sum(sum(h.values()) for h in per_host) / max(1, sum(largest.values()))


def wait_for_executors(spark, count: int, timeout: float = 120) -> None:
    """Wait until ``count`` executors (the driver not counted) are registered."""
    deadline = time.monotonic() + timeout
    while len(spark.sparkContext.statusTracker().getExecutorInfos()) - 1 < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} executors after {timeout:.0f} s")
        time.sleep(0.5)


def run_once(hosts, name: str, args: argparse.Namespace) -> dict:
    """One run on fresh state: load, steady epochs, copies per host, host 1 lost, epochs."""
    os.environ["MEGAPHONE_PLACEMENT"] = RUNS[name]
    hosts.ensure_hosts()
    spark = spark_session(hosts.master, f"placement-{RUNS[name]}", CLUSTER_CONF)
    tag = name.replace(" ", "-")
    pipe = megaphone.Pipeline(
        spark, str(hosts.hidden / f"state-{tag}"), key="key", update="count",
        workers=args.workers - args.scale_out, num_bins=args.bins,
        local_dir=str(hosts.hidden / "local"), checkpoint=str(hosts.shared / f"checkpoint-{tag}"),
        transfer="files")
    epochs: list[dict] = []
    scale_out: dict = {}
    rejoin = args.warmup - 4 if args.scale_out else None
    try:
        if rejoin is not None:  # the first workers live on host 0; host 1 joins later
            kill_host(hosts.procs[2])
        t0 = time.perf_counter()
        pipe.process_arrow(spark.range(args.keys, numPartitions=2)
                           .withColumnRenamed("id", "key"))
        load_s = time.perf_counter() - t0
        for i in tqdm(range(args.epochs + args.after), desc=name, leave=False):
            if i == rejoin:
                hosts.ensure_hosts()
                wait_for_executors(spark, 2)
            if i == args.epochs:
                stores = local_stores_path(hosts.hidden / "local", pipe.fingerprint.pipeline_id)
                held = [worker_bytes(hosts.procs[1 + h], stores) for h in (0, 1)]
                kill_host(hosts.procs[2])
            moves = scale_out_moves(pipe, args) if i == args.warmup - 1 and args.scale_out else []
            if moves:
                sizes, homes = pipe.bin_sizes().bytes, pipe.state_dir.read_commit().worker_homes()
                pipe.migrate(MigrationPlan.from_moves(pipe.routing, [moves]))
            t0 = time.perf_counter()
            pipe.process_arrow(epoch_frame(spark, i + 1, args.records, args.keys))
            seconds = time.perf_counter() - t0
            m = pipe.metric_records(last=1)[0]
            if moves:
                scale_out = moved_across(m, moves, sizes, homes,
                                         pipe.state_dir.read_commit().worker_homes(),
                                         host_names(hosts), enforced=RUNS[name] == "1")
            epochs.append({
                "epoch_s": seconds,
                "restores": sum(1 for w in m.per_worker.values() if w.restored),
                "catch_ups": sum(1 for w in m.per_worker.values()
                                 if w.restored and w.restored.get("since") is not None),
                "away": len(m.away),
                "remote": sum(1 for w in m.per_worker.values() if w.remote),
                "tasks": sum(1 for w in m.per_worker.values() if w.records_in is not None)})
        total = pipe.state().groupBy().sum("state").first()[0]
    finally:
        pipe.close()
        spark.stop()
    return {"load_s": load_s, "epochs": epochs, "copy_bytes": held, "state_total": total,
            "expected_total": args.keys + args.records * (args.epochs + args.after),
            "scale_out": scale_out}


def scale_out_moves(pipe, args: argparse.Namespace) -> list[Move]:
    """Every other bin of each of the first workers, to the ``--scale-out`` new workers."""
    owners = pipe.routing.owners()
    first = args.workers - args.scale_out
    return [Move(b, int(owners[b]), first + (b // 2) % args.scale_out)
            for b in range(len(owners)) if b % 2]


def host_names(hosts) -> dict[str, str]:
    """``host 0`` and ``host 1`` by their host ids (read on each host's own disk)."""
    names = {}
    for h in (0, 1):
        path = host_id_path(hosts.hidden / "local")
        with contextlib.suppress(OSError):
            root = Path(f"/proc/{hosts.procs[1 + h].pid}/root")
            names[(root / path.relative_to("/")).read_text().strip()] = f"host {h}"
    return names


def moved_across(m, moves: list[Move], sizes, before: dict[int, str], after: dict[int, str],
                 names: dict[str, str], enforced: bool) -> dict:
    """The scale-out epoch's bin bytes: of the moved bins whose sender's home differs from the
    host that received them (with homes ``enforced``, the receiver's home after the epoch, else
    where its task ran), counted by the receivers times the host boundaries crossed, and pulled
    home to home. Before homes a sender's bytes leave from where its export task ran, not
    from its recorded home, so the bins that changed host are approximate there."""
    received = {w: (after.get(w) if enforced else None) or wm.host
                for w, wm in m.per_worker.items()}
    changed = sum(int(sizes[mv.bin]) for mv in moves if before.get(mv.src) != received[mv.dst])
    workers = m.per_worker.values()
    return {"moved_bytes": int(sum(int(sizes[mv.bin]) for mv in moves)),
            "changed_host_bytes": changed,
            "across_bytes": sum(w.across_bytes or 0 for w in workers),
            "h2h_bytes": sum(w.h2h_bytes or 0 for w in workers),
            "new_homes": {w: names.get(after.get(w), after.get(w))
                          for w in sorted({mv.dst for mv in moves})},
            "epoch_s": m.duration_s}


def summary(run: dict, args: argparse.Namespace) -> dict:
    """The figures compared: per steady epoch after the warm-up, and after the loss."""
    steady = run["epochs"][args.warmup:args.epochs]
    after = run["epochs"][args.epochs:]
    tasks = sum(e["tasks"] for e in steady)
    return {
        "restores_per_epoch": sum(e["restores"] for e in steady) / len(steady),
        "catch_ups_per_epoch": sum(e["catch_ups"] for e in steady) / len(steady),
        "away_share": sum(e["away"] for e in steady) / tasks,
        "remote_share": sum(e["remote"] for e in steady) / tasks,
        "epoch_p50_s": statistics.median(e["epoch_s"] for e in steady),
        "copy_bytes": [sum(h.values()) for h in run["copy_bytes"]],
        "copies": copies(run["copy_bytes"]),
        "after_loss_max_s": max(e["epoch_s"] for e in after),
        "after_loss_p50_s": statistics.median(e["epoch_s"] for e in after),
        "restores_after_loss": sum(e["restores"] for e in after),
        "exact": run["state_total"] == run["expected_total"],
        "scale_out": run["scale_out"],
    }


def main(argv: list[str] | None = None) -> int:
    """Run before homes and with homes on two simulated hosts; print the comparison."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--records", type=lambda s: int(float(s)), default=20_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--bins", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=40, help="steady epochs before the loss")
    p.add_argument("--warmup", type=int, default=10, help="steady epochs not counted")
    p.add_argument("--after", type=int, default=5, help="epochs after host 1 is lost")
    p.add_argument("--scale-out", type=int, default=2, help="new workers after the warm-up")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not 0 <= args.warmup < args.epochs or args.after < 1:
        p.error("need 0 <= --warmup < --epochs and --after >= 1")
    if not 0 <= args.scale_out < args.workers or (args.scale_out and args.warmup < 4):
        p.error("need 0 <= --scale-out < --workers, and --warmup >= 4 to scale out")
    mach = machine()
    command = "python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    print(f"# placement: nproc {mach['nproc']}, {mach['platform']}, PySpark {mach['pyspark']}")
    print(f"# command: {command}")
    with tempfile.TemporaryDirectory(prefix="placement-") as tmp:
        base = Path(tmp)
        if not namespaces_permitted(base / "probe"):
            print("mount namespaces are not permitted here (needs root)", file=sys.stderr)
            return 2
        with two_hosts(base) as hosts:
            runs = {name: run_once(hosts, name, args) for name in RUNS}
    rows = {name: summary(run, args) for name, run in runs.items()}
    print(f"\n## {args.keys:,} keys, {args.records:,} records per epoch, {args.workers} workers "
          f"on 2 hosts of 1 core; steady epochs {args.warmup}-{args.epochs - 1}, then host 1 "
          f"lost and {args.after} epochs")
    print("| | restores / epoch | catch-ups / epoch | tasks away | away, at home's store | "
          "copy bytes host 0 + host 1 | copies | epoch p50 s | after loss p50 / max s | exact |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['restores_per_epoch']:.2f} | {r['catch_ups_per_epoch']:.2f} | "
              f"{r['away_share']:.0%} | {r['remote_share']:.0%} | "
              f"{r['copy_bytes'][0]:,} + {r['copy_bytes'][1]:,} | {r['copies']:.2f} | "
              f"{r['epoch_p50_s']:.2f} | "
              f"{r['after_loss_p50_s']:.2f} / {r['after_loss_max_s']:.2f} | {r['exact']} |")
    before, homes = rows["before homes"], rows["homes"]
    ratio = sum(homes["copy_bytes"]) / max(1, sum(before["copy_bytes"]))
    print(f"\nepoch p50 with homes / before: {homes['epoch_p50_s'] / before['epoch_p50_s']:.2f}x; "
          f"copy bytes with homes / before: {ratio:.2f}x")
    if args.scale_out:
        print(f"\n## scale-out {args.workers - args.scale_out} -> {args.workers} workers at "
              f"warm-up epoch {args.warmup - 1}: bytes of moved bins")
        print("| | moved | changed host | across hosts (x crossings) | across / changed host | "
              "home to home | new workers' homes | epoch s |")
        print("|---|---:|---:|---:|---:|---:|---|---:|")
        for name, r in rows.items():
            s = r["scale_out"]
            ratio = s["across_bytes"] / s["changed_host_bytes"] if s["changed_host_bytes"] \
                else float("nan")
            print(f"| {name} | {s['moved_bytes']:,} | {s['changed_host_bytes']:,} | "
                  f"{s['across_bytes']:,} | {ratio:.2f}x | {s['h2h_bytes']:,} | "
                  f"{s['new_homes']} | {s['epoch_s']:.2f} |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": command, "machine": mach,
            "config": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
            "summary": rows}, indent=2) + "\n")
    return 0 if all(r["exact"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
