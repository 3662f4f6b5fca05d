"""Run a counting pipeline with a live migration over a Spark Connect session.

Usage: ``python -m tests.helpers.connect_client URL STATE_DIR OUT_JSON``. It runs in its own
process because a Spark Connect client switches pyspark into remote mode for the whole process.
Writes each epoch's outputs, the final state, the workers and what ``start()`` said.
"""

from __future__ import annotations

import json
import sys

from megaphone import MigrationPlan, Move, Pipeline
from megaphone.spark import is_connect, spark_session

EPOCHS = 5
MOVES = [Move(b, b % 2, 2 + b % 2) for b in (1, 4, 6, 11)]


def batch_keys(epoch: int) -> list[int]:
    """The keys of epoch ``epoch``'s batch."""
    return [(epoch * 5 + i * 7) % 30 for i in range(25)]


def main(url: str, state_dir: str, out: str) -> None:
    spark = spark_session(url)
    assert is_connect(spark), type(spark)
    pipe = Pipeline(spark, state_dir, key="k", update="count", workers=2, num_bins=16,
                    key_type="int64")
    outputs = {}
    for epoch in range(EPOCHS):
        if epoch == 1:
            pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[m] for m in MOVES]))
        frame = pipe.process(spark.createDataFrame([(k,) for k in batch_keys(epoch)], "k long"))
        outputs[epoch] = {row[0]: row[1] for row in frame.collect()}
    try:
        pipe.start(spark.readStream.format("rate").load(), lambda df, epoch: None)
        started = "started"
    except NotImplementedError as exc:
        started = str(exc)
    state = {row[0]: row[1] for row in pipe.state().collect()}
    with open(out, "w") as fh:
        json.dump({"outputs": outputs, "state": state, "workers": pipe.routing.workers(),
                   "in_flight": len(pipe.in_flight), "start": started,
                   "records_in": [m["records_in"] for m in pipe.metrics()]}, fh)
    pipe.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
