"""Native Spark runs of the NEXMark benchmark (``bench/nexmark.py``): the same queries written
for Structured Streaming, fed at the same rate, and rescaled the only way Spark can.

Input: one parquet file per epoch holding the epoch's events, all three kinds in one table
(:data:`EVENT_DDL`, ``kind`` 0/1/2 for person/auction/bid, the columns a query needs), written
when the epoch's input interval ends by a feeder thread (``restart_baselines.Feeder``). The
query reads it with ``maxFilesPerTrigger=1`` and the default trigger, so a batch is one epoch,
started as soon as its file exists and the previous batch ended -- the harness's rule for
megaphone too. No-data batches are off (``spark.sql.streaming.noDataMicroBatches.enabled``):
as in megaphone, a window closed by an epoch's watermark is emitted with the next epoch. The
warm-up epochs' files are there from the start and run back to back (closed loop), like
megaphone's warm-up. Sink: ``foreachBatch`` collecting each batch's rows on the driver (as
megaphone's epochs return theirs), kept by batch id and checked at the end against the batch
SQL (:mod:`megaphone.nexmark.sql`) for what the query finalized: every epoch fed is processed
before the query stops, and the windows are those closed by the watermark of its last batch.

The queries, with a watermark of 0 on ``date_time`` (events come in order) and RocksDB state:

* Q3 -- a stream-stream inner join of the filtered persons and auctions on ``id = seller``, no
  watermark: both sides stay in the state for ever, as in megaphone's join;
* Q5, Q7 -- chained window aggregations in append mode (Spark >= 3.5): per (window, auction)
  the count (Q5, sliding) or highest price (Q7, tumbling), then per window (grouped again by
  ``window(window_time(window), slide)``) the top value and ``collect_list`` of the rows,
  exploded to the auctions at the top;
* Q8 -- a stream-stream inner join on ``id = seller`` and equal tumbling windows, watermarked,
  so a window's rows leave the state once the watermark passes it.

Q4 cannot be written (:data:`UNSUPPORTED`): the winning bid is an aggregation per auction
that closes at the auction's own ``expires`` (not a watermarked window), followed by an
unwindowed average per category, and Spark refuses every output mode for that chain. Only
hand-written state (``transformWithState`` with timers) could do it: another program, not
Spark's query language.

Rescaling (``native-repartition``): the query is stopped between triggers before the epoch at
which megaphone rescales, its state repartitioned offline from 2 to 4 partitions
(``spark._streamingCheckpointManager.repartition``), and restarted on the same checkpoint in
the same SparkSession while the input keeps arriving (``restart_baselines.NativeRestarts``).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from report import EpochRow, RunResult, Window, label_phases
from restart_baselines import Feeder, NativeRestarts, Stretch, steady_threshold
from run_setup import (
    Config,
    Context,
    CorrectnessError,
    Workload,
    iso_seconds,
    load_avg,
    native_conf,
)

from megaphone.nexmark import definitions as D
from megaphone.nexmark import sql
from megaphone.nexmark.generator import Events, NexmarkConfig, generate

US = pa.timestamp("us", tz="UTC")
#: One table for the three kinds of event: ``kind`` and ``date_time``, then the columns of
#: persons, auctions and bids the queries read (null where the kind has no such column).
EVENT_SCHEMA = pa.schema([
    ("kind", pa.int8()), ("date_time", US), ("id", pa.int64()), ("name", pa.string()),
    ("city", pa.string()), ("state", pa.string()), ("seller", pa.int64()),
    ("category", pa.int64()), ("reserve", pa.int64()), ("expires", US),
    ("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64())])
EVENT_DDL = ("kind tinyint, date_time timestamp, id long, name string, city string, "
             "state string, seller long, category long, reserve long, expires timestamp, "
             "auction long, bidder long, price long")
PERSON, AUCTION, BID = 0, 1, 2
#: Why Spark's query language cannot express a query (``bench/nexmark.py`` reports it).
UNSUPPORTED = {
    "q4": "the winning bid closes per auction at its own `expires` (no watermarked window), "
          "then an unwindowed average per category follows: append mode needs a window in the "
          "aggregation key, update mode is refused for an aggregation after another stateful "
          "operator (global-watermark correctness check), complete mode for the "
          "stream-stream join",
}
NATIVE_RUNS = ("native", "native-repartition")


def event_table(events: Events) -> pa.Table:
    """The events as one :data:`EVENT_SCHEMA` table: persons, then auctions, then bids."""
    parts = []
    for kind, table in enumerate((events.persons, events.auctions, events.bids)):
        columns = [pa.array([kind] * table.num_rows, pa.int8()) if f.name == "kind"
                   else table[f.name].cast(f.type) if f.name in table.column_names
                   else pa.nulls(table.num_rows, f.type) for f in EVENT_SCHEMA]
        parts.append(pa.Table.from_arrays(columns, schema=EVENT_SCHEMA))
    return pa.concat_tables(parts)


# -- the queries -------------------------------------------------------------------------------


def _kind(events: DataFrame, kind: int, watermark: bool = False) -> DataFrame:
    rows = events.filter(F.col("kind") == kind)
    return rows.withWatermark("date_time", "0 seconds") if watermark else rows


def q3(events: DataFrame, sizes: dict[str, int]) -> DataFrame:
    """Local item suggestion: an unbounded stream-stream join."""
    persons = _kind(events, PERSON).filter(F.col("state").isin(*D.Q3_STATES)).select(
        F.col("id").alias("person"), "name", "city", "state")
    auctions = _kind(events, AUCTION).filter(F.col("category") == D.Q3_CATEGORY).select(
        F.col("id").alias("auction"), "seller")
    return persons.join(auctions, F.col("person") == F.col("seller")).select(
        "name", "city", "state", "auction")


def _top(events: DataFrame, size_us: int, slide_us: int, value) -> DataFrame:
    """Per window the auctions with the top ``value``: two chained window aggregations."""
    per_auction = _kind(events, BID, watermark=True).groupBy(
        F.window("date_time", f"{size_us} microseconds", f"{slide_us} microseconds"),
        "auction").agg(value.alias("value"))
    per_window = per_auction.groupBy(
        F.window(F.window_time("window"), f"{slide_us} microseconds").alias("w")).agg(
        F.max("value").alias("top"), F.collect_list(F.struct("auction", "value")).alias("rows"))
    end = F.unix_micros(F.col("w.end"))
    return per_window.select(
        (end - size_us).alias("start"), end.alias("end"),
        F.explode(F.filter("rows", lambda r: r["value"] == F.col("top"))).alias("r")).select(
        "start", "end", "r.auction", "r.value")


def q5(events: DataFrame, sizes: dict[str, int]) -> DataFrame:
    """Hot items: bids per auction and sliding window, then the top per window."""
    return _top(events, sizes["size_us"], sizes["slide_us"], F.count("*"))


def q7(events: DataFrame, sizes: dict[str, int]) -> DataFrame:
    """Highest bid: highest price per auction and tumbling window, then the top per window."""
    return _top(events, sizes["size_us"], sizes["size_us"], F.max("price"))


def q8(events: DataFrame, sizes: dict[str, int]) -> DataFrame:
    """New users: persons and their auctions joined on the seller and the tumbling window."""
    window = f"{sizes['window_us']} microseconds"
    persons = _kind(events, PERSON, watermark=True).select(
        F.col("id").alias("person"), "name", F.window("date_time", window).alias("pw"))
    auctions = _kind(events, AUCTION, watermark=True).select(
        "seller", "reserve", F.window("date_time", window).alias("aw"))
    return persons.join(auctions, (F.col("person") == F.col("seller"))
                        & (F.col("pw") == F.col("aw"))).select(
        "person", "name", "reserve", F.unix_micros(F.col("pw.start")).alias("start"))


#: Per query: its Structured Streaming version and how often a batch reads its source (a
#: self-join reads it twice, so its progress reports twice the rows).
QUERIES: dict[str, tuple[Callable[[DataFrame, dict[str, int]], DataFrame], int]] = {
    "q3": (q3, 2), "q5": (q5, 1), "q7": (q7, 1), "q8": (q8, 2)}


def expected_rows(spark, name: str, events: Events, watermark_us: int | None,
                  sizes: dict[str, int]) -> list[Any]:
    """What query ``name`` must have emitted over ``events`` by ``watermark_us`` (batch SQL)."""
    if name == "q3":
        return sql.q3(spark, events)
    if name == "q5":
        return sql.q5(spark, events, watermark_us, sizes["size_us"], sizes["slide_us"])
    if name == "q7":
        return sql.q7(spark, events, watermark_us, sizes["size_us"])
    if name == "q8":
        return sql.q8(spark, events, sizes["window_us"])
    raise ValueError(f"no native version of {name}")


# -- the run -------------------------------------------------------------------------------------


class EventFeeder(Feeder):
    """Writes feeder epoch ``e`` (the benchmark's epoch ``offset + e``) as one events file."""

    def __init__(self, config: NexmarkConfig, per_epoch: int, offset: int, root: Path,
                 interval: float, gate: float):
        super().__init__(Workload(1, per_epoch), root, interval, gate, offset)
        self.config, self.per_epoch, self.offset = config, per_epoch, offset

    def write(self, epoch: int) -> None:
        write_events(self.config, self.per_epoch, self.offset + epoch, self.root)
        self.written = epoch + 1


def write_events(config: NexmarkConfig, per_epoch: int, epoch: int, root: Path,
                 mtime: float | None = None) -> None:
    """Epoch ``epoch``'s events as ``input/eNNNNNN.parquet``, written aside and renamed in."""
    name = f"e{epoch:06d}.parquet"
    staged = root / "staging" / name
    pq.write_table(event_table(generate(config, epoch * per_epoch, per_epoch)), staged)
    if mtime is not None:  # the file source takes files oldest first
        os.utime(staged, (mtime, mtime))
    staged.rename(root / "input" / name)


class NexmarkNative(NativeRestarts):
    """A native run: ``native`` (no restart) or ``native-repartition`` (one stop, repartition
    from ``workers`` to ``2 * workers`` state partitions, restart) of one query.

    ``mcfg`` is the migration benchmark's :class:`Config` the base class reads (``warmup`` 0:
    its epochs count from the first open-loop one; the closed-loop warm-up comes before).
    """

    def __init__(self, ctx: Context, name: str, query: str, warmup: int, steady_epochs: int,
                 config: NexmarkConfig, sizes: dict[str, int],
                 give_up: Callable[[list[float]], bool] | None = None):
        super().__init__(ctx, ctx.cfg.state_root / query / name, preload=False)
        self.name, self.query_name, self.sizes = name, query, sizes
        self.give_up = give_up
        self.build, self.scans = QUERIES[query]
        self.preload = warmup  # batches before the feeder's: the warm-up epochs
        if name == "native":
            self.plan = [Stretch(0, None, None, steady_epochs, steady_epochs)]
        per_epoch = ctx.workload.per_epoch
        gate = self.plan[1].first if len(self.plan) > 1 else math.inf
        self.feeder = EventFeeder(config, per_epoch, warmup, self.root, self.cfg.interval, gate)
        self.config = config
        self.outputs: dict[int, list[tuple]] = {}
        self.bar: tqdm | None = None

    def start_query(self):
        """The query on the input directory, its rows collected per batch."""
        source = (self.spark.readStream.schema(EVENT_DDL).option("maxFilesPerTrigger", 1)
                  .parquet(str(self.root / "input")))
        return (self.build(source, self.sizes).writeStream.foreachBatch(self._sink)
                .outputMode("append")
                .option("checkpointLocation", str(self.root / "checkpoint")).start())

    def stop_query(self, timeout: float = 30.0) -> None:
        """Stop the query once its running batch (if any) has ended, or after ``timeout``
        seconds: a restart stops an idle query, the last stop the batch that follows (with a
        backlog there always is one) as it begins, not half way through."""
        query, deadline = self.query, time.time() + timeout
        last = query.lastProgress if query is not None else None
        first = last["batchId"] if last is not None else -1
        while query is not None and query.isActive and time.time() < deadline \
                and query.status["isTriggerActive"]:
            last = query.lastProgress
            if last is not None and last["batchId"] > first:
                break
            time.sleep(0.01)
        super().stop_query()

    def poll(self) -> int:
        """The base class's poll, with the epochs done on the progress bar."""
        done = super().poll()
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
        return done

    def _sink(self, frame: DataFrame, batch_id: int) -> None:
        self.outputs[batch_id] = [tuple(r) for r in frame.collect()]

    def run(self) -> list[EpochRow]:
        """Warm up (closed loop), feed, restart once (``native-repartition``), drain (or stop
        when ``give_up`` says so); the open-loop epochs' rows. The query is then stopped: the
        batches that reported progress (committed) are the epochs the run and its check
        count."""
        (self.root / "input").mkdir(parents=True)
        (self.root / "staging").mkdir()
        base = time.time() - self.preload - 1
        for epoch in range(self.preload):
            write_events(self.config, self.ctx.workload.per_epoch, epoch, self.root, base + epoch)
        self.query = self.start_query()
        self.bar = tqdm(desc=f"{self.query_name} {self.name}", unit="epoch", leave=False,
                        disable=not self.cfg.progress)
        try:
            self.wait_batches(self.preload)
            self.feeder.t0 = time.time()
            self.feeder.start()
            if len(self.plan) > 1:
                first = self.plan[1].first
                self.wait_epochs(first)
                self.restart("scale-out", 2 * self.cfg.workers, first, math.inf)
            steady_end = self.plan[1].first if len(self.plan) > 1 else math.inf
            self.drain(self.plan[-1], steady_threshold(
                [r.latency_s for r in self.rows() if r.epoch < steady_end]), self.give_up)
        finally:
            self.feeder.finish()
            self.stop_query()
            self.bar.close()
        return self.rows()

    def all_rows(self) -> tuple[list[EpochRow], list[Window], float]:
        """Every epoch's row (warm-up first) on the benchmark's clock ``t0`` (epoch ``e``'s
        input interval ends at ``t0 + (e + 1) * interval``), the windows, and ``t0``."""
        shift = self.preload * self.cfg.interval  # the feeder's t0 is warm-up epochs later
        t0 = self.feeder.t0 - shift
        batches = self.data_batches()
        rows = []
        for e, p in enumerate(batches[:self.preload]):  # closed loop: latency = duration
            started = iso_seconds(p["timestamp"])
            duration = p["durationMs"]["triggerExecution"] / 1000.0
            rows.append(EpochRow(self.name, e, started - t0, started - t0,
                                 started + duration - t0, int(p["numInputRows"]) // self.scans,
                                 duration, duration, load1=load_avg()))
        for row in self.rows():
            rows.append(replace(row, epoch=row.epoch + self.preload,
                                interval_end_s=row.interval_end_s + shift,
                                started_s=row.started_s + shift,
                                finished_s=row.finished_s + shift))
        windows = [replace(w, start_s=w.start_s + shift, end_s=w.end_s + shift)
                   for w in self.windows]
        return rows, windows, t0

    def outputs_by_epoch(self) -> list[int]:
        """Rows the sink got per epoch (batches with input, in order)."""
        return [len(self.outputs.get(p["batchId"], [])) for p in self.data_batches()]

    def check(self) -> str:
        """The rows the committed batches emitted against the batch SQL over their epochs'
        events (a batch the stop interrupted is not counted: its file was not fed); raises
        :class:`CorrectnessError` on any difference."""
        batches = self.data_batches()
        epochs = len(batches)
        mark = batches[-1]["eventTime"].get("watermark") if batches else None
        watermark = round(iso_seconds(mark) * 1e6) if mark else None
        events = generate(self.config, 0, epochs * self.ctx.workload.per_epoch)
        want = Counter(map(tuple, expected_rows(self.spark, self.query_name, events, watermark,
                                                self.sizes)))
        got = Counter(r for p in batches for r in self.outputs.get(p["batchId"], []))
        if got != want:
            raise CorrectnessError(
                f"{self.query_name} {self.name}: {sum(got.values())} rows, batch SQL "
                f"{sum(want.values())}; extra {sorted(got - want)[:3]}, missing "
                f"{sorted(want - got)[:3]}")
        return f"ok ({sum(want.values())} rows = batch SQL)"


@contextmanager
def streaming_conf(spark, partitions: int) -> Iterator[None]:
    """:func:`run_setup.native_conf` (RocksDB state, ``partitions`` shuffle partitions) and no
    no-data batches, then the session's own settings back."""
    key = "spark.sql.streaming.noDataMicroBatches.enabled"
    saved = spark.conf.get(key, None)
    spark.conf.set(key, "false")
    try:
        with native_conf(spark, partitions):
            yield
    finally:
        if saved is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, saved)


def run_native(bench, query: str, name: str, row_type: type[EpochRow],
               give_up: Callable[[list[float]], bool] | None = None) -> RunResult:
    """One native run of ``query`` (``name`` in :data:`NATIVE_RUNS`) under ``bench``'s
    settings (``bench/nexmark.py``); rows as ``row_type`` with the rows emitted per epoch.
    ``give_up``, given the open-loop epochs' latencies so far, may end the run early."""
    cfg = bench.cfg
    mcfg = Config(
        keys=1, rate=cfg.rate, interval=cfg.interval, workers=cfg.workers, bins=cfg.bins,
        scenario="scale-out", runs=(name,), warmup=0, pre=cfg.pre, hold=0,
        cooldown=cfg.cooldown, steady_epochs=cfg.steady_epochs, per_worker=cfg.per_worker,
        gap=0, drain_epochs=cfg.drain_epochs, out=cfg.out, state_root=cfg.state_root,
        keep_state=cfg.keep_state, merge=False, backend="rocksdb", master=cfg.master,
        driver_memory=cfg.driver_memory, native_preload_max=0, progress=cfg.progress,
        profile="smoke")
    ctx = Context(mcfg, bench.spark, Workload(1, cfg.per_epoch), Path(), 0, bench.sampler)
    run = NexmarkNative(ctx, name, query, cfg.warmup, cfg.steady_epochs, cfg.nexmark,
                        cfg.sizes(query), give_up)
    shutil.rmtree(run.root, ignore_errors=True)
    load_before = load_avg()
    bench.sampler.take_peak()
    try:
        with streaming_conf(bench.spark, cfg.workers):
            run.run()
            rows, windows, _ = run.all_rows()
            check = run.check()
    finally:
        if not cfg.keep_state:
            shutil.rmtree(run.root, ignore_errors=True)
    rows = [row_type(**asdict(r), outputs=n)
            for r, n in zip(rows, run.outputs_by_epoch(), strict=True)]
    label_phases(rows, windows, cfg.warmup)
    notes = [f"Structured Streaming, RocksDB state, {cfg.workers} state partitions, "
             "foreachBatch sink collecting the rows"]
    notes += [f"{p['label']}: stop {p['stop_s']:.2f} s, repartition to {p['partitions']} "
              f"partitions {p['migrate_s']:.2f} s, restart {p['reopen_s']:.2f} s; paused "
              f"{p['pause_s']:.2f} s" for p in run.phases]
    return RunResult(name, rows, windows, len(rows) * cfg.per_epoch, check, notes,
                     (load_before, load_avg()), phases=run.phases)
