"""A chain of pipelines on Structured Streaming (``Chain.start``): each micro-batch is one
chain epoch through every stage. A micro-batch that a crash cut short between two stages is
replayed by Spark and applied once by every stage (those that committed it hand on their kept
outputs), a batch every stage committed is read back, and NEXMark Q4's chain, rescaled live in
two stages and killed between them, emits what the batch SQL computes. Stages an epoch apart
that the query would not bring together, and Spark Connect, are refused before the query
starts."""

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
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from megaphone import Chain, Pipeline
from megaphone.nexmark import sql
from megaphone.nexmark.definitions import SMALL_RUN
from megaphone.nexmark.generator import generate
from megaphone.nexmark.queries import Q4
from tests.helpers.chain_stream_driver import NUM_BINS
from tests.test_recovery import wait_for_service_exit

ROOT = Path(__file__).resolve().parents[1]
BATCHES = [[1, 2, 2], [2, 3], [1, 1, 4]]
#: Q4's stream: micro-batches of generated events.
EPOCHS, PER_EPOCH = 4, 500
CHAIN_BINS = 8  # chain_of's stages


def reference(batches) -> tuple[list[dict[int, int]], list[dict[int, int]], dict[int, int]]:
    """A count per key, then per key the sum of the counts it emitted: each batch's outputs
    of the first stage and of the second, and the second's final state."""
    counts: Counter = Counter()
    sums: Counter = Counter()
    firsts, seconds = [], []
    for keys in batches:
        counts.update(keys)
        firsts.append({k: counts[k] for k in set(keys)})
        for k in set(keys):
            sums[k] += counts[k]
        seconds.append({k: sums[k] for k in set(keys)})
    return firsts, seconds, dict(sums)


def chain_of(spark, tmp_path: Path, one_job: bool = True) -> Chain:
    """Counts per key, then the sum per key of those counts (in memory, CHAIN_BINS bins)."""
    opts = {"workers": 2, "num_bins": CHAIN_BINS, "key_type": "int64", "backend": "memory"}
    counts = Pipeline(spark, str(tmp_path / "counts"), key="k", update="count",
                      pipeline_id=uuid.uuid4().hex, **opts)
    sums = Pipeline(spark, str(tmp_path / "sums"), key="k", value="count", update="sum",
                    pipeline_id=uuid.uuid4().hex, **opts)
    return Chain([counts, sums], one_job=one_job)


def as_dict(outputs) -> dict[int, int]:
    return {r[0]: r[1] for r in outputs.collect()}


def test_a_micro_batch_cut_short_between_stages_is_applied_once_by_each(spark, tmp_path):
    chain = chain_of(spark, tmp_path)
    counts, sums = chain.stages
    frames = [spark.createDataFrame([(k,) for k in keys], "k long") for keys in BATCHES]
    _, expected, final = reference(BATCHES)
    out, epoch = chain._run_batch(frames[0], 0, "q")
    assert (as_dict(out), epoch) == (expected[0], 0)
    counts._runner.run_batch(frames[1], 1, "q")  # the driver died before the second stage
    assert (counts.epoch, sums.epoch, chain.epoch) == (1, 0, 0)
    Chain([counts, sums])._check_positions("q")  # the replay of batch 1 is told apart
    out, epoch = chain._run_batch(frames[1], 1, "q")  # Spark replays batch 1
    # ... and again when the driver died in the sink: every stage reads its outputs back
    again, epoch_again = chain._run_batch(frames[1], 1, "q")
    assert as_dict(out) == as_dict(again) == expected[1] and epoch == epoch_again == 1
    assert [len(s.metrics()) for s in chain.stages] == [2, 2]  # each epoch ran once a stage
    counts.process(frames[2])  # an epoch outside the query: its replay would be mistaken
    with pytest.raises(ValueError, match="ran apart outside it"):
        chain.start(spark.readStream.schema("k long").parquet(str(tmp_path)),
                    lambda df, epoch: None, checkpoint_location="q")
    assert not chain.streaming and chain.epoch == 1
    assert as_dict(chain.process(frames[2])) == expected[2]  # process() finishes it
    assert {r[0]: r[1] for r in sums.state().collect()} == final
    chain.close()


def test_start_runs_each_micro_batch_as_a_chain_epoch(spark, tmp_path, monkeypatch):
    source = tmp_path / "src"
    source.mkdir()
    base = time.time() - 1000
    for i, keys in enumerate(BATCHES):
        path = source / f"part-{i}.parquet"
        pq.write_table(pa.table({"k": pa.array(keys, pa.int64())}), path)
        os.utime(path, (base + i, base + i))
    chain = chain_of(spark, tmp_path)
    stream = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1) \
        .parquet(str(source))
    monkeypatch.setattr("megaphone.migrator.pipeline.chain.is_connect", lambda spark: True)
    with pytest.raises(NotImplementedError, match="Spark Connect"):
        chain.start(stream, lambda df, epoch: None)
    monkeypatch.undo()
    deliveries, refused = [], []

    def sink(outputs, epoch: int) -> None:
        deliveries.append((epoch, as_dict(outputs)))
        for call in (lambda: chain.stages[1].process(outputs),
                     lambda: chain.start(stream, sink)):
            try:
                call()
            except RuntimeError as exc:
                refused.append(str(exc))

    query = chain.start(stream, sink, trigger={"availableNow": True},
                        checkpoint_location=str(tmp_path / "ckpt"))
    with contextlib.suppress(Exception):
        query.awaitTermination(120)
    chain.stop()
    assert query.exception() is None
    _, expected, final = reference(BATCHES)
    assert deliveries == list(enumerate(expected))
    assert len(refused) == 2 * len(BATCHES)
    assert "running a stream" in refused[0] and "running a stream" in refused[1]
    assert not chain.streaming and not any(s.streaming for s in chain.stages)
    assert [s.epoch for s in chain.stages] == [len(BATCHES) - 1] * 2
    assert {r[0]: r[1] for r in chain.stages[1].state().collect()} == final
    chain.close()


def write_source(spark, tmp_path: Path) -> None:
    """One parquet file per epoch of Q4's first-stage input, oldest first (a file source
    reads them in modification-time order)."""
    source = tmp_path / "src"
    source.mkdir()
    base = time.time() - 1000
    with Q4(spark, tmp_path / "writer", num_bins=NUM_BINS) as query:
        for i in range(EPOCHS):
            tables = query.inputs(generate(SMALL_RUN, i * PER_EPOCH, PER_EPOCH))
            frames = {n: spark.createDataFrame(t) for n, t in tables.items()}
            path = source / f"part-{i:03d}.parquet"
            pq.write_table(query.batch(**frames).toArrow(), path)
            os.utime(path, (base + i, base + i))


def run_driver(base: Path, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEGAPHONE_LOCAL_DIR": str(base / "local")}
    env.pop("MEGAPHONE_CRASH_AT", None)
    if crash_at:
        env["MEGAPHONE_CRASH_AT"] = crash_at
    args = [str(base / n) for n in ("state", "src", "ckpt", "sink.jsonl", "out.json")]
    return subprocess.run([sys.executable, "-m", "tests.helpers.chain_stream_driver", *args],
                          cwd=ROOT, env=env, start_new_session=True, capture_output=True,
                          text=True, timeout=300)


def test_q4_on_a_stream_rescaled_live_and_killed_between_stages_equals_batch_sql(
        spark, tmp_path):
    # Killed once the first stage committed epoch 2 (the second step of both plans), before
    # the second stage ran it; the restart resumes the stream at micro-batch 2 (the second
    # stage alone), then loses its store service in epoch 3's one job, which runs again.
    write_source(spark, tmp_path)
    result = run_driver(tmp_path, "cleanup:2")
    assert result.returncode == -9, result.stderr[-3000:]
    wait_for_service_exit(tmp_path / "state")
    first = [json.loads(line) for line in (tmp_path / "sink.jsonl").read_text().splitlines()]
    assert [d["epoch"] for d in first] == [0, 1]
    result = run_driver(tmp_path, "apply:3:store")
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((tmp_path / "local").glob("crashed-*")), "the store service was not killed"
    out = json.loads((tmp_path / "out.json").read_text())
    deliveries = [json.loads(line) for line in (tmp_path / "sink.jsonl").read_text().splitlines()]
    assert out["opened"] == [2, 1]  # the first stage was ahead
    assert [d["epoch"] for d in deliveries] == list(range(EPOCHS))
    assert out["epochs"] == [EPOCHS - 1] * 2 and out["in_flight"] == [0, 0]
    assert out["workers"] == [[0, 1, 2], [0, 1, 2, 3]]
    assert [a["3"] for a in out["job_attempts"]] == [2, 2]  # one job for both stages
    for epochs in out["metric_epochs"]:  # no stage ran an epoch twice
        assert set(Counter(epochs).values()) == {1} and set(epochs) <= set(range(EPOCHS))
    # Each category's last average, against the batch SQL up to the last epoch's watermark
    # (lateness 0: the largest event time before the last epoch).
    before_last = generate(SMALL_RUN, 0, (EPOCHS - 1) * PER_EPOCH)
    watermark = max(pc.max(t["date_time"].cast(pa.timestamp("us", "UTC")).cast(pa.int64()))
                    .as_py() for t in (before_last.auctions, before_last.bids))
    want = sql.q4(spark, generate(SMALL_RUN, 0, EPOCHS * PER_EPOCH), watermark)
    assert want, "the events should give Q4 something to emit"
    got = {row[0]: tuple(row) for d in deliveries for row in d["rows"]}
    assert got == {r.category: tuple(r) for r in want}
