"""A deterministic NEXMark event generator: persons, auctions and bids as Arrow tables.

It follows the NEXMark model as Beam's ``nexmark`` generator implements it. Event ``n`` is a
person, an auction or a bid by ``n mod 50`` (1 : 3 : 46). Person and auction ids are dense and
follow from the event number. An auction's seller and a bid's bidder and auction are "hot" most
of the time (the first of the latest 100 persons or auctions), and otherwise drawn from the
active people and the auctions in flight, plus a few ids not created yet (the "lead": a join
then sees the other side arrive late too). Event time advances at a fixed rate.

With ``skew`` > 0 the hot choices follow a Zipf law instead: a hot bid's auction and a hot
auction's seller are drawn from a fixed set of ``skew_keys`` auctions and persons, so that
the same few keys carry much of the stream for the whole run: a skewed NEXMark stream, as
rescaling systems (DRRS, ICDE 2025) are evaluated on. ``skew`` = 0 is the stream above,
unchanged.

Every random choice is a hash of the seed, the event number and the field (XXH64, as for bins),
never a stateful random generator. So any range of events can be generated on its own, on any
worker, in any order: ``generate(c, 0, 100)`` followed by ``generate(c, 100, 100)`` is
``generate(c, 0, 200)``. It does not reproduce Beam's events value for value (that would need
Java's ``Random``), and it leaves out Beam's ``extra`` padding column.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.routing.xxh64 import hash_int64

#: Events per cycle and how many of them are persons, auctions and bids, in that order.
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
#: The first ids, so that queries filtering on small ids find matches on small runs.
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
#: Hot sellers, bidders and auctions are the first of each batch of this many ids.
HOT_GROUP = 100
#: Ids not created yet that a random choice may still pick.
ID_LEAD = 10
#: Kinds of id a skewed choice draws: a bid's auction, an auction's seller.
SKEWED_KINDS = ("auction", "seller")
#: The largest Zipf exponent accepted (beyond it the first id takes nearly everything).
MAX_SKEW = 10.0
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")

TIME = pa.timestamp("ms", tz="UTC")
PERSON_SCHEMA = pa.schema([
    ("id", pa.int64()), ("name", pa.string()), ("email_address", pa.string()),
    ("credit_card", pa.string()), ("city", pa.string()), ("state", pa.string()),
    ("date_time", TIME)])
AUCTION_SCHEMA = pa.schema([
    ("id", pa.int64()), ("item_name", pa.string()), ("description", pa.string()),
    ("initial_bid", pa.int64()), ("reserve", pa.int64()), ("date_time", TIME),
    ("expires", TIME), ("seller", pa.int64()), ("category", pa.int64())])
BID_SCHEMA = pa.schema([
    ("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
    ("date_time", TIME)])


@dataclass(frozen=True)
class NexmarkConfig:
    """What the generated stream looks like; the defaults are Beam's.

    ``events_per_second`` sets event time (event ``n`` happens ``n / rate`` seconds after
    ``base_time_ms``); ``hot_*_ratio`` ``r`` makes a choice hot with probability ``1 - 1/r``;
    ``seed`` picks another stream of the same shape.

    ``skew`` ``s`` (a Zipf exponent, 0 = off) draws the hot choices of bids' auctions and
    auctions' sellers from the first ``skew_keys`` auction and person ids, the ``r``-th most
    popular with a probability proportional to ``1 / r**s``; which id has which rank is a
    shuffle fixed by the seed (:func:`most_popular`). So ``hot_auction_ratio`` and
    ``hot_sellers_ratio`` set the share of the skewed choices, and ``skew`` how concentrated
    they are. Those ids are created at the start of the stream and keep their popularity
    for ever: later a skewed bid goes to an auction that has closed (Q4 ignores it), and a
    skewed auction's seller signed up long ago (Q8 finds no match for it).
    """

    events_per_second: float = 10_000.0
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    base_time_ms: int = 1_700_000_000_000
    seed: int = 0
    skew: float = 0.0
    skew_keys: int = 1000

    def __post_init__(self) -> None:
        if not 0 < self.events_per_second <= 1e6:
            raise ValueError(f"events_per_second must be in (0, 1e6], got "
                             f"{self.events_per_second}")
        for name in ("num_active_people", "num_in_flight_auctions", "hot_auction_ratio",
                     "hot_sellers_ratio", "hot_bidders_ratio", "skew_keys"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or \
                not 0 <= self.seed < 1 << 63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if isinstance(self.skew, bool) or not isinstance(self.skew, int | float) or \
                not 0 <= self.skew <= MAX_SKEW:
            raise ValueError(f"skew must be a number in [0, {MAX_SKEW:g}], got {self.skew!r}")

    @property
    def inter_event_delay_us(self) -> int:
        """Microseconds between two events."""
        return max(1, round(1e6 / self.events_per_second))

    def timestamp_ms(self, n: np.ndarray) -> np.ndarray:
        """Event time of event number ``n`` (ms since the Unix epoch)."""
        return self.base_time_ms + (n * self.inter_event_delay_us) // 1000


@dataclass(frozen=True)
class Events:
    """The persons, auctions and bids among a range of events, each in event order."""

    persons: pa.Table
    auctions: pa.Table
    bids: pa.Table


def generate(config: NexmarkConfig, start: int, count: int) -> Events:
    """The events numbered ``start .. start + count - 1``."""
    if start < 0 or count < 0 or start + count > 1 << 40:
        raise ValueError(f"events {start}..{start + count} are outside 0..2**40")
    n = np.arange(start, start + count, dtype=np.int64)
    offset = n % PROPORTION_DENOMINATOR
    return Events(
        _persons(config, n[offset < PERSON_PROPORTION]),
        _auctions(config, n[(offset >= PERSON_PROPORTION)
                            & (offset < PERSON_PROPORTION + AUCTION_PROPORTION)]),
        _bids(config, n[offset >= PERSON_PROPORTION + AUCTION_PROPORTION]))


# -- ids ------------------------------------------------------------------------------------


def last_person_id(n: np.ndarray) -> np.ndarray:
    """The newest person id (base 0) at event ``n``: its own id if ``n`` is a person."""
    cycle, offset = np.divmod(n, PROPORTION_DENOMINATOR)
    return cycle * PERSON_PROPORTION + np.minimum(offset, PERSON_PROPORTION - 1)


def last_auction_id(n: np.ndarray) -> np.ndarray:
    """The newest auction id (base 0) at event ``n``: its own id if ``n`` is an auction
    (-1 before the first auction)."""
    cycle, offset = np.divmod(n, PROPORTION_DENOMINATOR)
    person = offset < PERSON_PROPORTION
    cycle = np.where(person, cycle - 1, cycle)
    offset = np.where(person | (offset >= PERSON_PROPORTION + AUCTION_PROPORTION),
                      AUCTION_PROPORTION - 1, offset - PERSON_PROPORTION)
    return cycle * AUCTION_PROPORTION + offset


def _some_person(config: NexmarkConfig, n: np.ndarray, field: int) -> np.ndarray:
    """A person id (base 0) among the active people, or just ahead of the newest."""
    people = last_person_id(n) + 1
    active = np.minimum(people, config.num_active_people)
    return people - active + _below(config, n, field, active + ID_LEAD)


def _some_auction(config: NexmarkConfig, n: np.ndarray, field: int) -> np.ndarray:
    """An auction id (base 0) among those in flight, or just ahead of the newest."""
    newest = last_auction_id(n)
    oldest = np.maximum(newest - config.num_in_flight_auctions, 0)
    return oldest + _below(config, n, field, newest - oldest + 1 + ID_LEAD)


def _hot(config: NexmarkConfig, n: np.ndarray, field: int, ratio: int) -> np.ndarray:
    """True with probability ``1 - 1/ratio``."""
    return _below(config, n, field, ratio) > 0


def _hot_auction(config: NexmarkConfig, n: np.ndarray) -> np.ndarray:
    """A hot bid's auction (base 0): the first of the latest 100, or a skewed draw."""
    if config.skew:
        return _skewed(config, n, "auction")
    return last_auction_id(n) // HOT_GROUP * HOT_GROUP


def _hot_seller(config: NexmarkConfig, n: np.ndarray) -> np.ndarray:
    """A hot auction's seller (base 0): the first of the latest 100, or a skewed draw."""
    if config.skew:
        return _skewed(config, n, "seller")
    return last_person_id(n) // HOT_GROUP * HOT_GROUP


# -- skew -------------------------------------------------------------------------------------

#: The hash fields of the skewed choices: the draw per event, and the shuffle of the ranks.
_SKEW_DRAW_FIELD = 9
_SKEW_RANK_FIELDS = {"auction": 30, "seller": 31}


def most_popular(config: NexmarkConfig, kind: str, count: int) -> np.ndarray:
    """The ``count`` most popular ids of a skewed stream, the most popular first:
    auction ids (``kind="auction"``, what hot bids go to) or person ids (``"seller"``, who
    hot auctions are sold by). A benchmark uses it to know where the hot keys are."""
    if kind not in SKEWED_KINDS:
        raise ValueError(f"kind must be one of {SKEWED_KINDS}, got {kind!r}")
    if not config.skew:
        raise ValueError("the stream has no skew (skew=0): no id is more popular than another")
    if not 0 <= count <= config.skew_keys:
        raise ValueError(f"count must be in [0, skew_keys={config.skew_keys}], got {count}")
    first = FIRST_AUCTION_ID if kind == "auction" else FIRST_PERSON_ID
    return _popularity(config, kind)[0][:count] + first


@functools.lru_cache(maxsize=16)
def _popularity(config: NexmarkConfig, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The ids of ``kind`` (base 0) by rank, and the Zipf law's cumulative probability of
    each rank: rank ``r`` (from 1) weighs ``1 / r**skew``."""
    ids = np.arange(config.skew_keys, dtype=np.int64)
    ranked = np.argsort(_uniform(config, ids, _SKEW_RANK_FIELDS[kind]), kind="stable")
    weights = np.arange(1, config.skew_keys + 1, dtype=np.float64) ** -float(config.skew)
    cumulative = np.cumsum(weights) / weights.sum()
    ranked.setflags(write=False)
    cumulative.setflags(write=False)
    return ranked, cumulative


def _skewed(config: NexmarkConfig, n: np.ndarray, kind: str) -> np.ndarray:
    """An id of ``kind`` (base 0) per event, drawn from the Zipf law over the ranks."""
    ranked, cumulative = _popularity(config, kind)
    rank = np.searchsorted(cumulative, _uniform(config, n, _SKEW_DRAW_FIELD), side="right")
    return ranked[np.minimum(rank, len(ranked) - 1)]


# -- the three kinds of event -----------------------------------------------------------------


def _persons(config: NexmarkConfig, n: np.ndarray) -> pa.Table:
    cards = [_below(config, n, 20 + i, 10_000) for i in range(4)]
    return pa.Table.from_arrays([
        pa.array(last_person_id(n) + FIRST_PERSON_ID),
        _concat(_pick(config, n, 1, FIRST_NAMES), " ", _pick(config, n, 2, LAST_NAMES)),
        _concat(_string(config, n, 3, 7), "@", _string(config, n, 4, 5), ".com"),
        pa.array([f"{a:04d} {b:04d} {c:04d} {d:04d}" for a, b, c, d in zip(*cards, strict=True)],
                 pa.string()),
        _pick(config, n, 5, US_CITIES),
        _pick(config, n, 6, US_STATES),
        pa.array(config.timestamp_ms(n), TIME),
    ], schema=PERSON_SCHEMA)


def _auctions(config: NexmarkConfig, n: np.ndarray) -> pa.Table:
    seller = np.where(_hot(config, n, 1, config.hot_sellers_ratio),
                      _hot_seller(config, n), _some_person(config, n, 2))
    initial = _price(config, n, 3)
    now = config.timestamp_ms(n)
    # An auction lasts, on average, as long as ``num_in_flight_auctions`` more take to start,
    # so about that many are open at any time.
    ahead = _auction_lookahead(config)
    horizon = config.timestamp_ms(n + ahead) - now
    return pa.Table.from_arrays([
        pa.array(last_auction_id(n) + FIRST_AUCTION_ID),
        _string(config, n, 4, 20),
        _string(config, n, 5, 100),
        pa.array(initial),
        pa.array(initial + _price(config, n, 6)),
        pa.array(now, TIME),
        pa.array(now + 1 + _below(config, n, 7, np.maximum(2 * horizon, 1)), TIME),
        pa.array(seller + FIRST_PERSON_ID),
        pa.array(FIRST_CATEGORY_ID + _below(config, n, 8, NUM_CATEGORIES)),
    ], schema=AUCTION_SCHEMA)


def _auction_lookahead(config: NexmarkConfig) -> int:
    """Events until ``num_in_flight_auctions`` more auctions have started."""
    return config.num_in_flight_auctions * PROPORTION_DENOMINATOR // AUCTION_PROPORTION


def max_auction_duration_ms(config: NexmarkConfig) -> int:
    """The longest an auction lasts (``expires - date_time``, in ms): twice the time
    ``num_in_flight_auctions`` more auctions take to start, rounded up. A query that holds a
    bid until its auction shows up (NEXMark Q4) can let the bid go once the watermark is this
    far past it: every auction the bid could belong to has closed by then."""
    return max(1, 2 * -(-_auction_lookahead(config) * config.inter_event_delay_us // 1000))


def _bids(config: NexmarkConfig, n: np.ndarray) -> pa.Table:
    auction = np.where(_hot(config, n, 1, config.hot_auction_ratio),
                       _hot_auction(config, n), _some_auction(config, n, 2))
    # The second person of a batch, so that hot bidders are not the hot sellers.
    bidder = np.where(_hot(config, n, 3, config.hot_bidders_ratio),
                      last_person_id(n) // HOT_GROUP * HOT_GROUP + 1, _some_person(config, n, 4))
    return pa.Table.from_arrays([
        pa.array(auction + FIRST_AUCTION_ID),
        pa.array(bidder + FIRST_PERSON_ID),
        pa.array(_price(config, n, 5)),
        pa.array(config.timestamp_ms(n), TIME),
    ], schema=BID_SCHEMA)


# -- random values ----------------------------------------------------------------------------


def _uniform(config: NexmarkConfig, n: np.ndarray, field: int) -> np.ndarray:
    """A uniform float in [0, 1) per event, fixed by the seed, the event and the field."""
    h = hash_int64(n << 12 | field)
    if config.seed:
        h = hash_int64(h.view(np.int64) ^ config.seed)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _below(config: NexmarkConfig, n: np.ndarray, field: int, bound) -> np.ndarray:
    """A uniform integer in ``[0, bound)`` per event (``bound`` >= 1, scalar or per event)."""
    return np.minimum((_uniform(config, n, field) * bound).astype(np.int64),
                      np.asarray(bound) - 1)


def _price(config: NexmarkConfig, n: np.ndarray, field: int) -> np.ndarray:
    """A price in cents, log-uniform between $1 and $1,000,000."""
    return np.round(10.0 ** (_uniform(config, n, field) * 6.0) * 100.0).astype(np.int64)


def _pick(config: NexmarkConfig, n: np.ndarray, field: int, choices: tuple[str, ...]
          ) -> pa.Array:
    """One of ``choices`` per event."""
    return pa.array(choices, pa.string()).take(pa.array(_below(config, n, field, len(choices))))


_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)


def _string(config: NexmarkConfig, n: np.ndarray, field: int, max_length: int) -> pa.Array:
    """A random lowercase string of 3 to ``max_length`` characters per event, one in 13 of
    them a space."""
    lengths = 3 + _below(config, n, field, max(1, max_length - 3))
    positions = np.arange(max_length, dtype=np.int64)
    # Draws of their own: (event, position) numbers above every event number.
    draws = _uniform(config, (n[:, None] << 7 | positions) + (1 << 47), field)
    chars = np.where(draws < 1 / 13, ord(" "), _LETTERS[(draws * 26).astype(np.int64) % 26])
    data = chars.astype(np.uint8)[positions < lengths[:, None]]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.StringArray.from_buffers(len(n), pa.py_buffer(offsets), pa.py_buffer(data))


def _concat(*parts: pa.Array | str) -> pa.Array:
    """Element-wise concatenation of string arrays and constant strings."""
    return pc.binary_join_element_wise(*parts, "")
