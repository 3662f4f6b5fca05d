"""The per-key functions NEXMark's queries need beyond windows and joins: the winning bid of
each auction (Q4's first stage, Beam's ``WinningBids``), a running average (Q4's second stage)
and the top of a window (Q5's and Q7's second stages).

They run on Spark's Python workers, which import them from here; their state is msgpack
(lists and ints), so it migrates with its key's bin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.operators.process import ColumnResults, Context, EpochBatch, Row

#: Indices into a stored auction ``[category, reserve, date_time, expires]`` and a stored bid
#: ``[price, date_time, bidder]`` (times in microseconds).
_CATEGORY, _RESERVE, _OPENS, _EXPIRES = range(4)
_PRICE, _TIME, _BIDDER = range(3)


@dataclass(frozen=True)
class WinningBids:
    """The winning bid of every auction, emitted when the auction closes (a
    :class:`~megaphone.operators.ProcessFunction` keyed by auction id, over
    ``join_input(auctions, bids, "id", "auction", "date_time")``).

    A bid is valid for its auction when ``auction.date_time <= bid.date_time <=
    auction.expires`` and ``bid.price >= auction.reserve``; the winner is the valid bid of the
    highest price, the earliest of equal prices (then the lowest bidder id, so that the result
    never depends on arrival order). An auction closes when the watermark reaches its
    ``expires`` (a timer): it emits ``{auction, category, price, bidder}`` if it has a winner
    (as Beam, an auction without a valid bid emits nothing) and leaves the state.

    A bid may arrive before its auction (the generator makes bids for auctions a few ids
    ahead): it is kept, and weighed when its auction arrives, until the watermark passes
    ``bid.date_time + max_duration_us`` (the longest auction: every auction the bid could
    belong to has closed by then). So the state holds the open auctions and a bounded window
    of such bids. Late input is counted (``late_records``) and dropped: an auction whose
    ``expires`` is at or before the watermark, and a bid that could only belong to a closed
    auction.
    """

    max_duration_us: int
    lateness_us: int = 0

    def output_type(self, value_type: pa.DataType | None) -> pa.DataType:
        """``struct<auction, category, price, bidder>``, all int64."""
        return pa.struct([(name, pa.int64())
                          for name in ("auction", "category", "price", "bidder")])

    def process(self, key: Any, rows: list[Row], state: Any, ctx: Context
                ) -> tuple[Any, list[Any]]:
        """Take the epoch's auction (at most one: ids are unique) and bids of ``key``."""
        auction, best, pending = _unpack(state)
        for _, value in rows:
            if value.get("left") is not None:
                row = value["left"]
                if ctx.is_late(row["expires"]):
                    ctx.drop_late()
                    continue
                auction = [row["category"], row["reserve"], row["date_time"], row["expires"]]
                for bid in pending:
                    best = _better(auction, best, bid)
                pending = []  # weighed: no other auction has this id
                ctx.set_timer(auction[_EXPIRES])
            elif value.get("right") is not None:
                row = value["right"]
                bid = [row["price"], row["date_time"], row["bidder"]]
                if auction is not None:
                    best = _better(auction, best, bid)
                elif ctx.is_late(bid[_TIME] + self.max_duration_us):
                    ctx.drop_late()
                else:
                    pending.append(bid)
                    ctx.set_timer(bid[_TIME] + self.max_duration_us)
            else:
                raise ValueError("a record of WinningBids has neither an auction nor a bid")
        return _pack(auction, best, pending), []

    def on_timer(self, key: Any, time_us: int, state: Any, ctx: Context
                 ) -> tuple[Any, list[Any]]:
        """The auction closes at its ``expires``; bids waiting for an auction expire."""
        auction, best, pending = _unpack(state)
        outputs = []
        if auction is not None and auction[_EXPIRES] <= time_us:
            if best is not None:
                outputs.append({"auction": key, "category": auction[_CATEGORY],
                                "price": best[_PRICE], "bidder": best[_BIDDER]})
            auction, best = None, None
        pending = [bid for bid in pending if bid[_TIME] + self.max_duration_us > time_us]
        return _pack(auction, best, pending), outputs


def _better(auction: list, best: list | None, bid: list) -> list | None:
    """The better of ``best`` and ``bid`` for ``auction`` (``bid`` only if it is valid)."""
    if not (auction[_OPENS] <= bid[_TIME] <= auction[_EXPIRES]
            and bid[_PRICE] >= auction[_RESERVE]):
        return best
    if best is None or (-bid[_PRICE], bid[_TIME], bid[_BIDDER]) < \
            (-best[_PRICE], best[_TIME], best[_BIDDER]):
        return bid
    return best


def _unpack(state: Any) -> tuple[list | None, list | None, list[list]]:
    """A key's stored ``[auction, best bid, bids waiting for the auction]``."""
    if state is None:
        return None, None, []
    auction, best, pending = state
    return auction, best, [list(bid) for bid in pending]


def _pack(auction: list | None, best: list | None, pending: list[list]) -> Any:
    """The stored state, ``None`` (deleted) when there is nothing to keep."""
    if auction is None and not pending:
        return None
    return [auction, best, pending]


def running_average(key: Any, values: list[Any], state: Any) -> tuple[Any, list[Any]]:
    """A pipeline ``update``: the running average of a key's values (Q4's closing prices per
    category), emitted as ``{average, auctions}`` for every key the epoch touched; the state is
    ``[count, sum]`` (an exact integer sum)."""
    count, total = state if state is not None else (0, 0)
    count += len(values)
    total += sum(values)
    return [count, total], [{"average": total / count, "auctions": count}]


RUNNING_AVERAGE_TYPE = "struct<average: double, auctions: bigint>"


@dataclass(frozen=True)
class TopOfWindow:
    """The rows of the highest ``value`` among a window's rows (ties: all of them), keyed by
    the window's end: Q5's hottest auctions and Q7's highest bid, over the closed windows a
    :class:`~megaphone.operators.WindowAggregate` emits per auction. A
    :class:`~megaphone.operators.ProcessFunction` with no state and no timers.

    No state is needed because all of a window's rows arrive in one epoch: the stage before
    has one watermark for all its keys (the largest event time it committed), and it closes a
    window at every key, in every bin and at whichever worker owns it, in the epoch whose
    watermark first reaches the window's end; a contribution that comes later is late there
    and dropped. So the top of each epoch's rows per window is final.
    """

    lateness_us: int = 0

    def output_type(self, value_type: pa.DataType | None) -> pa.DataType:
        """The input rows' own type (a struct with an integer ``value``)."""
        if value_type is None or not pa.types.is_struct(value_type):
            raise TypeError(f"TopOfWindow takes struct values with a 'value' field, not "
                            f"{value_type}")
        return value_type

    def process(self, key: Any, rows: list[Row], state: Any, ctx: Context
                ) -> tuple[Any, list[Any]]:
        """The rows of the highest ``value`` among the epoch's rows of this window."""
        top = max(row["value"] for _, row in rows)
        return None, [row for _, row in rows if row["value"] == top]

    def process_epoch(self, batch: EpochBatch, states: list[Any], ctx: Context
                      ) -> ColumnResults | None:
        """The whole epoch in columns (the rows of each key's highest value, each key's in
        event-time order, as :meth:`process` gives them): one sort, no Python per row.
        Declines (``None``: key by key instead) for values that are not integers or are
        null, and for due timers (none is ever set)."""
        values = batch.values
        if values is None or not pa.types.is_struct(values.type) or values.null_count or \
                values.type.get_field_index("value") < 0 or len(batch.timer_slots):
            return None
        top = pc.struct_field(values, "value")
        if not pa.types.is_integer(top.type) or top.null_count:
            return None
        order = np.lexsort((batch.times, batch.slots))  # by key, then time; stable
        slots, numbers = batch.slots[order], top.to_numpy()[order]
        starts = np.flatnonzero(np.diff(slots, prepend=-1))  # each key's first row (slots >= 0)
        highest = np.repeat(np.maximum.reduceat(numbers, starts),
                            np.diff(np.append(starts, len(slots))))
        picked = order[numbers == highest]
        none = np.zeros(0, np.int64)
        return ColumnResults(batch.keys, [None] * len(batch.keys), (none, none), (none, none),
                             batch.slots[picked], values.take(pa.array(picked)), late=ctx.late)

    def on_timer(self, key: Any, time_us: int, state: Any, ctx: Context
                 ) -> tuple[Any, list[Any]]:
        """Never called: no timer is set."""
        return state, []
