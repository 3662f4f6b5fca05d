"""What the NEXMark queries compute, shared by their streaming versions
(:mod:`~megaphone.nexmark.queries`) and their batch SQL versions (:mod:`~megaphone.nexmark.sql`):
the output rows, the filters and window sizes, and a generator setting that closes windows and
auctions within a few thousand events.

Times in rows are microseconds since the Unix epoch (UTC), so rows of both versions compare
exactly.
"""

from __future__ import annotations

from typing import NamedTuple

from megaphone.nexmark.generator import NexmarkConfig

SECOND_US = 1_000_000

#: A stream for small runs: 50 events a second (2,500 events are 50 s of event time, five
#: 10-second windows) and 20 auctions in flight (auctions last up to 13.3 s, so most of a
#: run's auctions close before it ends). The rest are Beam's defaults.
SMALL_RUN = NexmarkConfig(events_per_second=50.0, num_in_flight_auctions=20)

#: Q3's persons live in these states, and its auctions are of this category (as in Beam).
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10
#: Q5's sliding windows (Beam: 10 s every 5 s; a shorter slide closes more windows).
Q5_SIZE_US = 10 * SECOND_US
Q5_SLIDE_US = 2 * SECOND_US
#: Q7's and Q8's tumbling windows (Beam's 10 s).
Q7_SIZE_US = 10 * SECOND_US
Q8_WINDOW_US = 10 * SECOND_US


class Q3Row(NamedTuple):
    """Q3 (local item suggestion): a seller from OR, ID or CA and an auction of theirs in
    category 10 (Beam's ``NameCityStateId``)."""

    name: str
    city: str
    state: str
    auction: int


class Q4Row(NamedTuple):
    """Q4 (average closing price per category): the average winning price of the category's
    closed auctions so far, and how many there are (Beam's ``CategoryPrice``, plus the
    count)."""

    category: int
    average: float
    auctions: int


class Q5Row(NamedTuple):
    """Q5 (hot items): an auction with the most bids of a sliding window, with that count
    (Beam's ``AuctionCount``, plus the window); ties give one row per auction."""

    start: int
    end: int
    auction: int
    bids: int


class Q7Row(NamedTuple):
    """Q7 (highest bid): the highest bid price of a tumbling window and an auction that got a
    bid at that price (one row per such auction)."""

    start: int
    end: int
    auction: int
    price: int


class Q8Row(NamedTuple):
    """Q8 (new users): a person who opened an auction in the tumbling window they signed up
    in: one row per such (person, auction) pair, with the auction's reserve as in Beam's
    ``IdNameReserve``, and the window's start."""

    person: int
    name: str
    reserve: int
    start: int
