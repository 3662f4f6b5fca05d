"""Run a small counting pipeline with a migration plan to the end (resuming after crashes).

Usage: ``python -m tests.helpers.crash_driver STATE_DIR STRATEGY OUT_JSON [CHECKPOINT]`` (with a
checkpoint location, workers have homes and bins moving as files go home to home). Each epoch's
batch is a pure function of the epoch number, so a resumed run sees the same input. At the end the
outputs of every epoch and the final state are written to OUT_JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from megaphone import MigrationPlan, Move, Pipeline, ShareThreshold
from megaphone.spark import spark_session

EPOCHS = 6
PLAN_EPOCH = 2
MOVES = [Move(b, b // 8, 2 + b % 2) for b in (0, 5, 9, 14)]  # 16 bins in two ranges


#: The hot key: 20 of each epoch's 50 records, so the pipeline splits it (dual mode) from epoch 1.
HOT_KEY = 1


def batch_keys(epoch: int) -> list[int]:
    """The keys of epoch ``epoch``'s batch: 30 spread over 40 keys, and 20 of :data:`HOT_KEY`."""
    return [(epoch * 7 + i * 3) % 40 for i in range(30)] + [HOT_KEY] * 20


def main(state_dir: str, strategy: str, out: str, checkpoint: str | None = None) -> None:
    spark = spark_session("local[2]", "crash-driver")
    # fluid ships its bins as files, all-at-once as rows: the chains cover both transfers.
    pipe = Pipeline(spark, state_dir, key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", pipeline_id="crash-test", keep_outputs=100,
                    transfer="files" if strategy == "fluid" else "rows", checkpoint=checkpoint)
    pipe.split_hot_keys(ShareThreshold(share=0.2, min_records=10))  # crashes while split
    while pipe.epoch + 1 < EPOCHS:
        epoch = pipe.epoch + 1
        if epoch == PLAN_EPOCH and pipe.routing.version == 0 and not pipe.in_flight:
            steps = [MOVES] if strategy == "all-at-once" else [[m] for m in MOVES]
            pipe.migrate(MigrationPlan.from_moves(pipe.routing, steps, strategy=strategy))
        pipe.process(spark.createDataFrame([(k,) for k in batch_keys(epoch)], "k long"))
    write_results(pipe, out, files_in=sum(w.get("files_in") or 0 for m in pipe.metrics()
                                          for w in m["per_worker"].values()),
                  split_records=sum(m["split_records"] or 0 for m in pipe.metrics()),
                  h2h_bytes=sum(w.get("h2h_bytes") or 0 for m in pipe.metrics()
                                for w in m["per_worker"].values()))
    pipe.close()
    spark.stop()


def write_results(pipe: Pipeline, out: str, epochs: int = EPOCHS, **extra: Any) -> None:
    """Write what a crash test compares to ``out`` (JSON): the stored outputs of epochs 0 to
    ``epochs - 1``, the final state, the workers, who recovery rolled back and the job attempts,
    and ``extra``."""
    outputs = {}
    for epoch in range(epochs):
        table = pipe.state_dir.read_outputs(epoch)
        outputs[epoch] = dict(zip(table.column(0).to_pylist(), table.column(1).to_pylist(),
                                  strict=True))
    state = {row[0]: row[1] for row in pipe.state().collect()}
    with open(out, "w") as fh:
        json.dump({"outputs": outputs, "state": state, "workers": pipe.routing.workers(),
                   "rolled_back": pipe.recovery.workers_rolled_back,
                   "job_attempts": sum(m.get("job_attempts", 1) for m in pipe.metrics()),
                   **extra}, fh)


if __name__ == "__main__":
    main(*sys.argv[1:5])
