"""Spark's per-row check of the Arrow batches' bytes (``maxBytesPerBatch``) is skipped for an
epoch's job only where it cannot bind: fixed-width shuffle rows, no state or partial aggregates
in the shuffle, the session's cap at its default; the session's setting is restored after."""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import pyarrow as pa
import pytest
from pyspark import TaskContext

import megaphone.migrator.epoch.spark_job as spark_job
from megaphone import Chain, Pipeline
from megaphone.migrator.task.spec import EpochSpec, row_bytes_bound, shuffle_schema
from megaphone.migrator.task.updates import make_update
from megaphone.spark import (
    ARROW_MAX_BYTES,
    ARROW_MAX_RECORDS,
    ARROW_UNCHECKED_BYTES,
    byte_cap_unchecked,
)

UNCHECKED = str(ARROW_UNCHECKED_BYTES)


def cap_in_tasks(spark) -> set[str | None]:
    """The byte cap a job's Python tasks run under (Spark hands SQL settings to its tasks)."""
    def task(batches):
        cap = TaskContext.get().getLocalProperty(ARROW_MAX_BYTES)
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"cap": [cap] * batch.num_rows})
    return {r.cap for r in spark.range(4).mapInArrow(task, "cap string").collect()}


def test_the_check_is_off_in_the_jobs_inside_only_where_it_cannot_bind(spark):
    assert spark.conf.get(ARROW_MAX_BYTES, None) is None
    with byte_cap_unchecked(spark, 100):
        assert spark.conf.get(ARROW_MAX_BYTES) == UNCHECKED
        assert cap_in_tasks(spark) == {UNCHECKED}
    assert spark.conf.get(ARROW_MAX_BYTES, None) is None and cap_in_tasks(spark) == {None}
    for row_bytes in (None, 10**6):  # unbounded, or 10,000 rows above 64 MiB
        with byte_cap_unchecked(spark, row_bytes):
            assert spark.conf.get(ARROW_MAX_BYTES, None) is None
    spark.conf.set(ARROW_MAX_RECORDS, "-1")  # batches of any number of rows
    try:
        with byte_cap_unchecked(spark, 8):
            assert spark.conf.get(ARROW_MAX_BYTES, None) is None
    finally:
        spark.conf.unset(ARROW_MAX_RECORDS)
    spark.conf.set(ARROW_MAX_BYTES, "1m")  # the user's own cap is theirs
    try:
        with byte_cap_unchecked(spark, 8):
            assert spark.conf.get(ARROW_MAX_BYTES) == "1m"
        assert spark.conf.get(ARROW_MAX_BYTES) == "1m"
    finally:
        spark.conf.unset(ARROW_MAX_BYTES)
    with pytest.raises(RuntimeError), byte_cap_unchecked(spark, 8):
        raise RuntimeError("a failed job")
    assert spark.conf.get(ARROW_MAX_BYTES, None) is None


def test_a_job_that_needs_the_check_has_it_while_it_runs(spark):
    seen: list[str | None] = []
    entered, release = threading.Event(), threading.Event()

    def wide_job() -> None:  # on another thread, ending after the narrow job
        with byte_cap_unchecked(spark, None):
            entered.set()
            release.wait(10)
            seen.append(spark.conf.get(ARROW_MAX_BYTES, None))

    other = threading.Thread(target=wide_job)
    with byte_cap_unchecked(spark, 100):
        seen.append(spark.conf.get(ARROW_MAX_BYTES, None))
        other.start()
        entered.wait(10)
        seen.append(spark.conf.get(ARROW_MAX_BYTES, None))
    release.set()
    other.join(10)
    with byte_cap_unchecked(spark, 100):
        with byte_cap_unchecked(spark, 100):
            seen.append(spark.conf.get(ARROW_MAX_BYTES, None))
        seen.append(spark.conf.get(ARROW_MAX_BYTES, None))
    assert seen == [UNCHECKED, None, None, UNCHECKED, UNCHECKED]
    assert spark.conf.get(ARROW_MAX_BYTES, None) is None


def spec(value_type: pa.DataType | None, **fields) -> EpochSpec:
    return EpochSpec(epoch=0, state_dir="unused", backend="memory", key_type="int64",
                     num_bins=8, update=make_update("count", None),
                     output_schema=pa.schema([("k", pa.int64())]), chunk_bytes=64,
                     shuffle_schema=shuffle_schema(pa.int64(), value_type, True), **fields)


def test_a_row_is_bounded_only_by_fixed_widths_and_records_alone():
    narrow = row_bytes_bound(spec(pa.struct([("a", pa.int64()), ("b", pa.float64())])))
    # worker, kind, bin, key, value (two fields and the struct), time, five null columns; x2
    assert narrow == 2 * (5 + 2 + 5 + 9 + 19 + 9 + 5 * 5)
    assert row_bytes_bound(spec(None)) < narrow
    for wide in (pa.string(), pa.list_(pa.int64()), pa.struct([("name", pa.string())])):
        assert row_bytes_bound(spec(wide)) is None
    plain = spec(None)
    assert row_bytes_bound(dataclasses.replace(plain, outgoing={0: ((1, 1),)})) is None
    assert row_bytes_bound(dataclasses.replace(plain, outgoing={0: ((1, 1),)},
                                               pull_exports=True)) is not None
    assert row_bytes_bound(dataclasses.replace(plain, split_keys=(3,))) is None


@pytest.fixture
def caps(monkeypatch) -> list[tuple[int | None, str | None]]:
    """Each epoch job's row bound and the byte cap its session ran it under."""
    seen: list[tuple[int | None, str | None]] = []
    real = spark_job.byte_cap_unchecked

    @contextlib.contextmanager
    def spy(spark, row_bytes):
        with real(spark, row_bytes):
            seen.append((row_bytes, spark.conf.get(ARROW_MAX_BYTES, None)))
            yield

    monkeypatch.setattr(spark_job, "byte_cap_unchecked", spy)
    return seen


def test_epoch_jobs_skip_the_check_for_fixed_width_records_only(spark, tmp_path, caps):
    opts = {"workers": 2, "num_bins": 8, "backend": "memory"}
    ids = Pipeline(spark, str(tmp_path / "ids"), key="k", update="count", key_type="int64",
                   **opts)
    ids.process(spark.createDataFrame([(1,), (2,), (1,)], "k long"))
    names = Pipeline(spark, str(tmp_path / "names"), key="k", update="count", key_type="str",
                     **opts)
    names.process(spark.createDataFrame([("a",), ("b",)], "k string"))
    assert [cap for _, cap in caps] == [UNCHECKED, None] and caps[1][0] is None
    assert spark.conf.get(ARROW_MAX_BYTES, None) is None
    caps.clear()  # a chain in one job: the widest stage's rows decide
    first = Pipeline(spark, str(tmp_path / "first"), key="k", update="count", key_type="str",
                     **opts)
    second = Pipeline(spark, str(tmp_path / "second"), key="k", value="count", update="sum",
                      key_type="str", **opts)
    chain = Chain([first, second], one_job=True)
    for _ in range(2):
        chain.process(spark.createDataFrame([("a",), ("b",)], "k string"))
    assert caps and all(cap is None for _, cap in caps)
    for pipe in (ids, names, chain):
        pipe.close()
