"""``StatefulProcessor``s written as Spark's docs write them, for Spark's own
``transformWithState`` and for megaphone: a running count (ValueState), a session window
(event-time timers) and a per-key top 2 (MapState), and a running count for
``transformWithStateInPandas``; their inputs, one parquet file per batch.

Input rows: ``id string, time timestamp, item string, score long``.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StringType, StructField, StructType

EPOCH0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
GAP_MS = 3000
DELAY = "1 second"
INPUT = pa.schema([("id", pa.string()), ("time", pa.timestamp("us", tz="UTC")),
                   ("item", pa.string()), ("score", pa.int64())])


class RunningCount(StatefulProcessor):
    """Rows seen per key so far (ValueState)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any
                        ) -> Iterator[Row]:
        n = (self.count.get() or (0,))[0] + sum(1 for _ in rows)
        self.count.update((n,))
        yield Row(id=key[0], count=n)

    def close(self) -> None:
        pass


COUNT_OUT = StructType([StructField("id", StringType()), StructField("count", LongType())])


class Sessions(StatefulProcessor):
    """Session windows with a gap of GAP_MS: a session is emitted when the watermark passes its
    last event plus the gap (an event-time timer)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", "start long, last long, n long")

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any
                        ) -> Iterator[Row]:
        start, last, n = self.session.get() or (None, None, 0)
        for row in rows:
            t = int(row.time.timestamp() * 1000)
            start = t if start is None else min(start, t)
            last = t if last is None else max(last, t)
            n += 1
        for old in self.handle.listTimers():
            self.handle.deleteTimer(old)
        self.session.update((start, last, n))
        self.handle.registerTimer(last + GAP_MS)
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                           ) -> Iterator[Row]:
        start, last, n = self.session.get()
        self.session.clear()
        yield Row(id=key[0], start=start, end=last + GAP_MS, n=n,
                  fired=expiredTimerInfo.getExpiryTimeInMs())

    def close(self) -> None:
        pass


SESSION_OUT = "id string, start long, end long, n long, fired long"


class TopTwo(StatefulProcessor):
    """Per key, the best score of each item (MapState) and the top two items after each batch."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.best = handle.getMapState("best", "item string", "score long")

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any
                        ) -> Iterator[Row]:
        for row in rows:
            old = self.best.getValue((row.item,))
            if old is None or row.score > old[0]:
                self.best.updateValue((row.item,), (row.score,))
        ranked = sorted(self.best.iterator(), key=lambda kv: (-kv[1][0], kv[0][0]))[:2]
        for rank, (item, score) in enumerate(ranked):
            yield Row(id=key[0], rank=rank, item=item[0], score=score[0])
        kept = {item for item, _ in ranked}
        for item in list(self.best.keys()):
            if item not in kept:
                self.best.removeKey(item)

    def close(self) -> None:
        pass


TOP_OUT = "id string, rank long, item string, score long"


class PandasCount(StatefulProcessor):
    """Rows and score total per key so far (ValueState), written for Spark's
    ``transformWithStateInPandas``: frames in, one frame out, which also says what the frames
    looked like (columns, dtypes, index, the latest event time in ms)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n long, total long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                        ) -> Iterator[pd.DataFrame]:
        n, total = self.count.get() or (0, 0)
        seen, latest = [], None
        for pdf in rows:
            n += len(pdf)
            total += pdf["score"].sum()  # a numpy int64, as Spark's docs' processors store
            seen.append(f"{list(pdf.columns)} {[str(t) for t in pdf.dtypes]} "
                        f"{list(pdf.index)}")
            last = pdf["time"].max()
            latest = last if latest is None else max(latest, last)
        self.count.update((n, total))
        yield pd.DataFrame({"id": key, "count": [n], "total": [total],
                            "latest": [int(latest.timestamp() * 1000)],
                            "frames": [" | ".join(seen)]})

    def close(self) -> None:
        pass


PANDAS_OUT = "id string, count long, total long, latest long, frames string"


class Alarm(StatefulProcessor):
    """Per row: emits the batch's processing time and sets a timer 5 s after it; a timer
    emits minus its expiry."""

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any):
        now = timerValues.getCurrentProcessingTimeInMs()
        for _ in rows:
            self.handle.registerTimer(now + 5000)
            yield Row(id=key[0], count=now)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any):
        yield Row(id=key[0], count=-expiredTimerInfo.getExpiryTimeInMs())


class Expiring(StatefulProcessor):
    """Value, list and map states with a 1 s TTL: per row, emits what is visible (value or
    -1, list sum, map keys' sum, the processing time seen), then writes ``n`` when it is even.
    """

    def init(self, handle: Any) -> None:
        self.value = handle.getValueState("v", "n long", ttlDurationMs=1000)
        self.list = handle.getListState("l", "n long", ttlDurationMs=1000)
        self.map = handle.getMapState("m", "k long", "n long", ttlDurationMs=1000)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any):
        for row in rows:
            value = self.value.get()
            yield Row(id="value", count=-1 if value is None else value[0])
            yield Row(id="list", count=sum(n for (n,) in self.list.get()))
            yield Row(id="map", count=sum(k for (k,), _ in self.map.iterator()))
            yield Row(id="now", count=timerValues.getCurrentProcessingTimeInMs())
            if row.n % 2 == 0:
                self.value.update((row.n,))
                self.list.appendValue((row.n,))
                self.map.updateValue((row.n,), (row.n,))


def batches(n: int = 4) -> list[list[dict[str, Any]]]:
    """``n`` batches of 6 rows of 3 of 5 keys (a key is left out for a while, so its session
    closes); event time runs 4 s a batch, rows within 1 s of each other (none is late)."""
    out = []
    for b in range(n):
        rows = []
        for i in range(6):
            second = b * 4 + (i % 3) * 0.5 + (i // 3) * 0.25
            rows.append({"id": f"k{(b + i % 3) % 5}",
                         "time": EPOCH0 + dt.timedelta(seconds=second),
                         "item": f"i{(b + i * 2) % 4}", "score": (b * 7 + i * 5) % 11})
        out.append(rows)
    return out


def no_rows(frame: DataFrame) -> DataFrame:
    """A batch without rows that still runs every worker's task (where Spark runs its no-data
    batch, to fire the timers the last watermark passed): ``limit(0)`` or an empty local
    frame would be optimized into a job without tasks."""
    return frame.filter(F.col("score") < 0)


def write_batches(directory: Path, rows: list[list[dict[str, Any]]]) -> list[Path]:
    """One parquet file per batch, modified in batch order (a file stream reads them so)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for b, batch in enumerate(rows):
        path = directory / f"batch-{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(batch, schema=INPUT), path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))
        paths.append(path)
    return paths
