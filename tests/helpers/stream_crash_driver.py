"""Run a file stream's backlog by its epoch column (``start(..., epoch_column=)``), resuming
after crashes (tests/test_groups_stream.py).

Usage: ``python -m tests.helpers.stream_crash_driver STATE_DIR SOURCE CHECKPOINT SINK OUT``.
The query reads the parquet files in SOURCE (columns ``k``, ``e``) once (``availableNow``),
with the query checkpoint CHECKPOINT; its sink appends one JSON line per delivery to SINK
(``{"epoch": ..., "rows": [[k, count, e], ...]}``). Groups hold 4 epochs and only 2 epochs'
outputs are kept: a replayed micro-batch must still find all of its own. At the end the final
state and the labels of the metrics records are written to OUT (JSON).
"""

from __future__ import annotations

import json
import os
import sys

from megaphone import Pipeline
from megaphone.spark import spark_session


def main(state_dir: str, source: str, checkpoint: str, sink_path: str, out: str) -> None:
    spark = spark_session("local[2]", "stream-crash-driver")
    pipe = Pipeline(spark, state_dir, key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", pipeline_id="stream-crash-test", keep_outputs=2,
                    group_size=4)

    def sink(outputs, epoch: int) -> None:
        rows = sorted([r["k"], r["count"], r["e"]] for r in outputs.collect())
        with open(sink_path, "a") as fh:
            fh.write(json.dumps({"epoch": epoch, "rows": rows}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    stream = spark.readStream.schema("k long, e long").parquet(source)
    query = pipe.start(stream, sink, trigger={"availableNow": True},
                       checkpoint_location=checkpoint, epoch_column="e")
    query.awaitTermination(240)
    error = query.exception()
    pipe.stop()
    if error is not None:
        raise RuntimeError(f"the query failed: {error}")
    state = {row[0]: row[1] for row in pipe.state().collect()}
    with open(out, "w") as fh:
        json.dump({"state": state, "epoch": pipe.epoch, "label": pipe.label,
                   "labels": [m.get("label") for m in pipe.metrics()],
                   "rolled_back": pipe.recovery.workers_rolled_back}, fh)
    pipe.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
