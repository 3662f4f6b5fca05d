"""NEXMark Q7 and Q8 on a skewed stream: the ``--workload q7|q8`` of bench/relief.py.

The stream is the NEXMark generator's with ``skew`` > 0 (:mod:`megaphone.nexmark.generator`):
``1 - 1/--hot-ratio`` of the bids' auctions (Q7) or of the auctions' sellers (Q8) are drawn
from a Zipf law of exponent ``--skew`` over ``--skew-keys`` auctions or persons, the rest
as NEXMark draws them. The query's stateful stage -- Q7's window stage keyed by auction, Q8's
join keyed by person id -- spends ``--cost-ms`` per record on top of its real work (the same
cost model as the keyed count: :class:`Costly`), so the work parallelizes over workers.

**Where the hot keys land.** A key's bin is fixed by its hash and bin ``b`` starts on the
worker whose range of bins holds it, so the benchmark picks the stream instead of the keys: it
takes the first seed from ``--seed`` on whose ``--hot`` most popular ids (``most_popular``:
auctions for Q7, sellers for Q8) all lie in distinct bins of worker 0 (:func:`choose_stream`).
Worker 0 then carries those keys' share of the records and about half of the rest, and at the
benchmark's rate it falls behind; a scale-out with ``balance="load"`` spreads its hot bins over
the new workers. Both orders and every round run on that same stream. With the defaults
(``--skew`` 1.2 over 1000 ids, ``--hot-ratio`` 10, 6 hot ids, 64 bins) worker 0 carries about
72% of Q7's records and 67% of Q8's, and the busiest of the 4 workers after the scale-out about
25% (a short Q7 run measured 73% and 26%, when bin ``b`` started on worker ``b mod
--workers``).

Each epoch reads its input from parquet files, written when its interval ends by a feeder
thread (``bench/nexmark_input.py``), so generating the events is not part of the time between
two epochs.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from nexmark_input import InputFeeder
from pyspark.sql import SparkSession

from megaphone import Pipeline
from megaphone.nexmark import definitions as D
from megaphone.nexmark import sql
from megaphone.nexmark.generator import (
    AUCTION_PROPORTION,
    BID_PROPORTION,
    PERSON_PROPORTION,
    PROPORTION_DENOMINATOR,
    Events,
    NexmarkConfig,
    generate,
    most_popular,
)
from megaphone.nexmark.queries import Q7, Q8, NexmarkQuery
from megaphone.operators.process import Context, EpochBatch, KeyResults, Row, run_epoch
from megaphone.routing.bins import bin_of
from megaphone.routing.table import initial_owners
from megaphone.state_backends import unpack_value

#: The NEXMark workloads; the share of the stream's events their stateful stage reads (bids
#: for Q7, persons and auctions for Q8), and which popular ids it is keyed by.
QUERIES: dict[str, type[NexmarkQuery]] = {"q7": Q7, "q8": Q8}
STAGE_SHARE = {"q7": BID_PROPORTION / PROPORTION_DENOMINATOR,
               "q8": (PERSON_PROPORTION + AUCTION_PROPORTION) / PROPORTION_DENOMINATOR}
HOT_KIND = {"q7": "auction", "q8": "seller"}
#: The kinds of event each query reads (what its batch SQL needs).
READS = {"q7": ("bids",), "q8": ("persons", "auctions")}
#: Seeds tried, at most, for hot ids that all land on worker 0.
SEED_TRIES = 20_000


@dataclass(frozen=True)
class Costly:
    """A process function that spends ``cost_s`` seconds per record of an epoch, then runs
    ``inner`` (a window or join): real per-record work, on a machine where Spark's fixed cost
    per epoch would otherwise dwarf what a worker computes."""

    inner: Any
    cost_s: float

    @property
    def lateness_us(self) -> int:
        """The inner function's lateness."""
        return self.inner.lateness_us

    def output_type(self, value_type: Any) -> Any:
        """The inner function's output type."""
        return self.inner.output_type(value_type)

    def process(self, key: Any, rows: list[Row], state: Any, ctx: Context
                ) -> tuple[Any, list[Any]]:
        """The key's records, after their cost."""
        time.sleep(len(rows) * self.cost_s)
        return self.inner.process(key, rows, state, ctx)

    def on_timer(self, key: Any, time_us: int, state: Any, ctx: Context
                 ) -> tuple[Any, list[Any]]:
        """The inner function's timer (no cost: it is not a record)."""
        return self.inner.on_timer(key, time_us, state, ctx)

    def process_epoch(self, batch: EpochBatch, states: list[Any], ctx: Context
                      ) -> KeyResults:
        """The worker's epoch, after its records' cost, as the inner function runs it."""
        time.sleep(len(batch.slots) * self.cost_s)
        return run_epoch(self.inner, batch, states, ctx)


def stream(args: argparse.Namespace, seed: int) -> NexmarkConfig:
    """The skewed stream: events at the rate that gives the stateful stage ``--rate`` records
    per second (event time advances with it), ``--hot-ratio`` for the skewed choice."""
    ratio = "hot_auction_ratio" if args.workload == "q7" else "hot_sellers_ratio"
    return NexmarkConfig(events_per_second=args.rate / STAGE_SHARE[args.workload], seed=seed,
                         skew=args.skew, skew_keys=args.skew_keys, **{ratio: args.hot_ratio})


def choose_stream(args: argparse.Namespace) -> tuple[NexmarkConfig, list[int]]:
    """The stream of the first seed from ``--seed`` on whose ``--hot`` most popular ids all
    lie in distinct bins of worker 0 (the routing's version 0, :func:`initial_owners`), and
    those ids."""
    kind = HOT_KIND[args.workload]
    first_owners = initial_owners(args.bins, args.workers)
    for seed in range(args.seed, args.seed + SEED_TRIES):
        config = stream(args, seed)
        ids = most_popular(config, kind, args.hot)
        bins = np.asarray(bin_of(ids, args.bins))
        if len(set(bins.tolist())) == len(bins) and not first_owners[bins].any():
            return config, ids.tolist()
    raise SystemExit(f"no seed in {args.seed}..{args.seed + SEED_TRIES - 1} puts the "
                     f"{args.hot} most popular {kind}s in distinct bins of worker 0: lower --hot")


def costly(query: type[NexmarkQuery], cost_s: float) -> type[NexmarkQuery]:
    """``query`` with its first (stateful) stage's function wrapped in :class:`Costly`."""

    class CostlyQuery(query):  # type: ignore[misc, valid-type]
        def pipeline(self, index: int, name: str, **kw: Any) -> Pipeline:
            if index == 0:
                kw["update"] = Costly(kw["update"], cost_s)
            return super().pipeline(index, name, **kw)

    return CostlyQuery


class NexmarkWorkload:
    """Q7 or Q8 on the skewed stream; :attr:`stage` is the stage the benchmark rescales.
    Epoch ``i`` runs events ``[i*N, (i+1)*N)``, ``N`` = events per ``--interval``."""

    def __init__(self, spark: SparkSession, args: argparse.Namespace, path: Path) -> None:
        self.config, self.hot = choose_stream(args)
        size = round(args.window_s * D.SECOND_US)
        sizes = {"size_us": size} if args.workload == "q7" else {"window_us": size}
        self.query = costly(QUERIES[args.workload], args.cost_ms / 1000)(
            spark, path, self.config, workers=args.workers, num_bins=args.bins, **sizes)
        self.stage = self.query.stages[0]
        owners = self.stage.routing.owners()
        if any(int(owners[b]) for b in np.asarray(bin_of(self.hot, args.bins)).tolist()):
            raise AssertionError("the hot ids are not all on worker 0 at the start")
        self.per_epoch = max(1, round(self.config.events_per_second * args.interval))
        self.epochs = 0
        self.rows: list[tuple] = []
        #: The input as files (bench/nexmark_input.py): closed-loop epochs write theirs when
        #: they run, then a thread writes each epoch's when its interval ends.
        self.feeder = InputFeeder(self.query, self.config, self.per_epoch, path / "input-files",
                                  args.interval)
        self._feeding = False

    def epoch(self, input_end: float | None) -> list[tuple]:
        """Run the next epoch (``input_end``: when its interval ended; ``None``: closed loop);
        its output rows, sorted (to compare runs)."""
        if input_end is None:
            self.feeder.write(self.epochs)
        elif not self._feeding:  # open loop from here on
            self.feeder.start(self.epochs, input_end - (self.epochs + 1) * self.feeder.interval)
            self._feeding = True
        frames, high = self.feeder.frames(self.query.spark, self.epochs)
        out = sorted(tuple(r) for r in self.query.run_frames(frames, high, input_end=input_end))
        self.epochs += 1
        self.rows += out
        return out

    def events(self, count: int) -> Events:
        """Events ``0 .. count - 1`` of the kinds the query reads (the others empty),
        generated an epoch at a time (Q8's stream is mostly bids it never reads)."""
        tables: dict[str, list[pa.Table]] = {kind: [] for kind in READS[self.query.name]}
        for start in range(0, count, self.per_epoch):
            part = generate(self.config, start, min(self.per_epoch, count - start))
            for kind, parts in tables.items():
                parts.append(getattr(part, kind))
        return dataclasses.replace(generate(self.config, 0, 0),
                                   **{k: pa.concat_tables(v) for k, v in tables.items()})

    def close(self) -> None:
        """Stop the input and close the query's stages."""
        self.feeder.stop()
        self.query.close()

    def finish(self) -> tuple[dict[Any, Any], int, str]:
        """Check the outputs against the batch SQL of every event fed and that nothing was
        late (else an ``AssertionError``), close; the rescaled stage's state (each key's
        value, order aside: rows that arrive in one epoch may be stored in either order),
        the events fed and what was checked."""
        fed = self.epochs * self.per_epoch
        try:
            want = Counter(tuple(r) for r in sql.batch_rows(self.query, self.events(fed)))
            got = Counter(self.rows)
            if got != want:
                raise AssertionError(
                    f"{self.query.name}: {sum(got.values())} rows, batch SQL "
                    f"{sum(want.values())}; extra {sorted(got - want)[:3]}, missing "
                    f"{sorted(want - got)[:3]}")
            late = sum(int(m["late_records"]) for s in self.query.stages for m in s.metrics())
            if late:
                raise AssertionError(f"{self.query.name}: {late} records dropped as late")
            state = {k: _canonical(unpack_value(v)) for k, v in self.stage.state().collect()}
        finally:
            self.close()
        return state, fed, f"{sum(want.values())} rows = batch SQL, none late"


def _canonical(value: Any) -> Any:
    """``value`` with every list as a tuple in a fixed order (the order of a state's rows
    may differ between runs that computed the same)."""
    if isinstance(value, list | tuple):
        return tuple(sorted((_canonical(v) for v in value), key=repr))
    if isinstance(value, dict):
        return tuple(sorted(((k, _canonical(v)) for k, v in value.items()), key=repr))
    return value
