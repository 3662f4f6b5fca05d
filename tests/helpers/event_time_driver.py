"""Run event-time operators with migration plans to the end, resuming after crashes: a chain
of a window sum (tumbling 4 s) and a max per window, and a left-outer join within 3 s.

Usage: ``python -m tests.helpers.event_time_driver ROOT OUT_JSON [KILL_BETWEEN_AT_EPOCH]``.
Each epoch's input is a pure function of the epoch number, so a resumed run sees the same
input. With KILL_BETWEEN_AT_EPOCH the process kills itself between the chain's two stages at
that epoch (the first stage committed it, the second did not). At the end every epoch's
outputs of the chain and the join are written to OUT_JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from megaphone import Chain, Join, MigrationPlan, Move, Pipeline, WindowAggregate, join_input
from megaphone.spark import spark_session

EPOCHS = 7
PLAN_EPOCH = 2
SECOND = 1_000_000
EPOCH0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
WINDOW_US, WITHIN_US = 4 * SECOND, 3 * SECOND


def ts(seconds: int) -> dt.datetime:
    return EPOCH0 + dt.timedelta(seconds=seconds)


def window_records(epoch: int) -> list[tuple[str, int, int]]:
    """(key, second, value) of the window chain's batch at ``epoch``; every 7th is late."""
    out = []
    for i in range(12):
        second = epoch * 3 + i % 4 - (6 if i % 7 == 6 else 0)
        out.append((f"k{(epoch + i) % 5}", second, (epoch * 13 + i * 7) % 20))
    return out


def join_records(epoch: int) -> list[tuple[int, int, str, int]]:
    """(key, second, side, x) of the join's batch at ``epoch``."""
    return [((epoch + i) % 4, epoch * 2 + i % 3, "left" if (epoch + i) % 3 else "right",
             epoch * 10 + i) for i in range(8)]


def main(root: str, out: str, kill_between: str | None = None) -> None:
    spark = spark_session("local[2]", "event-time-driver")
    base = Path(root)
    common = {"workers": 2, "num_bins": 16, "keep_outputs": 100}
    windows = Pipeline(spark, str(base / "windows"), key="k", value="v", event_time="t",
                       update=WindowAggregate(size_us=WINDOW_US, agg="sum"), key_type="str",
                       pipeline_id="et-windows", transfer="files", **common)
    best = Pipeline(spark, str(base / "best"), key="end", value="v", update="max",
                    key_type="int64", pipeline_id="et-best", **common)
    join = Pipeline(spark, str(base / "join"), key="key", value="value", event_time="time",
                    update=Join(how="left", within_us=WITHIN_US), key_type="int64",
                    pipeline_id="et-join", transfer="rows", **common)

    if kill_between is not None:  # once the first stage recorded the epoch it committed
        recorded = windows._holder.recorded

        def recorded_then_killed(records, trace) -> None:
            recorded(records, trace)
            if records[-1].epoch == int(kill_between):
                os.killpg(os.getsid(0), signal.SIGKILL)

        windows._holder.recorded = recorded_then_killed

    def link(outputs: DataFrame) -> DataFrame:
        return outputs.select(F.unix_micros(outputs.output.end).alias("end"),
                              outputs.output.value.alias("v"))

    chain = Chain([windows, best], [link])
    for epoch in range(EPOCHS):
        for pipe in (windows, best, join):
            if epoch == PLAN_EPOCH and pipe.routing.version == 0 and not pipe.in_flight and \
                    pipe.epoch < epoch:
                moves = [Move(b, pipe.routing.owner(b), 2 + b % 2) for b in (9, 12, 2, 7, 13)]
                pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[m] for m in moves]))
        if join.epoch < epoch:
            rows = join_records(epoch)
            left = spark.createDataFrame([(k, ts(s), x) for k, s, side, x in rows
                                          if side == "left"], "id long, at timestamp, x long")
            right = spark.createDataFrame([(k, ts(s), x) for k, s, side, x in rows
                                           if side == "right"], "seller long, at timestamp, y long")
            join.process(join_input(left, right, "id", "seller", "at"))
        if chain.epoch < epoch:
            chain.process(spark.createDataFrame(
                [(k, ts(s), v) for k, s, v in window_records(epoch)],
                "k string, t timestamp, v long"))
    result = {"best": {}, "join": {}, "workers": [p.routing.workers() for p in (windows, join)],
              "late": sum(m["late_records"] for p in (windows, join) for m in p.metrics())}
    for epoch in range(EPOCHS):
        table = best.state_dir.read_outputs(epoch)
        result["best"][epoch] = sorted(zip(table.column(0).to_pylist(),
                                           table.column(1).to_pylist(), strict=True))
        pairs = []
        for row in join.state_dir.read_outputs(epoch).to_pylist():
            left, right = row["output"]["left"], row["output"]["right"]
            pairs.append([row["key"], left and left["x"], right and right["y"]])
        result["join"][epoch] = sorted(pairs, key=repr)
    with open(out, "w") as fh:
        json.dump(result, fh)
    for pipe in (windows, best, join):
        pipe.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
