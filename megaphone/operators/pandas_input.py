"""The input of a processor written for Spark's ``transformWithStateInPandas``: a key's rows of
an epoch as one pandas DataFrame (:class:`PandasInput`), built as Spark's Python worker builds
its frames.

Spark (4.3, ``SQL_TRANSFORM_WITH_STATE_PANDAS_UDF``) converts each Arrow batch, whose
timestamps its JVM sends in the session time zone, column by column: a timestamp becomes naive
``datetime64[ns]`` local to that zone (``pyarrow.compute.local_timestamp``), every other
column is pyarrow's ``to_pandas`` (an integer column with nulls ``float64``, dates
``datetime.date`` objects). It hands each key's rows over as frames with a fresh ``RangeIndex``
and every input column, named as ``DataFrame.itertuples`` names them (a name that is not a
Python identifier becomes ``_<position>``). Here one frame is built per key and epoch, with
those same conversions, from Arrow arrays. Spark rebuilds its frames from rows, so an integer
column with a null anywhere in its Arrow batch (other keys' rows included) arrives as
``float64``; here that depends on the key's own rows only. Nested values (structs, arrays,
maps) are pyarrow's conversion, without Spark's own for them (maps as dicts, nested
timestamps localized).
"""

from __future__ import annotations

import collections
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.operators.process import plain_type


def spark_column_names(names: list[str]) -> tuple[str, ...]:
    """The column names Spark's frames carry: the input's, renamed as a namedtuple renames
    them (Spark builds its frames from ``itertuples`` rows)."""
    return collections.namedtuple("Pandas", names, rename=True)._fields


class PandasInput:
    """Turns one key's input values (dicts or tuples of every column, temporal values as the
    integers of :func:`~megaphone.operators.process.plain_type`) into the pandas DataFrame Spark
    would give ``handleInputRows``.

    ``value_type``: the input rows' Arrow struct. ``timezone``: Spark's session time zone
    (``spark.sql.session.timeZone``).
    """

    def __init__(self, value_type: pa.DataType, timezone: str) -> None:
        if not pa.types.is_struct(value_type):
            raise TypeError(f"the input rows must be a struct, got {value_type}")
        self.value_type = value_type
        self.plain = plain_type(value_type)
        self.timezone = timezone
        self.names = spark_column_names([f.name for f in value_type])

    def frame(self, values: list[Any]) -> pd.DataFrame:
        """The key's rows as one DataFrame: built from Arrow arrays, one per column."""
        plain = pa.array(values, type=self.plain)
        assert isinstance(plain, pa.StructArray)
        columns = [self._column(plain.field(i), f.type) for i, f in enumerate(self.value_type)]
        return pa.Table.from_arrays(columns, names=list(self.names)).to_pandas()

    def _column(self, plain: pa.Array, dtype: pa.DataType) -> pa.Array:
        """A column in its own type; a timestamp as Spark's worker has it before pandas: naive,
        local to the session time zone (when it has a zone), in nanoseconds."""
        column = plain.cast(dtype)
        if not pa.types.is_timestamp(dtype):
            return column
        if dtype.tz is not None:
            column = pc.local_timestamp(column.cast(pa.timestamp(dtype.unit, tz=self.timezone)))
        return column.cast(pa.timestamp("ns"))
