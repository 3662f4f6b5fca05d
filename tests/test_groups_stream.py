"""Group scheduling of a stream's backlog (``start(..., epoch_column=)``; docs/groups.md).

A file stream's backlog, read as one micro-batch or as several (``maxFilesPerTrigger``), runs
its labels as epochs in groups: each label's outputs and the final state equal a plain Python
count and ``process()`` run one epoch per label, with fewer Spark jobs than epochs. A crash
after part of a micro-batch's epochs committed is replayed by Spark and loses and repeats
nothing; a batch replayed after all of its epochs committed (the driver died in the sink)
reads all of its outputs back. A later micro-batch
with a label not above the last committed one fails the query with an error naming it, and
changes nothing; a bad epoch column is refused before the query starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megaphone import Pipeline
from tests.test_recovery import wait_for_service_exit

ROOT = Path(__file__).resolve().parents[1]
#: Labels of each parquet file of the backlog, in the order the files are written.
FILES = [(0, 1), (2,), (4, 5), (6,), (7, 9), (10,)]
CRASH_FILES = [(0, 1, 2), (3, 4, 5, 6), (7, 8, 9)]


def label_keys(label: int) -> list[int]:
    """The keys of label ``label``'s records (repeats included)."""
    return [(label * 7 + i * 3) % 13 for i in range(6 + label % 3)]


def write_files(source: Path, files, start: int = 0) -> None:
    """Write one parquet file per entry of ``files`` (its labels' records), with increasing
    modification times: a file source reads them in that order."""
    source.mkdir(exist_ok=True)
    base = time.time() - 1000
    for i, labels in enumerate(files, start):
        rows = [(k, label) for label in labels for k in label_keys(label)]
        path = source / f"part-{i:03d}.parquet"
        pq.write_table(pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                                 "e": pa.array([r[1] for r in rows], pa.int64())}), path)
        os.utime(path, (base + i, base + i))


def reference(labels) -> tuple[dict[int, dict[int, int]], dict[int, int]]:
    """Per label, the count of each key it touched after it; and the final counts."""
    counts: Counter = Counter()
    outputs = {}
    for label in sorted(labels):
        counts.update(label_keys(label))
        outputs[label] = {k: counts[k] for k in set(label_keys(label))}
    return outputs, dict(counts)


def by_label(rows) -> dict[int, dict[int, int]]:
    """Rows ``(k, count, e)`` as per label ``{k: count}``."""
    got: dict[int, dict[int, int]] = {}
    for k, count, label in rows:
        assert k not in got.setdefault(label, {}), (label, k)  # one row per key and epoch
        got[label][k] = count
    return got


def make(spark, tmp_path: Path, name: str, **kw) -> Pipeline:
    return Pipeline(spark, str(tmp_path / name), key="k", update="count", workers=2,
                    num_bins=16, key_type="int64", pipeline_id=uuid.uuid4().hex, **kw)


def run_stream(pipe: Pipeline, spark, source: Path, checkpoint: Path, **options):
    """Run the stream over ``source`` once (``availableNow``); its deliveries and query."""
    deliveries: list[tuple[int, list]] = []
    reader = spark.readStream.schema("k long, e long")
    for name, value in options.items():
        reader = reader.option(name, value)

    def sink(outputs, epoch):
        deliveries.append((epoch, [(r["k"], r["count"], r["e"]) for r in outputs.collect()]))

    query = pipe.start(reader.parquet(str(source)), sink, trigger={"availableNow": True},
                       checkpoint_location=str(checkpoint), epoch_column="e")
    with contextlib.suppress(Exception):  # a failed query: the tests read its exception()
        query.awaitTermination(180)
    pipe.stop()
    return deliveries, query


@pytest.mark.parametrize("options", [{}, {"maxFilesPerTrigger": 2}])
def test_a_streams_backlog_runs_its_labels_in_groups(spark, tmp_path, options):
    write_files(tmp_path / "src", FILES)
    labels = [label for labels in FILES for label in labels]
    pipe = make(spark, tmp_path, "state", group_size=3)
    deliveries, query = run_stream(pipe, spark, tmp_path / "src", tmp_path / "ckpt", **options)
    assert query.exception() is None
    expected, final = reference(labels)
    batches = 1 if not options else len(FILES) // 2
    assert len(deliveries) == batches  # the sink is called once per micro-batch
    got = by_label(row for _, rows in deliveries for row in rows)
    assert got == expected
    assert {row[0]: row[1] for row in pipe.state().collect()} == final
    metrics = pipe.metrics()
    assert [m["label"] for m in metrics] == labels  # one epoch per label, in order
    assert pipe.epoch == len(labels) - 1 and pipe.label == labels[-1]
    for epoch, rows in deliveries:  # each delivery's epoch is its micro-batch's last
        assert epoch == max(m["epoch"] for m in metrics if m["label"] == max(r[2] for r in rows))
    jobs = {m["group"] for m in metrics}
    assert len(jobs) < len(metrics) and max(m["group_size"] for m in metrics) == 3
    if options:  # no group spans two micro-batches
        assert len({m["batch_id"] for m in metrics}) == batches
        assert all(len({m["batch_id"] for m in metrics if m["group"] == g}) == 1 for g in jobs)
    if options:
        return
    # The same records, one process() per label, give the same outputs and state.
    alone = make(spark, tmp_path, "alone")
    frame = spark.createDataFrame([(k, label) for label in labels for k in label_keys(label)],
                                  "k long, e long")
    for label in labels:
        rows = alone.process(frame.where(frame.e == label).select("k")).collect()
        assert {r["k"]: r["count"] for r in rows} == got[label], label
    assert {row[0]: row[1] for row in alone.state().collect()} == final


def test_a_label_not_above_the_last_committed_fails_the_query_and_changes_nothing(
        spark, tmp_path):
    write_files(tmp_path / "src", [(0, 1), (2, 3)])
    pipe = make(spark, tmp_path, "state", group_size=4)
    with pytest.raises(TypeError, match="epoch labels are integers"):  # before the query
        pipe.start(spark.readStream.schema("k long, e string").parquet(str(tmp_path / "src")),
                   lambda df, epoch: None, epoch_column="e")
    with pytest.raises(ValueError, match="also the pipeline's key"):
        pipe.start(spark.readStream.schema("k long, e long").parquet(str(tmp_path / "src")),
                   lambda df, epoch: None, epoch_column="k")
    assert not pipe.streaming
    deliveries, query = run_stream(pipe, spark, tmp_path / "src", tmp_path / "ckpt")
    assert query.exception() is None and len(deliveries) == 1
    before = ({row[0]: row[1] for row in pipe.state().collect()}, pipe.epoch, pipe.label)
    assert before[1:] == (3, 3)
    write_files(tmp_path / "src", [(3, 5)], start=2)  # label 3 again: not a replay
    deliveries, query = run_stream(pipe, spark, tmp_path / "src", tmp_path / "ckpt")
    assert deliveries == []
    assert query.exception() is not None and "holds label 3" in str(query.exception())
    assert ({row[0]: row[1] for row in pipe.state().collect()}, pipe.epoch, pipe.label) == before


def run_driver(base: Path, crash_at: str | None = None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEGAPHONE_LOCAL_DIR": str(base / "local")}
    env.pop("MEGAPHONE_CRASH_AT", None)
    if crash_at:
        env["MEGAPHONE_CRASH_AT"] = crash_at
    args = [str(base / n) for n in ("state", "src", "ckpt", "sink.jsonl", "out.json")]
    return subprocess.run([sys.executable, "-m", "tests.helpers.stream_crash_driver", *args],
                          cwd=ROOT, env=env, start_new_session=True, capture_output=True,
                          text=True, timeout=300)


def test_crashes_in_a_micro_batch_are_replayed_exactly_once(tmp_path):
    labels = [label for labels in CRASH_FILES for label in labels]
    write_files(tmp_path / "src", CRASH_FILES)  # one micro-batch: epochs 0..9, label = epoch
    # After 5 of the batch's commit records (groups 0..3 and 4..7: mid-group). A driver that
    # dies in the sink, after all of them, is the replay of a committed batch (next test).
    result = run_driver(tmp_path, "commit:5")
    assert result.returncode == -9, result.stderr[-3000:]
    assert not (tmp_path / "out.json").exists()
    wait_for_service_exit(tmp_path / "state")
    assert not (tmp_path / "sink.jsonl").exists()  # no delivery yet
    result = run_driver(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    deliveries = [json.loads(line) for line in (tmp_path / "sink.jsonl").read_text().splitlines()]
    expected, final = reference(labels)
    assert len(deliveries) == 1 and deliveries[0]["epoch"] == len(labels) - 1
    assert by_label(deliveries[-1]["rows"]) == expected
    assert out["state"] == {str(k): v for k, v in final.items()}  # no label applied twice
    assert out["epoch"] == len(labels) - 1 and out["label"] == labels[-1]
    # Each label ran once: the first run committed labels 0..4 (label 4's metrics record was
    # lost with the group 4..7 it ran in), the second 5..9; the last one ran none.
    ran = Counter(label for label in out["labels"] if label is not None)
    assert set(ran.values()) == {1} and set(ran) == set(labels) - {4}


def test_a_committed_micro_batch_replayed_reads_all_its_outputs_back(spark, tmp_path):
    # What Spark does when the driver died in the sink: the batch function runs the batch id
    # again. Only 1 epoch's outputs are kept, yet the batch's 5 are all read back.
    pipe = make(spark, tmp_path, "state", group_size=2, keep_outputs=1)
    labels = [3, 4, 6, 8, 9]
    batch = spark.createDataFrame([(k, label) for label in labels for k in label_keys(label)],
                                  "k long, e long")
    first, epoch = pipe._runner.run_batch(batch, 0, "ckpt", "e")
    again, epoch_again = pipe._runner.run_batch(batch, 0, "ckpt", "e")
    expected, final = reference(labels)
    assert epoch == epoch_again == len(labels) - 1
    assert by_label(again.collect()) == by_label(first.collect()) == expected
    assert {row[0]: row[1] for row in pipe.state().collect()} == final
    assert len(pipe.metrics()) == len(labels)  # nothing ran again
    with pytest.raises(RuntimeError, match="ran by its epoch column"):
        pipe._runner.run_batch(batch.select("k"), 0, "ckpt")  # the same batch id, not by its labels
