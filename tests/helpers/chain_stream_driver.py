"""Run NEXMark Q4's chain on a file stream (``Chain.start``) with live rescales, resuming
after crashes (tests/test_chain_stream.py).

Usage: ``python -m tests.helpers.chain_stream_driver STATE_DIR SOURCE CHECKPOINT SINK OUT``.
SOURCE holds one parquet file per epoch, Q4's first-stage input
(:func:`tests.test_chain_stream.write_source`). The query reads one file per micro-batch
(``availableNow``) with the query checkpoint CHECKPOINT; its sink appends one JSON line per
delivery to SINK (``{"epoch": ..., "rows": [[category, average, auctions], ...]}``) and, at
epoch 0, submits two live plans (batched, from epoch 1 on): stage 0 from 2 to 3 workers,
stage 1 from 2 to 4. At the end OUT (JSON) gets each stage's epoch when opened and at the end, its
workers, its plans in flight, the epochs of its metrics records and each epoch's job runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from megaphone import rescale
from megaphone.nexmark.queries import Q4
from megaphone.spark import spark_session

NUM_BINS = 16


def main(state_dir: str, source: str, checkpoint: str, sink_path: str, out: str) -> None:
    spark = spark_session("local[2]", "chain-stream-driver")
    query = Q4(spark, state_dir, workers=2, num_bins=NUM_BINS)
    stages = query.stages
    opened = [s.epoch for s in stages]

    def sink(outputs, epoch: int) -> None:
        rows = sorted(list(r) for r in query.rows(outputs.toArrow()))
        with open(sink_path, "a") as fh:
            fh.write(json.dumps({"epoch": epoch, "rows": rows}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if epoch == 0:  # while the stream runs: the steps run at epochs 1 and 2
            stages[0].migrate(rescale(stages[0], workers=3, strategy="batched", per_worker=3))
            stages[1].migrate(rescale(stages[1], workers=4, strategy="batched", per_worker=2))

    schema = spark.read.parquet(str(Path(source) / "part-000.parquet")).schema
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
    streaming = query.chain.start(stream, sink, trigger={"availableNow": True},
                                  checkpoint_location=checkpoint)
    streaming.awaitTermination(240)
    error = streaming.exception()
    query.chain.stop()
    if error is not None:
        raise RuntimeError(f"the query failed: {error}")
    with open(out, "w") as fh:
        json.dump({"opened": opened, "epochs": [s.epoch for s in stages],
                   "workers": [s.routing.workers() for s in stages],
                   "in_flight": [len(s.in_flight) for s in stages],
                   "metric_epochs": [[m["epoch"] for m in s.metrics()] for s in stages],
                   "job_attempts": [{m["epoch"]: m["job_attempts"] for m in s.metrics()}
                                    for s in stages]}, fh)
    query.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
