"""The NEXMark generator: deterministic, splittable, and shaped as the NEXMark model says."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone.nexmark.generator import (
    AUCTION_SCHEMA,
    BID_SCHEMA,
    FIRST_AUCTION_ID,
    FIRST_PERSON_ID,
    ID_LEAD,
    PERSON_SCHEMA,
    US_STATES,
    NexmarkConfig,
    generate,
    last_auction_id,
    last_person_id,
)

CONFIG = NexmarkConfig()


def concat(parts, name):
    return pa.concat_tables([getattr(p, name) for p in parts])


@settings(max_examples=30, deadline=None)
@given(start=st.integers(0, 10**9), cuts=st.lists(st.integers(0, 400), max_size=4),
       seed=st.integers(0, 2**40))
def test_any_split_of_a_range_generates_the_same_events(start, cuts, seed):
    config = NexmarkConfig(seed=seed)
    total = 400
    bounds = sorted({0, total, *cuts})
    parts = [generate(config, start + a, b - a) for a, b in itertools.pairwise(bounds)]
    whole = generate(config, start, total)
    for name in ("persons", "auctions", "bids"):
        assert concat(parts, name).equals(getattr(whole, name))


def test_the_stream_has_the_nexmark_shape():
    events = generate(CONFIG, 0, 50_000)
    persons, auctions, bids = events.persons, events.auctions, events.bids
    assert (persons.schema, auctions.schema, bids.schema) == \
        (PERSON_SCHEMA, AUCTION_SCHEMA, BID_SCHEMA)
    assert (persons.num_rows, auctions.num_rows, bids.num_rows) == (1000, 3000, 46_000)
    # dense ids in event order
    assert persons.column("id").to_pylist() == list(range(FIRST_PERSON_ID, FIRST_PERSON_ID + 1000))
    assert auctions.column("id").to_pylist() == \
        list(range(FIRST_AUCTION_ID, FIRST_AUCTION_ID + 3000))
    # a seller or bidder is a person created already or at most ID_LEAD ids ahead
    people_at = np.arange(50_000) // 50 + 1  # persons created up to each event
    auction_events = np.flatnonzero(np.isin(np.arange(50_000) % 50, (1, 2, 3)))
    sellers = auctions.column("seller").to_numpy() - FIRST_PERSON_ID
    assert (sellers >= 0).all() and (sellers < people_at[auction_events] + ID_LEAD).all()
    bid_events = np.flatnonzero(np.arange(50_000) % 50 >= 4)
    bidders = bids.column("bidder").to_numpy() - FIRST_PERSON_ID
    assert (bidders >= 0).all() and (bidders < people_at[bid_events] + ID_LEAD).all()
    bid_auctions = bids.column("auction").to_numpy() - FIRST_AUCTION_ID
    newest = last_auction_id(bid_events)
    assert (bid_auctions >= 0).all() and (bid_auctions <= newest + ID_LEAD).all()
    # hot auctions and bidders: about 1 - 1/ratio of the bids (2 and 4 by default)
    hot_auction = bid_auctions == newest // 100 * 100
    hot_bidder = bidders == last_person_id(bid_events) // 100 * 100 + 1
    assert 0.47 < hot_auction.mean() < 0.56 and 0.72 < hot_bidder.mean() < 0.78
    # values in their ranges
    assert set(persons.column("state").to_pylist()) == set(US_STATES)
    assert set(auctions.column("category").to_pylist()) == set(range(10, 15))
    prices = bids.column("price").to_numpy()
    assert prices.min() >= 100 and prices.max() <= 100_000_000
    assert (auctions.column("reserve").to_numpy() > auctions.column("initial_bid").to_numpy()).all()
    lengths = pa.compute.utf8_length(auctions.column("item_name")).to_numpy()
    assert lengths.min() >= 3 and lengths.max() <= 20
    emails = persons.column("email_address").to_pylist()
    assert all(e.endswith(".com") and "@" in e for e in emails)


def test_event_time_advances_at_the_rate():
    config = NexmarkConfig(events_per_second=1000, base_time_ms=0)
    events = generate(config, 0, 5000)
    times = events.bids.column("date_time").cast(pa.int64()).to_numpy()
    assert (np.diff(times) >= 0).all() and times[-1] == 4999
    auctions = events.auctions
    opened = auctions.column("date_time").cast(pa.int64()).to_numpy()
    expires = auctions.column("expires").cast(pa.int64()).to_numpy()
    assert (expires > opened).all()
    # open, on average, as long as 100 more auctions take to start (1,666 events: 1.67 s)
    assert 1450 < np.mean(expires - opened) < 1900


def test_seeds_give_other_streams_of_the_same_shape():
    a, b = generate(NexmarkConfig(seed=1), 0, 5000), generate(NexmarkConfig(seed=2), 0, 5000)
    assert not a.bids.equals(b.bids)
    assert a.bids.num_rows == b.bids.num_rows
    assert a.persons.column("id").equals(b.persons.column("id"))


@pytest.mark.parametrize(("kw", "message"), [
    ({"events_per_second": 0}, "events_per_second"),
    ({"num_active_people": 0}, "num_active_people"),
    ({"hot_auction_ratio": True}, "hot_auction_ratio"),
    ({"seed": -1}, "seed"),
])
def test_a_bad_configuration_is_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        NexmarkConfig(**kw)


def test_a_range_out_of_bounds_is_refused():
    with pytest.raises(ValueError, match="outside"):
        generate(CONFIG, -1, 10)
