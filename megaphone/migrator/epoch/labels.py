"""A batch's epoch column, checked: its labels (one epoch per distinct value, in increasing
order) and each label's largest event time, read in one small Spark job before anything runs.
Bad input is refused with a clear error and changes nothing.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T


def check_epoch_column(schema: T.StructType, column: str, taken: dict[str, str | None]) -> None:
    """Refuse an epoch column the batch lacks, that is not integral, or that is also one of
    the pipeline's columns (``taken``: role -> column name)."""
    if column not in schema.names:
        raise ValueError(f"epoch column {column!r} not in the batch (columns: {schema.names})")
    for role, name in taken.items():
        if name == column:
            raise ValueError(f"the epoch column {column!r} is also the pipeline's {role} "
                             "column; give each epoch's records a column of their own")
    kind = schema[column].dataType
    if not isinstance(kind, T.IntegralType):
        raise TypeError(f"epoch column {column!r} is {kind.simpleString()}; epoch labels are "
                        "integers (tinyint, smallint, int or bigint)")


def scan_labels(batch: DataFrame, column: str, event_time: Column | None, last: int | None
                ) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """The distinct labels of ``batch``'s epoch ``column`` in increasing order (one job: a
    group-by on it), checked, and each label's largest ``event_time`` (the records' event time
    in microseconds; ``None`` where a label has none, or without ``event_time``)."""
    high = F.max(event_time) if event_time is not None else F.lit(None).cast("long")
    rows = batch.groupBy(F.col(column).alias("label")).agg(high.alias("high")).collect()
    found = sorted(((r["label"], r["high"]) for r in rows),
                   key=lambda r: (r[0] is not None, r[0] or 0))
    if found and found[0][0] is None:
        raise ValueError(f"epoch column {column!r} holds nulls: every record needs its epoch")
    if found and found[0][0] < 0:
        raise ValueError(f"epoch column {column!r} holds negative labels ({found[0][0]}); "
                         "labels are integers >= 0")
    if found and last is not None and found[0][0] <= last:
        raise ValueError(
            f"epoch column {column!r} holds label {found[0][0]}, but the pipeline committed "
            f"label {last} already: labels must increase from batch to batch (after a crash, "
            f"run the records with labels > {last} again)")
    return (tuple(int(label) for label, _ in found),
            tuple(None if h is None else int(h) for _, h in found))
