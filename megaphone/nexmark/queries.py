"""NEXMark queries Q3, Q4, Q5, Q7 and Q8 as megaphone pipelines, so that their state (join
sides, open windows and auctions) migrates between workers while they run.

Each query is an object that creates its pipelines under a state directory (a
:class:`~megaphone.Chain` of them: stage ``i`` in ``state_dir/<i>-<name>``) and runs one epoch
per :meth:`NexmarkQuery.run`: it generates a range of events
(:func:`~megaphone.nexmark.generator.generate`), feeds the ones the query reads and returns
the epoch's outputs as rows of :mod:`~megaphone.nexmark.definitions` (from the last stage's
outputs as Arrow on the driver: :meth:`~megaphone.Chain.process_arrow`). Migrate a stage with
``query.stages[i].migrate(plan)``. Beam's nexmark queries are the reference; where these
differ, the query's docstring says so. :mod:`~megaphone.nexmark.sql` computes the same rows in
batch.

>>> q = Q5(spark, "/tmp/q5")  # doctest: +SKIP
>>> for epoch in range(5):
...     rows = q.run(epoch * 500, 500)  # doctest: +SKIP
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from megaphone.migrator.pipeline.chain import Chain, Combine, Link
from megaphone.migrator.pipeline.facade import Pipeline
from megaphone.nexmark import definitions as D
from megaphone.nexmark.functions import (
    RUNNING_AVERAGE_TYPE,
    TopOfWindow,
    WinningBids,
    running_average,
)
from megaphone.nexmark.generator import Events, NexmarkConfig, generate, max_auction_duration_ms
from megaphone.operators import Join, WindowAggregate
from megaphone.operators.join_input import join_input


class NexmarkQuery(ABC):
    """A NEXMark query on megaphone pipelines (one :class:`~megaphone.Chain`).

    ``config``: the generated stream (default :data:`~megaphone.nexmark.definitions.SMALL_RUN`);
    ``options``: keyword arguments for every stage's :class:`~megaphone.Pipeline` (``workers``,
    ``num_bins``, ``backend``, ...). Keys are int64 ids (person, auction, category, window end).
    Lateness is 0: the generator's events come in event-time order. ``vectorized=False`` runs
    the query's windows and joins key by key (their ``vectorized`` flag): the same outputs and
    state, slower; a baseline to compare the two in one run.
    """

    #: The query's name, and the type of its output rows.
    name: ClassVar[str]
    row_type: ClassVar[type[NamedTuple]]

    def __init__(self, spark: SparkSession, state_dir: str | Path,
                 config: NexmarkConfig = D.SMALL_RUN, *, vectorized: bool = True,
                 **options: Any) -> None:
        self.spark = spark
        self.config = config
        self.vectorized = vectorized
        self.state_dir = Path(state_dir)
        self._options = options
        stages, links = self._stages()
        self.chain = Chain(stages, links, combines=self._combines())
        #: The watermark the last epoch ran with (its first stage's, in microseconds; ``None``
        #: before any event time): what that epoch finalized (windows, auctions) ends there.
        #: Tracked over the epochs this object ran (a reopened query starts from ``None``).
        self.watermark_us: int | None = None
        self._high: int | None = None  # the largest event time fed to the first stage

    @property
    def stages(self) -> list[Pipeline]:
        """The query's pipelines, in the order an epoch runs them."""
        return self.chain.stages

    def pipeline(self, index: int, name: str, **kw: Any) -> Pipeline:
        """Stage ``index``'s pipeline, in its own directory under the query's."""
        return Pipeline(self.spark, str(self.state_dir / f"{index}-{name}"), key_type="int64",
                        **{**self._options, **kw})

    def run(self, start: int, count: int, *, input_end: float | None = None) -> list[Any]:
        """Run one epoch over the events ``start .. start + count - 1``; its output rows.

        ``input_end``: when the epoch's input was complete (``time.time()`` seconds), passed to
        every stage (:meth:`~megaphone.Pipeline.process`): their ``latency_s`` metric, and what
        a deadline plan sees of a backlog.
        """
        tables = self.inputs(generate(self.config, start, count))
        frames = {name: self.spark.createDataFrame(t) for name, t in tables.items()}
        return self.run_frames(frames, max_time_us(tables.values()), input_end=input_end)

    def run_frames(self, frames: dict[str, DataFrame], high_us: int | None, *,
                   input_end: float | None = None) -> list[Any]:
        """Run one epoch over :meth:`inputs` already made DataFrames (for example read from
        files written ahead: ``bench/nexmark.py``); ``high_us`` is their largest event time
        (:func:`max_time_us` of the tables; ``None`` if empty). Its output rows, as
        :meth:`run`'s."""
        out = self.rows(self.chain.process_arrow(self.batch(**frames), input_end=input_end))
        self.watermark_us = self._high  # lateness 0: the largest event time committed before
        if high_us is not None and (self._high is None or high_us > self._high):
            self._high = high_us
        return out

    def rows(self, outputs: pa.Table) -> list[Any]:
        """The last stage's outputs of an epoch (a table of its outputs schema: from
        :meth:`~megaphone.Chain.process_arrow`, or ``toArrow()`` of a stream's) as rows of
        :attr:`row_type`."""
        columns = [c.to_pylist() for c in self.row_columns(outputs)]
        return [self.row_type._make(r) for r in zip(*columns, strict=True)]

    def close(self) -> None:
        """Close every stage (their state directories stay, and reopen where they were)."""
        self.chain.close()

    def __enter__(self) -> NexmarkQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def _stages(self) -> tuple[Sequence[Pipeline], Sequence[Link | None]]:
        """The query's pipelines and the links between them."""

    def _combines(self) -> Sequence[Combine | None]:
        """The chain's combines of its stages' outputs (:class:`~megaphone.Chain`): none."""
        return ()

    @abstractmethod
    def inputs(self, events: Events) -> dict[str, pa.Table]:
        """The generated events the query reads (filtered and projected), by name."""

    @abstractmethod
    def batch(self, **frames: DataFrame) -> DataFrame:
        """The first stage's input from the :meth:`inputs` as DataFrames."""

    @abstractmethod
    def row_columns(self, outputs: pa.Table) -> list[pa.ChunkedArray]:
        """The last stage's outputs as the columns of :attr:`row_type`, times in
        microseconds."""


class Q3(NexmarkQuery):
    """Local item suggestion: every auction of category 10 whose seller lives in OR, ID or CA,
    as ``(name, city, state, auction id)``. An unbounded inner :class:`~megaphone.Join` of the
    persons and auctions keyed by person id (``person.id = auction.seller``): each pair is
    emitted once, in the epoch its second row arrives. As Beam's, both sides are kept for ever
    (Beam expires persons after a while; NEXMark's definition keeps them)."""

    name = "q3"
    row_type = D.Q3Row

    def _stages(self) -> tuple[Sequence[Pipeline], Sequence[Link | None]]:
        return [self.pipeline(0, "join", key="key", value="value", event_time="time",
                              update=Join(vectorized=self.vectorized))], []

    def inputs(self, events: Events) -> dict[str, pa.Table]:
        """Persons of OR, ID and CA and auctions of category 10, with the columns kept."""
        persons = events.persons.filter(pc.is_in(events.persons["state"],
                                                 value_set=pa.array(D.Q3_STATES)))
        auctions = events.auctions.filter(pc.equal(events.auctions["category"], D.Q3_CATEGORY))
        return {"persons": persons.select(["id", "name", "city", "state", "date_time"]),
                "auctions": auctions.select(["id", "seller", "category", "date_time"])}

    def batch(self, **frames: DataFrame) -> DataFrame:
        """Persons (left) and auctions (right) keyed by person id and seller."""
        return join_input(frames["persons"], frames["auctions"], "id", "seller", "date_time")

    def row_columns(self, outputs: pa.Table) -> list[pa.ChunkedArray]:
        """``(name, city, state, auction id)`` of each joined pair."""
        out = outputs.column("output")
        return [_field(out, "left", "name"), _field(out, "left", "city"),
                _field(out, "left", "state"), _field(out, "right", "id")]


class Q4(NexmarkQuery):
    """Average closing price per category. Stage 1, keyed by auction id over auctions and bids
    (:func:`~megaphone.join_input`): :class:`~megaphone.nexmark.functions.WinningBids` emits
    an auction's winning bid when the watermark reaches its ``expires``. Stage 2, keyed by
    category: the running average of the closing prices, emitted for the categories whose
    average changed in the epoch.

    Differs from Beam: Beam averages over sliding windows of the closing times; this keeps
    NEXMark's original running average over every closed auction. A bid at exactly
    ``expires`` counts (Beam's definition says ``bid.date_time < expires``).
    """

    name = "q4"
    row_type = D.Q4Row

    def _stages(self) -> tuple[Sequence[Pipeline], Sequence[Link | None]]:
        winners = WinningBids(max_duration_us=max_auction_duration_ms(self.config) * 1000)
        first = self.pipeline(0, "winning-bids", key="key", value="value", event_time="time",
                              update=winners)
        second = self.pipeline(1, "average", key="category", value="price",
                               update=running_average, output_type=RUNNING_AVERAGE_TYPE)
        return [first, second], [lambda out: out.select(
            out.output.category.alias("category"), out.output.price.alias("price"))]

    def inputs(self, events: Events) -> dict[str, pa.Table]:
        """Auctions and bids, with the columns the winning bid needs."""
        return {"auctions": events.auctions.select(["id", "category", "reserve", "date_time",
                                                    "expires"]),
                "bids": events.bids.select(["auction", "bidder", "price", "date_time"])}

    def batch(self, **frames: DataFrame) -> DataFrame:
        """Auctions (left) and bids (right) keyed by auction id."""
        return join_input(frames["auctions"], frames["bids"], "id", "auction", "date_time")

    def row_columns(self, outputs: pa.Table) -> list[pa.ChunkedArray]:
        """``(category, average, auctions)`` of each category whose average changed."""
        out = outputs.column("output")
        return [outputs.column("category"), _field(out, "average"), _field(out, "auctions")]


class _WindowTop(NexmarkQuery):
    """A window aggregate per auction over the bids (stage 1), then per window end the
    auctions with the highest aggregate (stage 2, :class:`~megaphone.nexmark.functions.
    TopOfWindow`, whose docstring says why it needs no state)."""

    #: The window aggregate of stage 1 ("count" of bids or "max" of their price).
    aggregate: ClassVar[str]

    def __init__(self, spark: SparkSession, state_dir: str | Path,
                 config: NexmarkConfig = D.SMALL_RUN, *, size_us: int, slide_us: int | None,
                 **options: Any) -> None:
        self.size_us = size_us
        self.slide_us = slide_us
        super().__init__(spark, state_dir, config, **options)

    def _stages(self) -> tuple[Sequence[Pipeline], Sequence[Link | None]]:
        value = None if self.aggregate == "count" else "price"
        windows = WindowAggregate(size_us=self.size_us, slide_us=self.slide_us, agg=self.aggregate,
                                  vectorized=self.vectorized)
        first = self.pipeline(0, "windows", key="auction", value=value, event_time="date_time",
                              update=windows)
        second = self.pipeline(1, "top", key="end", value="row", event_time="time",
                               update=TopOfWindow())
        return [first, second], [_by_window_end]

    def _combines(self) -> Sequence[Combine | None]:
        """Stage 1's outputs cut to each window's top rows where they are made."""
        return [top_of_each_window]

    def inputs(self, events: Events) -> dict[str, pa.Table]:
        """The bids' auction, price and time."""
        return {"bids": events.bids.select(["auction", "price", "date_time"])}

    def batch(self, **frames: DataFrame) -> DataFrame:
        """The bids as they are (keyed by auction)."""
        return frames["bids"]

    def row_columns(self, outputs: pa.Table) -> list[pa.ChunkedArray]:
        """``(window start, end, auction, aggregate)`` of each top auction."""
        end, out = outputs.column("end"), outputs.column("output")
        return [pc.subtract(end, self.size_us), end, _field(out, "auction"),
                _field(out, "value")]


def _by_window_end(out: DataFrame) -> DataFrame:
    """Stage 1's closed windows ``(auction, struct<start, end, value>)`` keyed by window end,
    with the end as event time and ``struct<auction, value>`` as value."""
    return out.select(F.unix_micros(out.output.end).alias("end"), out.output.end.alias("time"),
                      F.struct(out.auction.alias("auction"), out.output.value.alias("value"))
                      .alias("row"))


def top_of_each_window(outputs: pa.Table) -> pa.Table:
    """Stage 1's outputs at one worker ``(auction, struct<start, end, value>)`` cut to the rows
    of each window end's highest integer value (ties: all of them) and any with a null value:
    every row :class:`~megaphone.nexmark.functions.TopOfWindow` can pick after
    :func:`_by_window_end` (the top of all workers' rows is the top of their tops), so the
    windows' rows need not all leave the worker (:class:`~megaphone.Chain`'s ``combines``).
    Values of another type are left as they are (the top stage compares them in Python)."""
    out = outputs.column("output")
    value = pc.struct_field(out, "value")
    if not pa.types.is_integer(value.type):
        return outputs
    rows = pa.table({"end": pc.struct_field(out, "end"), "value": value,
                     "row": np.arange(outputs.num_rows)})
    tops = rows.group_by("end", use_threads=False).aggregate([("value", "max")])
    joined = rows.join(tops, "end", use_threads=False)
    kept = pc.or_kleene(pc.equal(joined.column("value"), joined.column("value_max")),
                        pc.is_null(joined.column("value")))
    picked = joined.column("row").filter(kept.fill_null(True)).to_numpy()
    return outputs.take(np.sort(picked))  # in their order


class Q5(_WindowTop):
    """Hot items: per sliding window (default 10 s every 2 s of event time), the auction(s)
    with the most bids, as ``(window start, end, auction, bids)``. Stage 1 counts each
    auction's bids per window (:class:`~megaphone.WindowAggregate`, emitted when the window
    closes); stage 2 keeps the top count per window end. As Beam's Q5 (which slides every
    5 s), with the window in the row."""

    name = "q5"
    row_type = D.Q5Row
    aggregate = "count"

    def __init__(self, spark: SparkSession, state_dir: str | Path,
                 config: NexmarkConfig = D.SMALL_RUN, *, size_us: int = D.Q5_SIZE_US,
                 slide_us: int = D.Q5_SLIDE_US, **options: Any) -> None:
        super().__init__(spark, state_dir, config, size_us=size_us, slide_us=slide_us,
                         **options)


class Q7(_WindowTop):
    """Highest bid: per tumbling window (default 10 s), the highest bid price and the
    auction(s) that got it, as ``(window start, end, auction, price)``. Stage 1 takes each
    auction's highest price per window, stage 2 the highest of those per window end. Beam's
    Q7 emits the whole bid (bidder and time too); this keeps auction and price."""

    name = "q7"
    row_type = D.Q7Row
    aggregate = "max"

    def __init__(self, spark: SparkSession, state_dir: str | Path,
                 config: NexmarkConfig = D.SMALL_RUN, *, size_us: int = D.Q7_SIZE_US,
                 **options: Any) -> None:
        super().__init__(spark, state_dir, config, size_us=size_us, slide_us=None, **options)


class Q8(NexmarkQuery):
    """New users: persons who opened an auction in the tumbling window (default 10 s) they
    signed up in, as ``(person id, name, auction reserve, window start)``, one row per such
    (person, auction) pair as Beam's Q8. A :class:`~megaphone.Join` with ``window_us`` keyed
    by person id: each pair is emitted in the epoch its second row arrives, and a window's
    rows leave the state once the watermark passes its end."""

    name = "q8"
    row_type = D.Q8Row

    def __init__(self, spark: SparkSession, state_dir: str | Path,
                 config: NexmarkConfig = D.SMALL_RUN, *, window_us: int = D.Q8_WINDOW_US,
                 **options: Any) -> None:
        self.window_us = window_us
        super().__init__(spark, state_dir, config, **options)

    def _stages(self) -> tuple[Sequence[Pipeline], Sequence[Link | None]]:
        return [self.pipeline(0, "join", key="key", value="value", event_time="time",
                              update=Join(window_us=self.window_us,
                                          vectorized=self.vectorized))], []

    def inputs(self, events: Events) -> dict[str, pa.Table]:
        """Persons and auctions, with the columns the join keeps."""
        return {"persons": events.persons.select(["id", "name", "date_time"]),
                "auctions": events.auctions.select(["id", "seller", "reserve", "date_time"])}

    def batch(self, **frames: DataFrame) -> DataFrame:
        """Persons (left) and auctions (right) keyed by person id and seller."""
        return join_input(frames["persons"], frames["auctions"], "id", "seller", "date_time")

    def row_columns(self, outputs: pa.Table) -> list[pa.ChunkedArray]:
        """``(person id, name, reserve, window start)`` of each joined pair."""
        out = outputs.column("output")
        joined = pc.cast(_field(out, "left", "date_time"), pa.int64()).to_numpy()
        # the window's start: the multiple of its size at or before (floored, as Spark's pmod)
        start = pa.chunked_array([joined - np.mod(joined, self.window_us)], pa.int64())
        return [_field(out, "left", "id"), _field(out, "left", "name"),
                _field(out, "right", "reserve"), start]


def _field(column: pa.ChunkedArray, *path: str) -> pa.ChunkedArray:
    """The field at ``path`` (names, outermost first) of a struct column."""
    return pc.struct_field(column, list(path))


#: The queries by name.
QUERIES: dict[str, type[NexmarkQuery]] = {q.name: q for q in (Q3, Q4, Q5, Q7, Q8)}


def max_time_us(tables: Any) -> int | None:
    """The largest ``date_time`` (microseconds) among ``tables``; ``None`` if they are empty."""
    us = pa.timestamp("us", tz="UTC")
    times = [pc.max(t["date_time"].cast(us).cast(pa.int64())).as_py() for t in tables
             if t.num_rows]
    return max(times) if times else None
