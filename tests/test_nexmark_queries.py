"""NEXMark Q3, Q4, Q5, Q7 and Q8 on megaphone pipelines: a few epochs of generated events with
a random migration of a random stage in the middle (random bins to random workers 0..3, then
the new workers' bins back: scale out and in; windows and joins in columns or key by key)
emit exactly what the batch SQL versions compute over the same events, up to the last
epoch's watermark, with nothing late. And Q4's winning bids on their own (no Spark) against
a brute-force reference."""

from __future__ import annotations

import random
import tempfile
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone import Join, MigrationPlan, Move, Pipeline, WindowAggregate
from megaphone.nexmark import sql
from megaphone.nexmark.definitions import SMALL_RUN
from megaphone.nexmark.functions import TopOfWindow, WinningBids, running_average
from megaphone.nexmark.generator import NexmarkConfig, generate, max_auction_duration_ms
from megaphone.nexmark.queries import QUERIES, top_of_each_window
from megaphone.operators import Context
from megaphone.operators.process import EpochBatch, run_keys
from tests.test_equivalence import SPARK_PHASES
from tests.test_operators import run_epochs

EPOCHS, PER_EPOCH = 5, 500  # 50 s of event time: several windows and auctions close
NUM_BINS = 16
WORKERS = 4  # moves go to workers 0..3


@st.composite
def migrations(draw):
    """Which stage moves, before which epoch, and its steps: ``(bin, k)`` moves bin to the
    ``k``-th other worker (0..2) of 0..3; a last step moves every bin of workers 2 and 3 back
    to 0 or 1. All steps are done before the last epoch. ``vectorized``: whether the windows
    and joins run an epoch in columns or key by key."""
    steps = draw(st.lists(st.lists(st.tuples(st.integers(0, NUM_BINS - 1), st.integers(0, 2)),
                                   min_size=1, max_size=6), min_size=1, max_size=2))
    return {"stage": draw(st.integers(0, 1)),
            "epoch": draw(st.integers(1, EPOCHS - 2 - len(steps))),
            "steps": steps,
            "seed": draw(st.integers(0, 2**16)),
            "backend": draw(st.sampled_from(["memory", "rocksdb"])),
            "vectorized": draw(st.booleans())}


def plan_for(pipe: Pipeline, steps: list, seed: int) -> MigrationPlan:
    """The drawn steps as moves from the owners then, plus the step that scales back in."""
    owners = {b: pipe.routing.owner(b) for b in range(NUM_BINS)}
    rng = random.Random(seed)
    plan = []
    for step in [*steps, None]:
        if step is None:  # scale in: the bins of workers 2 and 3 to 0 or 1
            step = [(b, None) for b, w in owners.items() if w >= 2]
        moves = {}
        for b, k in step:
            if b in moves:  # one move per bin and step
                continue
            dst = rng.randrange(2) if k is None else \
                [w for w in range(WORKERS) if w != owners[b]][k]
            moves[b] = Move(b, owners[b], dst)
            owners[b] = dst
        if moves:
            plan.append(list(moves.values()))
    return MigrationPlan.from_moves(pipe.routing, plan)


def final(name: str, rows: list) -> Counter:
    """The rows a run must have emitted in total; for Q4 (running averages) each category's
    last row."""
    if name == "q4":
        rows = list({r.category: r for r in rows}.values())
    return Counter(rows)


@pytest.mark.parametrize("name", sorted(QUERIES))
@settings(phases=SPARK_PHASES, max_examples=1)
@given(migration=migrations())
def test_query_with_a_migration_equals_batch_sql(spark, name, migration):
    with tempfile.TemporaryDirectory() as state_dir:
        query = QUERIES[name](spark, state_dir, workers=2, num_bins=NUM_BINS,
                              backend=migration["backend"], vectorized=migration["vectorized"])
        assert all(s.config.update.vectorized == migration["vectorized"]
                   for s in query.stages if isinstance(s.config.update, Join | WindowAggregate))
        stage = query.stages[migration["stage"] % len(query.stages)]
        got, handle = [], None
        for epoch in range(EPOCHS):
            if epoch == migration["epoch"]:
                handle = stage.migrate(plan_for(stage, migration["steps"], migration["seed"]))
            got += query.run(epoch * PER_EPOCH, PER_EPOCH)
        want = sql.batch_rows(query, generate(SMALL_RUN, 0, EPOCHS * PER_EPOCH))
        assert want, "the events should give the query something to emit"
        assert final(name, got) == final(name, want)
        assert handle is not None and handle.done
        assert sum(m["bins_moved"] for m in stage.metrics()) > 0
        assert all(m["late_records"] == 0 for s in query.stages for m in s.metrics())
        query.close()


# -- Q4's winning bids, without Spark ------------------------------------------------------

MAX_DURATION = 30


def auction(i: int, t: int, expires: int, reserve: int, category: int = 10) -> tuple:
    return (i, t, {"left": {"id": i, "category": category, "reserve": reserve, "date_time": t,
                            "expires": expires}, "right": None})


def bid(i: int, t: int, price: int, bidder: int = 1) -> tuple:
    return (i, t, {"left": None, "right": {"auction": i, "bidder": bidder, "price": price,
                                           "date_time": t}})


def test_winning_bids_rules() -> None:
    """Reserve, validity window (both ends inclusive), ties (earliest, then lowest bidder), a
    bid before its auction (kept and weighed), bids for a closed auction (purged), and an
    auction without a valid bid (nothing emitted)."""
    fn = WinningBids(max_duration_us=MAX_DURATION)
    epochs = [
        [bid(2, 1, 70), auction(1, 2, expires=10, reserve=50), bid(1, 3, 40),
         bid(1, 4, 60, bidder=7)],
        [auction(2, 1, expires=12, reserve=5), bid(1, 5, 60, bidder=3), bid(1, 10, 60)],
        [bid(1, 11, 999), auction(3, 13, expires=20, reserve=10 ** 6), bid(3, 14, 5)],
        [bid(2, 22, 1)],
        [bid(9, 60, 1)],
        [bid(9, 61, 1)],
    ]
    outputs, late, states = run_epochs(fn, epochs)
    assert [(k, v["price"], v["bidder"]) for _, k, v in outputs] == [(1, 60, 7), (2, 70, 1)]
    assert late == 0
    assert set(states) == {9}  # the rest closed or purged; 9 waits for its auction


@st.composite
def auction_streams(draw):
    """Auctions (new ids) and bids (for any id up to two ahead of the newest auction) in time
    order, at distinct times, split into epochs at random."""
    n = draw(st.integers(1, 40))
    events, t, ids = [], 0, 0
    for _ in range(n):
        t += draw(st.integers(1, 3))
        if draw(st.integers(0, 3)) == 0:
            ids += 1
            events.append(auction(ids, t, t + draw(st.integers(1, MAX_DURATION)),
                                  draw(st.integers(0, 5)), draw(st.integers(10, 11))))
        else:
            events.append(bid(draw(st.integers(1, ids + 2)), t, draw(st.integers(0, 9)),
                              draw(st.integers(1, 3))))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    return [events[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True)]


@settings(max_examples=60)
@given(epochs=auction_streams())
def test_winning_bids_equal_brute_force(epochs) -> None:
    """Every auction the last watermark closed emits the best valid bid of its id, if any;
    nothing is late; what stays is the open auctions and bids that may still find one."""
    fn = WinningBids(max_duration_us=MAX_DURATION)
    outputs, late, states = run_epochs(fn, epochs)
    events = [e for batch in epochs for e in batch]
    watermark = max((t for batch in epochs[:-1] for _, t, _ in batch), default=None)
    closed = [v["left"] for _, _, v in events if v["left"] and watermark is not None
              and v["left"]["expires"] <= watermark]
    want = []
    for a in closed:
        valid = [v["right"] for i, t, v in events if i == a["id"] and v["right"]
                 and a["date_time"] <= t <= a["expires"] and v["right"]["price"] >= a["reserve"]]
        if valid:
            best = min(valid, key=lambda b: (-b["price"], b["date_time"], b["bidder"]))
            want.append((a["id"], a["category"], best["price"], best["bidder"]))
    got = [(k, v["category"], v["price"], v["bidder"]) for _, k, v in outputs]
    assert sorted(got) == sorted(want)
    assert late == 0
    open_until = [(i, t + MAX_DURATION if v["right"] else v["left"]["expires"])
                  for i, t, v in events]
    waiting = {i for i, until in open_until if watermark is None or until > watermark}
    assert set(states) <= waiting


def test_max_auction_duration_bounds_the_generator() -> None:
    for config in (SMALL_RUN, NexmarkConfig(events_per_second=1e6, num_in_flight_auctions=1)):
        auctions = generate(config, 0, 20_000).auctions.to_pandas()
        longest = (auctions.expires - auctions.date_time).max().total_seconds() * 1000
        assert longest <= max_auction_duration_ms(config) <= longest + 2


def test_running_average_and_top_of_window() -> None:
    state, out = running_average(10, [3, 4], None)
    state, out = running_average(10, [8], state)
    assert state == [3, 15] and out == [{"average": 5.0, "auctions": 3}]
    rows = [(0, {"auction": 1, "value": 4}), (0, {"auction": 2, "value": 7}),
            (0, {"auction": 3, "value": 7})]
    state, out = TopOfWindow().process(20, rows, None, None)
    assert state is None and [r["auction"] for r in out] == [2, 3]


@given(st.lists(st.tuples(st.sampled_from([10, 20, 30]), st.integers(0, 9),
                          st.integers(0, 99), st.one_of(st.none(), st.integers(-3, 3))),
                max_size=30))
def test_top_of_window_in_columns_equals_key_by_key(records: list) -> None:
    """``TopOfWindow.process_epoch`` gives the rows ``process`` gives key by key, in the same
    order (ties of value and time in arrival order); it declines a null value."""
    order = list(dict.fromkeys(k for k, _, _, _ in records))
    slot = {k: i for i, k in enumerate(order)}
    none = np.zeros(0, np.int64)
    batch = EpochBatch(order, none, none, np.array([slot[k] for k, *_ in records], np.int64),
                       np.array([t for _, t, _, _ in records], np.int64),
                       pa.array([{"auction": a, "value": v} for _, _, a, v in records],
                                pa.struct([("auction", pa.int64()), ("value", pa.int64())])))
    fn = TopOfWindow()
    got = fn.process_epoch(batch, [None] * len(order), Context(0, None))
    if any(v is None for *_, v in records):
        assert got is None
        return
    want = run_keys(fn, order, batch.timers(), batch.rows(), [None] * len(order),
                    Context(0, None))
    assert got is not None
    assert (got.states, got.fired, got.set) == (want.states, want.fired, want.set)
    assert (got.out_keys, got.out_values) == (want.out_keys, want.out_values)


def _tops(rows: list[tuple[int, int, int | None]]) -> Counter:
    """Plain Python: each window end's rows ``(auction, end, value)`` of the highest value."""
    ends: dict[int, list] = {}
    for row in rows:
        ends.setdefault(row[1], []).append(row)
    return Counter(r for group in ends.values()
                   for r in group if r[2] == max(v for _, _, v in group))


@given(st.lists(st.tuples(st.integers(0, 20), st.sampled_from([10, 20, 30]),
                          st.one_of(st.none(), st.integers(-3, 3)), st.integers(0, 3)),
                max_size=40))
def test_windows_cut_to_their_tops_where_made_leave_the_top_as_it_is(rows: list) -> None:
    """Q5's and Q7's combine of the window stage's outputs at each worker: the top of every
    window over all workers' combined rows is the top over all their rows; a row with a null
    value is kept (the top stage judges it), and the rows keep their order."""
    output = pa.struct([("start", pa.int64()), ("end", pa.int64()), ("value", pa.int64())])

    def outputs(part: list) -> pa.Table:
        return pa.table({"auction": pa.array([a for a, *_ in part], pa.int64()),
                         "output": pa.array([{"start": e - 10, "end": e, "value": v}
                                             for _, e, v, _ in part], output)})

    kept = []
    for worker in range(4):
        mine = [r for r in rows if r[3] == worker]
        cut = top_of_each_window(outputs(mine))
        assert cut.schema == outputs(mine).schema
        got = [(r["auction"], r["output"]["end"], r["output"]["value"]) for r in cut.to_pylist()]
        assert got == [r[:3] for r in mine if r[:3] in got]  # a subset, in order
        assert {r[:3] for r in mine if r[2] is None} <= set(got)
        kept += got
    if not any(v is None for _, _, v, _ in rows):
        assert _tops(kept) == _tops([r[:3] for r in rows])
    floats = pa.table({"auction": [1, 2], "output": pa.array(
        [{"end": 10, "value": 1.5}, {"end": 10, "value": 2.5}])})
    assert top_of_each_window(floats) is floats  # compared in Python by the top stage
