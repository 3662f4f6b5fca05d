"""Run a counting pipeline with a live migration over a Spark Connect session.

Usage: ``python -m tests.helpers.connect_client URL STATE_DIR OUT_JSON``. It runs in its own
process because a Spark Connect client switches pyspark into remote mode for the whole process.
It runs :data:`EPOCHS` epochs with ``process()`` while a plan moves bins, then
:data:`STREAM_EPOCHS` more as a Structured Streaming query (``start()``, run on the server) over
files while a second plan moves bins back. Writes each epoch's outputs, the final state, the
workers and the metrics.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from megaphone import MigrationPlan, Move, Pipeline
from megaphone.spark import is_connect, spark_session

EPOCHS = 5
STREAM_EPOCHS = 3
MOVES = [Move(b, b % 2, 2 + b % 2) for b in (1, 4, 6, 11)]


def batch_keys(epoch: int) -> list[int]:
    """The keys of epoch ``epoch``'s batch."""
    return [(epoch * 5 + i * 7) % 30 for i in range(25)]


def keep_outputs(folder: str) -> object:
    """A sink (it runs on the server) that keeps each epoch's outputs as a JSON file."""
    def sink(frame, epoch: int) -> None:
        rows = {str(r[0]): r[1] for r in frame.collect()}
        with open(os.path.join(folder, f"{epoch}.json"), "w") as fh:
            json.dump(rows, fh)
    return sink


def main(url: str, state_dir: str, out: str) -> None:
    spark = spark_session(url)
    assert is_connect(spark), type(spark)
    base = Path(state_dir).parent
    pipe = Pipeline(spark, state_dir, key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", checkpoint=str(base / "checkpoint"))
    outputs = {}
    for epoch in range(EPOCHS):
        if epoch == 1:
            pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[m] for m in MOVES]))
        frame = pipe.process(spark.createDataFrame([(k,) for k in batch_keys(epoch)], "k long"))
        outputs[epoch] = {row[0]: row[1] for row in frame.collect()}
    # The stream: one input file per micro-batch, all of them read by an availableNow query;
    # a plan that moves the bins back is in flight when it starts.
    inputs, sunk = base / "inputs", base / "sunk"
    inputs.mkdir()
    sunk.mkdir()
    for i in range(STREAM_EPOCHS):
        path = inputs / f"{i}.json"
        path.write_text("".join(json.dumps({"k": k}) + "\n" for k in batch_keys(EPOCHS + i)))
        os.utime(path, (1e9 + i, 1e9 + i))  # the file source takes files in this order
    pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[Move(m.bin, m.dst, m.src)]
                                                         for m in MOVES[:2]]))
    stream = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).json(str(inputs))
    query = pipe.start(stream, keep_outputs(str(sunk)), trigger={"availableNow": True},
                       checkpoint_location=str(base / "query"))
    try:
        pipe.process(spark.createDataFrame([(1,)], "k long"))
        refused = ""
    except RuntimeError as exc:
        refused = str(exc)
    query.awaitTermination()
    pipe.stop()
    for epoch in range(EPOCHS, EPOCHS + STREAM_EPOCHS):
        outputs[epoch] = json.loads((sunk / f"{epoch}.json").read_text())
    state = {row[0]: row[1] for row in pipe.state().collect()}
    with open(out, "w") as fh:
        json.dump({"outputs": outputs, "state": state, "workers": pipe.routing.workers(),
                   "in_flight": len(pipe.in_flight), "epoch": pipe.epoch, "refused": refused,
                   "owners": [pipe.routing.owner(m.bin) for m in MOVES],
                   "records_in": [m["records_in"] for m in pipe.metrics()]}, fh)
    pipe.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
