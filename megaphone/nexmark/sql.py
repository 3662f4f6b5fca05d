"""NEXMark Q3, Q4, Q5, Q7 and Q8 as plain Spark batch SQL over all the events at once: what
the streaming queries (:mod:`~megaphone.nexmark.queries`) must have emitted in total.

A streaming query finalizes windows and auctions as its watermark passes them, so the batch
versions of the windowed queries and of Q4 take the streaming run's last watermark
(``watermark_us``) and keep only what it had finalized: windows with ``end <= watermark``,
auctions with ``expires <= watermark``. Q3 and Q8 emit a pair as soon as both rows are there,
so their batch versions are every matching pair (a streaming run matches them all when no row
was late: its ``late_records`` metric says so). Rows are those of
:mod:`~megaphone.nexmark.definitions`; windows are Spark's ``window()``, aligned as the
streaming windows are.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession

from megaphone.nexmark import definitions as D
from megaphone.nexmark.generator import Events
from megaphone.nexmark.queries import Q5, Q7, Q8, NexmarkQuery


def frames(spark: SparkSession, events: Events, *names: str) -> dict[str, DataFrame]:
    """The events of kinds ``names`` (``persons``, ``auctions``, ``bids``; default all three)
    as DataFrames, by kind."""
    return {name: spark.createDataFrame(getattr(events, name))
            for name in names or ("persons", "auctions", "bids")}


def q3(spark: SparkSession, events: Events) -> list[D.Q3Row]:
    """Every auction of category 10 with its seller, who lives in OR, ID or CA."""
    states = ", ".join(f"'{s}'" for s in D.Q3_STATES)
    df = spark.sql(f"""
        SELECT p.name, p.city, p.state, a.id
        FROM {{persons}} p JOIN {{auctions}} a ON p.id = a.seller
        WHERE p.state IN ({states}) AND a.category = :category""",
                   args={"category": D.Q3_CATEGORY},
                   **frames(spark, events, "persons", "auctions"))
    return _rows(df, D.Q3Row)


def q4(spark: SparkSession, events: Events, watermark_us: int | None) -> list[D.Q4Row]:
    """Per category, the average winning price of the auctions closed by ``watermark_us``
    (``expires <= watermark``) that have a winning bid: the highest-priced bid with
    ``date_time <= bid.date_time <= expires`` and ``price >= reserve``."""
    if watermark_us is None:
        return []
    df = spark.sql("""
        WITH valid AS (
            SELECT a.id, a.category, b.price, b.date_time, b.bidder
            FROM {auctions} a JOIN {bids} b ON a.id = b.auction
            WHERE a.date_time <= b.date_time AND b.date_time <= a.expires
              AND b.price >= a.reserve AND unix_micros(a.expires) <= :watermark),
        ranked AS (
            SELECT category, price, row_number() OVER (
                PARTITION BY id ORDER BY price DESC, date_time, bidder) AS rank
            FROM valid)
        SELECT category, avg(price), count(*) FROM ranked WHERE rank = 1 GROUP BY category""",
                   args={"watermark": watermark_us}, **frames(spark, events, "auctions", "bids"))
    return _rows(df, D.Q4Row)


def q5(spark: SparkSession, events: Events, watermark_us: int | None,
       size_us: int = D.Q5_SIZE_US, slide_us: int = D.Q5_SLIDE_US) -> list[D.Q5Row]:
    """Per sliding window closed by ``watermark_us``, the auctions with the most bids."""
    if watermark_us is None:
        return []
    df = spark.sql(f"""
        WITH counts AS (
            SELECT window(date_time, '{size_us} microseconds', '{slide_us} microseconds') AS w,
                   auction, count(*) AS bids
            FROM {{bids}} GROUP BY 1, 2),
        closed AS (
            SELECT unix_micros(w.start) AS w_start, unix_micros(w.end) AS w_end, auction, bids,
                   max(bids) OVER (PARTITION BY w.end) AS top
            FROM counts WHERE unix_micros(w.end) <= :watermark)
        SELECT w_start, w_end, auction, bids FROM closed WHERE bids = top""",
                   args={"watermark": watermark_us}, **frames(spark, events, "bids"))
    return _rows(df, D.Q5Row)


def q7(spark: SparkSession, events: Events, watermark_us: int | None,
       size_us: int = D.Q7_SIZE_US) -> list[D.Q7Row]:
    """Per tumbling window closed by ``watermark_us``, the highest price and the auctions that
    got a bid at it."""
    if watermark_us is None:
        return []
    df = spark.sql(f"""
        WITH windowed AS (
            SELECT window(date_time, '{size_us} microseconds') AS w, auction, price
            FROM {{bids}}),
        closed AS (
            SELECT unix_micros(w.start) AS w_start, unix_micros(w.end) AS w_end, auction, price,
                   max(price) OVER (PARTITION BY w.end) AS top
            FROM windowed WHERE unix_micros(w.end) <= :watermark)
        SELECT DISTINCT w_start, w_end, auction, price FROM closed WHERE price = top""",
                   args={"watermark": watermark_us}, **frames(spark, events, "bids"))
    return _rows(df, D.Q7Row)


def q8(spark: SparkSession, events: Events, window_us: int = D.Q8_WINDOW_US
       ) -> list[D.Q8Row]:
    """Every person and auction of theirs in the tumbling window the person signed up in."""
    df = spark.sql(f"""
        SELECT p.id, p.name, a.reserve, unix_micros(p.w.start)
        FROM (SELECT id, name, window(date_time, '{window_us} microseconds') AS w
              FROM {{persons}}) p
        JOIN (SELECT seller, reserve, window(date_time, '{window_us} microseconds') AS w
              FROM {{auctions}}) a
        ON p.id = a.seller AND p.w = a.w""", **frames(spark, events, "persons", "auctions"))
    return _rows(df, D.Q8Row)


def batch_rows(query: NexmarkQuery, events: Events) -> list[Any]:
    """What ``query`` must have emitted in total over ``events`` (all its epochs' events), by
    its last epoch's watermark and with its window sizes."""
    spark, wm = query.spark, query.watermark_us
    if query.name == "q3":
        return q3(spark, events)
    if query.name == "q4":
        return q4(spark, events, wm)
    if isinstance(query, Q5):
        return q5(spark, events, wm, query.size_us, query.slide_us or query.size_us)
    if isinstance(query, Q7):
        return q7(spark, events, wm, query.size_us)
    if isinstance(query, Q8):
        return q8(spark, events, query.window_us)
    raise ValueError(f"no batch version of query {query.name!r}")


def _rows(df: DataFrame, row_type: Any) -> list[Any]:
    return [row_type._make(r) for r in df.collect()]
