"""Run the session-window ``StatefulProcessor`` over batch files with a migration, resuming after
a crash: each epoch's input is its file (then one empty batch), so a resumed run sees the same
input.

Usage: ``python -m tests.helpers.processor_driver STATE_DIR OUT_JSON FILE...``. At the end
every epoch's kept outputs are written to OUT_JSON as a list of rows.
"""

from __future__ import annotations

import json
import sys

from megaphone import MigrationPlan, Move, Pipeline
from megaphone.spark import spark_session
from tests.helpers.spark_processors import DELAY, SESSION_OUT, Sessions, no_rows

PLAN_EPOCH = 1


def main(state_dir: str, out: str, *files: str) -> None:
    spark = spark_session("local[2]", "processor-driver")
    pipe = Pipeline(spark, state_dir, key="id", update=Sessions(), output_type=SESSION_OUT,
                    time_mode="EventTime", event_time="time", watermark_delay=DELAY,
                    workers=2, num_bins=16, keep_outputs=100, pipeline_id="tws-sessions",
                    key_type="str")
    frames = [spark.read.parquet(f) for f in files]
    frames.append(no_rows(frames[0]))
    for epoch, frame in enumerate(frames):
        if epoch == PLAN_EPOCH and pipe.routing.version == 0 and not pipe.in_flight and \
                pipe.epoch < epoch:
            moves = [Move(b, pipe.routing.owner(b), 2 + b % 2) for b in range(0, 16, 2)]
            pipe.migrate(MigrationPlan.from_moves(pipe.routing, [moves[:4], moves[4:]]))
        if pipe.epoch < epoch:
            pipe.process(frame)
    rows = []
    for epoch in range(len(frames)):
        rows += [list(r["output"].values()) for r in pipe.state_dir.read_outputs(epoch).to_pylist()]
    with open(out, "w") as fh:
        json.dump(rows, fh)
    pipe.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
