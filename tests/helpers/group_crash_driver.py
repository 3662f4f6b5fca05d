"""Run a backlog of epochs in groups with a plan step at a group boundary, resuming after
crashes (tests/test_groups_recovery.py).

Usage: ``python -m tests.helpers.group_crash_driver STATE_DIR OUT_JSON``. The backlog is one
DataFrame with an epoch column (labels 0..EPOCHS-1, each a pure function of its label); a
resumed run processes the labels after the last one committed. Groups hold 4 epochs; the plan
moves bins at epoch 4, so the groups are 0..3 and 4..7. At the end the outputs of every epoch,
the final state and the groups the metrics show are written to OUT_JSON.
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

from megaphone import MigrationPlan, Move, Pipeline, PlanStep
from megaphone.spark import spark_session
from tests.helpers.crash_driver import batch_keys, write_results

EPOCHS = 8
PLAN_EPOCH = 4
MOVES = (Move(0, 0, 2), Move(9, 1, 2), Move(5, 0, 3), Move(14, 1, 3))


def main(state_dir: str, out: str) -> None:
    spark = spark_session("local[2]", "group-crash-driver")
    pipe = Pipeline(spark, state_dir, key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", pipeline_id="group-crash-test", keep_outputs=100,
                    group_size=4)
    if pipe.routing.version == 0 and not pipe.in_flight:
        pipe.migrate(MigrationPlan(pipe.fingerprint, 0, (PlanStep(PLAN_EPOCH, MOVES),)))
    rows = [(k, e) for e in range(EPOCHS) for k in batch_keys(e)]
    backlog = spark.createDataFrame(rows, "k long, e long")
    done = -1 if pipe.label is None else pipe.label
    pipe.process_arrow(backlog.where(F.col("e") > done), epoch_column="e")
    write_results(pipe, out, EPOCHS, groups={m["epoch"]: m["group"] for m in pipe.metrics()})
    pipe.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:3])
