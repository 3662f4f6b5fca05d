"""Read a pipeline's whole state as a Spark DataFrame, one task per worker, read-only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from megaphone.state_backends import open_backend
from megaphone.state_backends.encoding import pack_value

BATCH_ROWS = 65_536


def read_state(spark: SparkSession, root: Path, backend: str, key_type: str, owners: np.ndarray,
               schema: T.StructType, decoded: bool) -> DataFrame:
    """The ``(key, state)`` of every bin at its owner in ``owners`` (one routing version).

    ``decoded``: the values are plain numbers (built-in aggregations); otherwise they are
    returned as msgpack bytes. Only the owners' bins are read, never stale copies.
    """
    num_bins = len(owners)
    workers = sorted({int(w) for w in owners})
    bins_of = {w: np.flatnonzero(owners == w).tolist() for w in workers}
    arrow_schema = pa.schema([(f.name, to_arrow_type(f.dataType)) for f in schema])
    root_str = str(root)

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for w in batch.column("id").to_pylist():
                path = Path(root_str) / "workers" / f"w{w:05d}"
                if not path.exists():
                    continue
                state = open_backend(backend, path, key_type, num_bins, read_only=True)
                try:
                    keys, values = [], []
                    for _, k, v in state.items(bins_of[w]):
                        keys.append(k)
                        values.append(v if decoded else pack_value(v))
                        if len(keys) >= BATCH_ROWS:
                            yield _batch(arrow_schema, keys, values)
                            keys, values = [], []
                    if keys:
                        yield _batch(arrow_schema, keys, values)
                finally:
                    state.close()

    ids = spark.createDataFrame([(w,) for w in workers], "id long")
    return ids.repartition(max(1, len(workers))).mapInArrow(read, schema)


def _batch(schema: pa.Schema, keys: list, values: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(keys, schema.field(0).type), pa.array(values, schema.field(1).type)],
        schema=schema,
    )
