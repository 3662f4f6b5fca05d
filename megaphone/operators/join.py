"""Stream-stream equi-join: two inputs routed by the same bins, so both sides' state of a key
lives, and migrates, together.

Each input record is a ``value`` struct ``{"left": row, "right": None}`` or ``{"left": None,
"right": row}`` with its event time (:func:`megaphone.join_input` builds such a DataFrame from
two). A new row is matched with the other side's stored rows of its key and with the other
side's rows of the same epoch; every matching pair is emitted once, as
``{"left": ..., "right": ...}``.

How long rows are kept, and what matches:

* ``within_us``: rows match when their event times differ by at most ``within_us``; a row is
  kept until the watermark passes its time plus ``within_us``.
* ``window_us``: rows match when they fall into the same tumbling window; a row is kept
  until the watermark passes its window's end.
* ``ttl_us``: every pair of rows of a key matches; a row is kept until the watermark passes
  its time plus ``ttl_us``.
* none of these: every pair matches and rows are kept for ever (NEXMark Q3's join).

A row at or before the watermark when it arrives (with ``window_us``: whose window has
closed) is late: dropped and counted in the ``late_records`` metric. This is what makes the
result exact: a row that is not late finds every row it matches still kept, so the join emits
exactly the matching pairs of rows that were not late (an unbounded join drops nothing).
``how="left"`` also emits every left row that leaves the state without a match, as
``{"left": row, "right": None}`` (when the watermark passes its keep time: a left-outer
result is final only then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from megaphone.operators.join_epoch import FOREVER, join_epoch
from megaphone.operators.process import Context, EpochBatch, KeyResults, Row

JOIN_TYPES = ("inner", "left")


@dataclass(frozen=True)
class Join:
    """An inner or left-outer equi-join of two streams (a :class:`~megaphone.operators.
    process.ProcessFunction`); see the module docstring. At most one of ``within_us``,
    ``window_us`` and ``ttl_us`` is given.

    ``vectorized`` (default): the runtime matches an epoch's rows in columns
    (:mod:`~megaphone.operators.join_epoch`); ``False`` runs it key by key, the reference it
    equals (outputs in order, state bytes, timers, late counts), kept to compare the two. It is
    not part of the pipeline's setting: either runs on the other's state."""

    how: str = "inner"
    within_us: int | None = None
    window_us: int | None = None
    ttl_us: int | None = None
    lateness_us: int = 0
    vectorized: bool = field(default=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.how not in JOIN_TYPES:
            raise ValueError(f"how must be one of {JOIN_TYPES}, got {self.how!r}")
        bounds = {n: v for n, v in (("within_us", self.within_us),
                                    ("window_us", self.window_us), ("ttl_us", self.ttl_us))
                  if v is not None}
        if len(bounds) > 1:
            raise ValueError(f"give at most one of within_us, window_us, ttl_us, not {bounds}")
        for name, v in bounds.items():
            if not isinstance(v, int) or v < 0 or (name == "window_us" and v == 0):
                raise ValueError(f"{name} must be a non-negative integer (window > 0), got {v!r}")
        if self.how == "left" and not bounds:
            raise ValueError("a left-outer join needs within_us, window_us or ttl_us: without "
                             "a bound a left row never knows it has no match")
        if not isinstance(self.lateness_us, int) or self.lateness_us < 0:
            raise ValueError(f"lateness_us must be >= 0, got {self.lateness_us!r}")

    def output_type(self, value_type: pa.DataType | None) -> pa.DataType:
        """``struct<left, right>``: the input's two row types."""
        if value_type is None or not pa.types.is_struct(value_type) or \
                {value_type.field(i).name for i in range(value_type.num_fields)} != \
                {"left", "right"}:
            raise TypeError("a join's value column must be a struct<left, right> "
                            f"(megaphone.join_input builds one), not {value_type}")
        return pa.struct([value_type.field("left"), value_type.field("right")])

    def keep_until(self, time_us: int) -> int:
        """The watermark at which a row of event time ``time_us`` leaves the state (also
        element-wise for a numpy array of times, as the columnar join asks it)."""
        if self.within_us is not None:
            return time_us + self.within_us
        if self.window_us is not None:
            return time_us - time_us % self.window_us + self.window_us
        if self.ttl_us is not None:
            return time_us + self.ttl_us
        return FOREVER

    def late_at(self, time_us: int) -> int:
        """The watermark from which a row of event time ``time_us`` is late (also element-wise
        for a numpy array of times)."""
        if self.window_us is not None:
            return self.keep_until(time_us)
        if self.within_us is None and self.ttl_us is None:
            return FOREVER
        return time_us

    def matches(self, left_time: int, right_time: int) -> bool:
        """Whether rows of these event times match (besides their key)."""
        if self.within_us is not None:
            return abs(left_time - right_time) <= self.within_us
        if self.window_us is not None:
            return left_time // self.window_us == right_time // self.window_us
        return True

    def process(self, key: Any, rows: list[Row], state: Any, ctx: Context
                ) -> tuple[Any, list[Any]]:
        """Match the epoch's new rows with the stored ones and with each other; store them."""
        lefts, rights = _sides(state)
        new_lefts: list[list] = []
        new_rights: list[list] = []
        for time_us, value in rows:
            if ctx.is_late(self.late_at(time_us)):
                ctx.drop_late()
                continue
            keep = self.keep_until(time_us)
            if keep != FOREVER:
                ctx.set_timer(keep)
            if value.get("left") is not None:
                new_lefts.append([time_us, value["left"], False])
            elif value.get("right") is not None:
                new_rights.append([time_us, value["right"]])
            else:
                raise ValueError("a join record has neither a left nor a right row")
        outputs: list[Any] = []
        for left in new_lefts:  # new left rows against all right rows, old and new
            for right in (*rights, *new_rights):
                if self.matches(left[0], right[0]):
                    outputs.append({"left": left[1], "right": right[1]})
                    left[2] = True
        for left in lefts:  # old left rows against the new right rows
            for right in new_rights:
                if self.matches(left[0], right[0]):
                    outputs.append({"left": left[1], "right": right[1]})
                    left[2] = True
        return _state(lefts + new_lefts, rights + new_rights), outputs

    def process_epoch(self, batch: EpochBatch, states: list[Any], ctx: Context
                      ) -> KeyResults | None:
        """The whole epoch in columns (``None``: run it key by key instead); the runtime's
        fast path, equal to :meth:`on_timer` and :meth:`process` key by key."""
        return join_epoch(self, batch, states, ctx) if self.vectorized else None

    def on_timer(self, key: Any, time_us: int, state: Any, ctx: Context
                 ) -> tuple[Any, list[Any]]:
        """Rows kept until ``time_us`` leave; a left-outer join emits the unmatched left ones."""
        lefts, rights = _sides(state)
        outputs = [{"left": row[1], "right": None} for row in lefts
                   if self.how == "left" and not row[2] and self.keep_until(row[0]) <= time_us]
        lefts = [row for row in lefts if self.keep_until(row[0]) > time_us]
        rights = [row for row in rights if self.keep_until(row[0]) > time_us]
        return _state(lefts, rights), outputs


def _sides(state: Any) -> tuple[list[list], list[list]]:
    """A key's stored left rows ``[time, row, matched]`` and right rows ``[time, row]``."""
    if state is None:
        return [], []
    return [list(r) for r in state[0]], [list(r) for r in state[1]]


def _state(lefts: list[list], rights: list[list]) -> Any:
    return [lefts, rights] if lefts or rights else None
