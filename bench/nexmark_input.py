"""Megaphone's NEXMark input the way native Spark gets it: files written as each epoch ends.

:class:`InputFeeder` generates epoch ``e``'s events when its input interval ends (``t0 + (e+1)
* interval``), writes the query's input tables (:meth:`NexmarkQuery.inputs
<megaphone.nexmark.queries.NexmarkQuery.inputs>`) as one parquet file each, written aside and
renamed in, and the run reads them with ``spark.read.parquet``. So generating the events is
not on the epoch's path, as it is not for native Spark, whose feeder thread writes its files
the same way (``bench/nexmark_native.py``); and the epoch's job scans files rather than a
table the driver made a DataFrame, whose rows Spark plans on the driver and ships inside its
tasks (about 0.3 s of a Q7 epoch at 100,000 events/s: ``bench/chain_epoch.py``,
bench/RESULTS.md, "Where a chain's epoch goes").
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from megaphone.nexmark.generator import NexmarkConfig, generate
from megaphone.nexmark.queries import NexmarkQuery, max_time_us


class InputFeeder:
    """Writes a query's input files per epoch (:meth:`write`, or a thread from :meth:`start`)
    and hands them to the run as DataFrames (:meth:`frames`). ``per_epoch`` events an epoch,
    ``interval`` seconds apart, under ``root``."""

    def __init__(self, query: NexmarkQuery, config: NexmarkConfig, per_epoch: int, root: Path,
                 interval: float) -> None:
        self.query, self.config, self.per_epoch = query, config, per_epoch
        self.root, self.interval = root, interval
        for folder in ("staging", "input"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        self._cond = threading.Condition()
        #: Per epoch written and not yet read: its inputs' names and schemas, its latest time.
        self._written: dict[int, tuple[dict[str, T.StructType], int | None]] = {}
        self._stopped = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def path(self, name: str, epoch: int) -> Path:
        """Where input ``name`` of ``epoch`` is read from."""
        return self.root / "input" / f"{name}-{epoch:06d}.parquet"

    def write(self, epoch: int) -> None:
        """Generate ``epoch``'s events and write the query's inputs of them."""
        self.write_tables(epoch, self.query.inputs(generate(self.config, epoch * self.per_epoch,
                                                            self.per_epoch)))

    def write_tables(self, epoch: int, tables: dict[str, pa.Table]) -> None:
        """Write ``epoch``'s inputs (:meth:`NexmarkQuery.inputs
        <megaphone.nexmark.queries.NexmarkQuery.inputs>` of its events) as its files."""
        for name, table in tables.items():
            staged = self.root / "staging" / self.path(name, epoch).name
            pq.write_table(table, staged)
            staged.rename(self.path(name, epoch))
        schemas = {name: from_arrow_schema(t.schema) for name, t in tables.items()}
        with self._cond:
            self._written[epoch] = (schemas, max_time_us(tables.values()))
            self._cond.notify_all()

    def start(self, first: int, t0: float) -> None:
        """From epoch ``first`` on, write each epoch when its interval ends (``t0`` is the end
        of the interval before epoch 0's), in a thread, until :meth:`stop`."""
        self._thread = threading.Thread(target=self._feed, args=(first, t0), daemon=True,
                                        name="nexmark-input")
        self._thread.start()

    def _feed(self, epoch: int, t0: float) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopped and time.time() < t0 + (epoch + 1) * self.interval:
                        self._cond.wait(t0 + (epoch + 1) * self.interval - time.time())
                    if self._stopped:
                        return
                self.write(epoch)
                epoch += 1
        except BaseException as exc:  # raised in the run's thread by frames()
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def frames(self, spark: SparkSession, epoch: int
               ) -> tuple[dict[str, DataFrame], int | None]:
        """``epoch``'s inputs as DataFrames read from their files, once written (waiting for
        them), and their latest event time (for :meth:`NexmarkQuery.run_frames
        <megaphone.nexmark.queries.NexmarkQuery.run_frames>`)."""
        with self._cond:
            while epoch not in self._written and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise RuntimeError("the input feeder failed") from self._error
            schemas, high = self._written.pop(epoch)
        return ({name: spark.read.schema(schema).parquet(str(self.path(name, epoch)))
                 for name, schema in schemas.items()}, high)

    def stop(self) -> None:
        """Stop the thread (between two epochs' files)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
