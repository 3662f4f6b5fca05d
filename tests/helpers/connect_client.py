"""Run a counting pipeline with a live migration over a Spark Connect session.

Usage: ``python -m tests.helpers.connect_client URL STATE_DIR OUT_JSON``. It runs in its own
process because a Spark Connect client switches pyspark into remote mode for the whole process.
It runs :data:`EPOCHS` epochs with ``process()`` while a plan moves bins, then
:data:`STREAM_EPOCHS` more as a Structured Streaming query (``start()``, run on the server) over
files while a second plan moves bins back, and a third, posted from the client while the
stream runs the pipeline on the server, moves one more back there. Writes each epoch's outputs,
the final state, the workers, the metrics and how the posted plan went.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from megaphone import MigrationPlan, Move, Pipeline, PlanError
from megaphone.spark import is_connect, spark_session

EPOCHS = 5
STREAM_EPOCHS = 3
MOVES = [Move(b, b // 8, 2 + b % 2) for b in (1, 4, 6, 11)]  # 16 bins in two ranges


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


def _wait_for(path: Path, timeout: float = 120.0) -> None:
    """Wait for the sink to write ``path`` (a ``TimeoutError`` if it does not)."""
    deadline = time.time() + timeout
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} was not written within {timeout:.0f} s")
        time.sleep(0.1)


def _stale(pipe: Pipeline) -> str:
    """The error of a plan posted from a routing version the server has left (empty if none)."""
    try:
        pipe.migrate(MigrationPlan.from_moves(pipe.routing.truncated(0), [[MOVES[3]]]))
    except PlanError as exc:
        return str(exc)
    return ""


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
    # The stream: one input file per micro-batch, each written once the batch before is sunk;
    # a plan that moves two bins back is in flight when it starts, and once its two steps are
    # committed on the server a third plan is posted from here and runs there.
    inputs, sunk = base / "inputs", base / "sunk"
    inputs.mkdir()
    sunk.mkdir()
    pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[Move(m.bin, m.dst, m.src)]
                                                         for m in MOVES[:2]]))
    stream = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).json(str(inputs))
    pipe.start(stream, keep_outputs(str(sunk)), checkpoint_location=str(base / "query"))
    try:
        pipe.process(spark.createDataFrame([(1,)], "k long"))
        refused = ""
    except RuntimeError as exc:
        refused = str(exc)
    for i in range(STREAM_EPOCHS):
        if i == STREAM_EPOCHS - 1:
            stale = _stale(pipe)
            back = MOVES[2]
            handle = pipe.migrate(MigrationPlan.from_moves(
                pipe.routing, [[Move(back.bin, back.dst, back.src)]]))
        path = inputs / f"{i}.json"
        path.write_text("".join(json.dumps({"k": k}) + "\n" for k in batch_keys(EPOCHS + i)))
        _wait_for(sunk / f"{EPOCHS + i}.json")
    posted_done = handle.wait(120)
    posted = {"done": posted_done, "epochs": handle.progress.epochs,
              "owner": pipe.routing.owner(back.bin), "stale": stale}
    pipe.stop()
    for epoch in range(EPOCHS, EPOCHS + STREAM_EPOCHS):
        outputs[epoch] = json.loads((sunk / f"{epoch}.json").read_text())
    state = {row[0]: row[1] for row in pipe.state().collect()}
    with open(out, "w") as fh:
        json.dump({"outputs": outputs, "state": state, "workers": pipe.routing.workers(),
                   "in_flight": len(pipe.in_flight), "epoch": pipe.epoch, "refused": refused,
                   "owners": [pipe.routing.owner(m.bin) for m in MOVES],
                   "records_in": [m["records_in"] for m in pipe.metrics()],
                   "posted": posted}, fh)
    pipe.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
