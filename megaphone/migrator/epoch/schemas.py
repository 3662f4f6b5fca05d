"""A pipeline's types: its key and value columns' kinds, its update, its outputs' schema and the
record columns an epoch's job reads from a batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type

from megaphone.migrator.task.columns import EVENT_TIME, KEY, VALUE
from megaphone.migrator.task.spec import shuffle_schema
from megaphone.migrator.task.updates import Update, UpdateFn, make_update
from megaphone.operators.process import ProcessFunction
from megaphone.routing.keys import KEY_ARROW_TYPES, KEY_SPARK_CASTS


def arrow_type(dtype: T.DataType) -> pa.DataType:
    """The Arrow type of Spark type ``dtype`` (timestamps as UTC microseconds, as Spark ships
    them to Python)."""
    return to_arrow_type(dtype, timezone="UTC")


def key_type_of(dtype: T.DataType, column: str) -> str:
    """The key type (``"int64"`` or ``"str"``) of a key column of Spark type ``dtype``."""
    if isinstance(dtype, T.IntegralType):
        return "int64"
    if isinstance(dtype, T.StringType):
        return "str"
    raise TypeError(f"key column {column!r} must be an integer or string column, not {dtype}")


def value_kind_of(dtype: T.DataType, column: str) -> str:
    """The aggregate kind (``"int"`` or ``"float"``) of a value column of Spark type ``dtype``."""
    if isinstance(dtype, (T.IntegralType, T.BooleanType)):
        return "int"
    if isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType)):
        return "float"
    raise TypeError(f"value column {column!r} must be numeric for a built-in aggregation, "
                    f"not {dtype}")


class PipelineSchema:
    """The types of one pipeline: ``key``, ``value`` and ``event_time`` are its columns,
    ``update`` its update argument and ``output_type`` a general ``f``'s output type."""

    def __init__(self, key: str, value: str | None, event_time: str | None,
                 update: str | UpdateFn, output_type: T.DataType) -> None:
        self.key = key
        self.value = value
        self.event_time = event_time
        self.update_arg = update
        self.output_type = output_type
        # Built once: every Column costs the driver a dozen JVM calls, and they are reusable.
        self._columns: tuple[tuple[str, str | None], dict[str, Column]] | None = None
        #: The update reads whole rows (every column, as one struct value): a Spark processor.
        self.whole_rows = getattr(update, "reads_rows", False)

    def update(self, manifest: Mapping[str, Any], value_type: T.DataType | None) -> Update:
        """The update, its value kind from ``value_type`` (a batch's) or from the state
        directory's ``manifest`` (``value_kind``: none before the first batch with values; it
        also keeps an operator's value type, from its first batch); an operator's output type
        from the value type."""
        if value_type is None and manifest.get("value_type"):
            value_type = T._parse_datatype_json_string(manifest["value_type"])
        kind = manifest.get("value_kind")
        if isinstance(self.update_arg, ProcessFunction):
            arrow = arrow_type(value_type) if value_type is not None else None
            return make_update(self.update_arg, None, self.update_arg.output_type(arrow))
        if value_type is not None and self.update_arg in ("sum", "min", "max"):
            batch_kind = value_kind_of(value_type, self.value or "")
            if kind == "int" and batch_kind == "float":
                raise TypeError(f"value column {self.value!r} holds floats but the pipeline's "
                                "aggregates are integers")
            kind = kind or batch_kind
        return make_update(self.update_arg, kind or "int", arrow_type(self.output_type))

    def batch_types(self, schema: T.StructType) -> tuple[str, T.DataType | None]:
        """A batch's key type and value column type, once its columns are checked."""
        for column in (self.key, self.value, self.event_time):
            if column is not None and column not in schema.names:
                raise ValueError(f"column {column!r} not in the batch (columns: {schema.names})")
        key_type = key_type_of(schema[self.key].dataType, self.key)
        if self.whole_rows:
            return key_type, schema
        return key_type, schema[self.value].dataType if self.value else None

    def outputs(self, key_type: str | None, update: Update) -> T.StructType:
        """The outputs' schema: the key, then the aggregate (named after it) or ``output``."""
        key_spark = T.LongType() if key_type == "int64" else T.StringType()
        if update.is_builtin:
            value = T.LongType() if update.output_arrow_type() == pa.int64() else T.DoubleType()
            name = update.kind
        else:  # an operator's output type is an Arrow type, a general f's a Spark type
            value = from_arrow_type(update.output_type) if update.is_process else self.output_type
            name = "output"
        return T.StructType([T.StructField(self.key, key_spark), T.StructField(name, value)])

    def state(self, key_type: str | None, update: Update) -> T.StructType:
        """The schema of :meth:`Pipeline.state`: ``(key, state)``; a general ``f``'s state is
        msgpack bytes."""
        out = self.outputs(key_type, update)
        value = out[1].dataType if update.is_builtin else T.BinaryType()
        return T.StructType([out[0], T.StructField("state", value)])

    def record_columns(self, key_type: str, update: Update) -> dict[str, Column]:
        """The record columns an epoch reads from a batch, by shuffle column: the key, and the
        value and the event time (microseconds) where used, cast for the update."""
        key_cast = KEY_SPARK_CASTS[key_type]
        value_cast = None
        if self.value and update.is_builtin:
            value_cast = "long" if update.value_kind == "int" else "double"
        if self._columns is None or self._columns[0] != (key_cast, value_cast):
            cols: dict[str, Column] = {KEY: F.col(self.key).cast(key_cast)}
            if self.whole_rows:
                cols[VALUE] = F.struct(F.col("*"))
            elif self.value:
                cols[VALUE] = F.col(self.value) if value_cast is None else \
                    F.col(self.value).cast(value_cast)
            if self.event_time:
                cols[EVENT_TIME] = F.unix_micros(F.col(self.event_time).cast("timestamp"))
            self._columns = ((key_cast, value_cast), cols)
        return self._columns[1]

    def task_schemas(self, key_type: str, update: Update, batch: T.StructType,
                     manifest: Mapping[str, Any]) -> tuple[pa.Schema, pa.Schema]:
        """The Arrow schemas of an epoch's tasks, derived once when a batch is admitted: its
        shuffle's (:func:`~megaphone.migrator.task.spec.shuffle_schema`: the batch's key and
        value as the update reads them) and its outputs' (the update as ``manifest`` fixes it)."""
        value_arrow = arrow_type(batch) if self.whole_rows else None
        if self.value:
            value_arrow = (pa.int64() if update.value_kind == "int" else pa.float64()) \
                if update.is_builtin else arrow_type(batch[self.value].dataType)
        out = self.outputs(key_type, self.update(manifest, None))
        outputs = pa.schema([(f.name, arrow_type(f.dataType)) for f in out])
        key_arrow = KEY_ARROW_TYPES[key_type]
        return shuffle_schema(key_arrow, value_arrow, self.event_time is not None), outputs
