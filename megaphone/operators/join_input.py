"""Two streams as one input of a join pipeline: ``(key, time, value)`` rows whose ``value`` is
``struct<left, right>`` with one side set, so both sides route by the same bins."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def join_input(left: DataFrame, right: DataFrame, left_key: str, right_key: str,
               left_time: str, right_time: str | None = None, *, key: str = "key",
               time: str = "time") -> DataFrame:
    """One DataFrame of both sides of a join (:class:`megaphone.operators.Join`): columns
    ``key`` (the join key, the right one cast to the left one's type), ``time`` (the row's event
    time) and ``value``: ``struct<left: struct<left's columns>, right: struct<right's
    columns>>`` with the other side null. Give it to a pipeline with ``key=key``,
    ``value="value"``, ``event_time=time``.

    >>> pipe = Pipeline(spark, "/tmp/q", key="key", value="value", event_time="time",
    ...                 update=Join(within_us=duration_us("10 s")))  # doctest: +SKIP
    >>> pipe.process(join_input(persons, auctions, "id", "seller", "date_time"))
    ... # doctest: +SKIP
    """
    right_time = right_time or left_time
    left_row = F.struct(*[F.col(c) for c in left.columns])
    right_row = F.struct(*[F.col(c) for c in right.columns])
    left_type = left.select(left_row.alias("r")).schema["r"].dataType
    right_type = right.select(right_row.alias("r")).schema["r"].dataType
    key_type = left.schema[left_key].dataType
    lefts = left.select(
        F.col(left_key).alias(key), F.col(left_time).cast("timestamp").alias(time),
        F.struct(left_row.alias("left"), F.lit(None).cast(right_type).alias("right"))
        .alias("value"))
    rights = right.select(
        F.col(right_key).cast(key_type).alias(key),
        F.col(right_time).cast("timestamp").alias(time),
        F.struct(F.lit(None).cast(left_type).alias("left"), right_row.alias("right"))
        .alias("value"))
    return lefts.unionByName(rights)
