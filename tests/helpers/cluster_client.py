"""Drive a counting pipeline on a Spark standalone cluster of two simulated hosts (their
executors cannot see the driver's directory), and record what happened.

Usage: ``python -m tests.helpers.cluster_client MASTER STATE_DIR LOCAL_DIR OUT_JSON
[CHECKPOINT PAUSE_AFTER]``. Without a checkpoint location it runs one epoch (which must fail
loudly). With one, it runs :data:`EPOCHS` epochs with a migration plan in flight that scales
out from 2 to 4 workers; after epoch ``PAUSE_AFTER`` it writes ``OUT_JSON.paused`` and waits for
``OUT_JSON.resume`` (the test kills a host meanwhile). Moving bins travel as files, so that with
homes each goes home to home.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from megaphone import MigrationPlan, Move, Pipeline
from megaphone.inspect_cmd import describe
from megaphone.spark import spark_session
from tests.helpers.cluster import CLUSTER_CONF

#: Epochs of the checkpointed run, and the bins, keys and seed of its plan and batches.
EPOCHS, NUM_BINS, KEYS, SEED = 8, 16, 60, 7


def batch_keys(epoch: int) -> list[int]:
    """The keys of epoch ``epoch``'s batch (the test recomputes them for its reference)."""
    rng = random.Random(SEED * 1000 + epoch)
    return [rng.randrange(KEYS) for _ in range(40)]


def plan_moves(owners: list[int]) -> list[list[tuple[int, int, int]]]:
    """A seeded random fluid plan: half the bins, one per step, onto workers 0-3 (workers 2
    and 3 get their first bins at its first and second steps)."""
    rng = random.Random(SEED)
    bins = rng.sample(range(NUM_BINS), NUM_BINS // 2)
    steps = []
    for b in bins:
        dst = rng.choice([w for w in range(4) if w != owners[b]])
        steps.append([(b, owners[b], dst)])
        owners[b] = dst
    return steps


def main(master: str, state_dir: str, local_dir: str, out: str, checkpoint: str | None = None,
         pause_after: str | None = None) -> None:
    spark = spark_session(master, "megaphone-cluster-test", CLUSTER_CONF)
    pipe = Pipeline(spark, state_dir, key="k", update="count", workers=2, num_bins=NUM_BINS,
                    key_type="int64", local_dir=local_dir, checkpoint=checkpoint,
                    transfer="files")
    result: dict = {"outputs": {}, "restored": {}, "ran_on": {}, "away": {}, "remote": {},
                    "unreachable": {}, "homes": {}, "hosts": {}, "moved": {}}
    try:
        if checkpoint is None:
            pipe.process(spark.createDataFrame([(k,) for k in range(40)], "k long"))
        for epoch in range(EPOCHS if checkpoint is not None else 0):
            if epoch == 1:
                owners = [int(w) for w in pipe.routing.owners()]
                steps = [[Move(*m) for m in step] for step in plan_moves(owners)]
                pipe.migrate(MigrationPlan.from_moves(pipe.routing, steps))
            table = pipe.process_arrow(
                spark.createDataFrame([(k,) for k in batch_keys(epoch)], "k long"))
            result["outputs"][epoch] = dict(zip(table.column(0).to_pylist(),
                                                table.column(1).to_pylist(), strict=True))
            record = pipe.metric_records(last=1)[0]
            for w, m in record.per_worker.items():
                if m.restored:
                    result["restored"].setdefault(w, []).append(epoch)
            result["ran_on"][epoch] = {w: m.host for w, m in record.per_worker.items() if m.host}
            result["away"][epoch] = record.away
            commit = pipe.state_dir.read_commit()
            result["homes"][epoch], result["hosts"][epoch] = commit.homes, commit.hosts
            result["remote"][epoch] = sorted(w for w, m in record.per_worker.items() if m.remote)
            result["moved"][epoch] = {w: [m.bytes_in, m.h2h_bytes or 0, m.across_bytes or 0]
                                      for w, m in record.per_worker.items() if m.bins_in}
            result["unreachable"][epoch] = sorted(w for w, m in record.per_worker.items()
                                                  if m.home_unreachable)
            if pause_after is not None and epoch == int(pause_after):
                Path(out + ".paused").write_text(str(epoch))
                deadline = time.monotonic() + 300
                while not Path(out + ".resume").exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
        if checkpoint is not None:
            result["state"] = {r[0]: r[1] for r in pipe.state().collect()}
            result["owners"] = [int(w) for w in pipe.routing.owners()]
        result["error"] = None
    except Exception as exc:  # what the user sees
        result["error"] = str(exc)
    result["executors"] = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    result["epoch"] = pipe.epoch
    pipe.close()
    if checkpoint is not None and result["error"] is None:  # inspect reads a closed pipeline
        result["inspect_homes"] = describe(state_dir)["homes"]
    with open(out, "w") as fh:
        json.dump(result, fh)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
