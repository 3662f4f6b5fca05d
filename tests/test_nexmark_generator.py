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
    most_popular,
)

CONFIG = NexmarkConfig()


def concat(parts, name):
    return pa.concat_tables([getattr(p, name) for p in parts])


@settings(max_examples=30, deadline=None)
@given(start=st.integers(0, 10**9), cuts=st.lists(st.integers(0, 400), max_size=4),
       seed=st.integers(0, 2**40), skew=st.sampled_from([0, 1.2]))
def test_any_split_of_a_range_generates_the_same_events(start, cuts, seed, skew):
    config = NexmarkConfig(seed=seed, skew=skew)
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


#: Far into the stream: the auctions in flight and the active people are all past the first
#: 1000 ids, which the skewed choices draw from.
LATE = 10**6
#: Each id's weight under a Zipf law of exponent 1.2 over 1000 ids.
ZIPF = np.arange(1, 1001) ** -1.2 / np.sum(np.arange(1, 1001) ** -1.2)


def test_skew_changes_only_the_hot_choices_and_zero_keeps_nexmarks_rule():
    uniform, skewed = generate(CONFIG, LATE, 20_000), \
        generate(NexmarkConfig(skew=1.2), LATE, 20_000)
    assert skewed.persons.equals(uniform.persons)
    assert skewed.auctions.drop_columns("seller").equals(uniform.auctions.drop_columns("seller"))
    assert skewed.bids.drop_columns("auction").equals(uniform.bids.drop_columns("auction"))
    skewed_ids = np.arange(1000) + FIRST_AUCTION_ID
    bid_events = np.flatnonzero(np.arange(LATE, LATE + 20_000) % 50 >= 4) + LATE
    got = skewed.bids.column("auction").to_numpy()
    before = uniform.bids.column("auction").to_numpy()
    # at this point no other choice can pick the skewed ids: they mark the hot bids
    hot = np.isin(got, skewed_ids)
    assert not np.isin(before, skewed_ids).any()
    assert (got[~hot] == before[~hot]).all()
    beam_hot = last_auction_id(bid_events) // 100 * 100 + FIRST_AUCTION_ID
    assert (before[hot] == beam_hot[hot]).all()  # skew 0: NEXMark's hot auction, as before
    assert 0.47 < hot.mean() < 0.53  # hot_auction_ratio 2
    sellers, before = skewed.auctions.column("seller").to_numpy(), \
        uniform.auctions.column("seller").to_numpy()
    hot = np.isin(sellers, np.arange(1000) + FIRST_PERSON_ID)
    assert (sellers[~hot] == before[~hot]).all() and 0.70 < hot.mean() < 0.80


def test_the_most_popular_auction_and_seller_get_their_zipf_share():
    config = NexmarkConfig(skew=1.2, hot_auction_ratio=10, hot_sellers_ratio=10)
    events = generate(config, LATE, 400_000)
    auctions = events.bids.column("auction").to_numpy()
    top = most_popular(config, "auction", 3)
    shares = [np.mean(auctions == a) for a in top]
    # 368,000 bids; 0.9 of them Zipf draws: the first id 0.187 (sd 0.0006), the second 0.081
    assert abs(shares[0] - 0.9 * ZIPF[0]) < 0.005
    assert abs(shares[1] - 0.9 * ZIPF[1]) < 0.004 and abs(shares[2] - 0.9 * ZIPF[2]) < 0.004
    sellers = events.auctions.column("seller").to_numpy()
    # 24,000 auctions: the top seller 0.187 (sd 0.0025)
    assert abs(np.mean(sellers == most_popular(config, "seller", 1)[0]) - 0.9 * ZIPF[0]) < 0.015
    assert len(set(most_popular(config, "auction", 1000).tolist())) == 1000


def test_a_skewed_stream_is_fixed_by_its_seed():
    a, b = NexmarkConfig(skew=1.2, seed=3), NexmarkConfig(skew=1.2, seed=4)
    assert generate(a, LATE, 3000).bids.equals(generate(a, LATE, 3000).bids)
    assert list(most_popular(a, "auction", 5)) == list(most_popular(a, "auction", 5))
    assert list(most_popular(a, "auction", 5)) != list(most_popular(b, "auction", 5))
    # sellers and auctions have shuffles of their own
    assert list(most_popular(a, "seller", 5)) != list(most_popular(a, "auction", 5))


@pytest.mark.parametrize(("kw", "message"), [
    ({"events_per_second": 0}, "events_per_second"),
    ({"num_active_people": 0}, "num_active_people"),
    ({"hot_auction_ratio": True}, "hot_auction_ratio"),
    ({"seed": -1}, "seed"),
    ({"skew": -0.5}, "skew"),
    ({"skew": True}, "skew"),
    ({"skew": 11}, "skew"),
    ({"skew_keys": 0}, "skew_keys"),
])
def test_a_bad_configuration_is_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        NexmarkConfig(**kw)


@pytest.mark.parametrize(("config", "kind", "count", "message"), [
    (CONFIG, "auction", 1, "no skew"),
    (NexmarkConfig(skew=1.0), "bidder", 1, "kind"),
    (NexmarkConfig(skew=1.0, skew_keys=10), "auction", 11, "count"),
])
def test_popular_ids_of_a_stream_without_them_are_refused(config, kind, count, message):
    with pytest.raises(ValueError, match=message):
        most_popular(config, kind, count)


def test_a_range_out_of_bounds_is_refused():
    with pytest.raises(ValueError, match="outside"):
        generate(CONFIG, -1, 10)
