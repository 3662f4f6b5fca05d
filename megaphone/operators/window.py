"""Event-time windows: a keyed aggregate per tumbling or sliding window, with a watermark.

Windows are aligned as Spark SQL's ``window(time, size, slide)`` aligns them: they start at
multiples of ``slide`` (of ``size`` for tumbling windows) since 1970, and a window
``[start, end)`` holds the records with ``start <= time < end``. A window's state lives in
its key's state, so it migrates with the key's bin. A window closes when the watermark
reaches its end: a timer at the end emits it (``emit="append"``) and purges it, so state
stays bounded. A record's contribution to a window that is closed already (its end at or
before the watermark) is dropped and counted in the epoch's ``late_records`` metric.
``emit="update"`` emits every window an epoch touched, with its aggregate so far, and purges
windows silently when they close.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from megaphone.operators.process import Context, EpochBatch, KeyResults, Row
from megaphone.operators.window_epoch import fold_epoch
from megaphone.operators.window_state import fold, open_windows, result, stored

#: The aggregations a window computes over its records' values.
WINDOW_AGGREGATIONS = ("count", "sum", "min", "max", "avg")
EMIT_MODES = ("append", "update")


def window_ends(time_us: int, size_us: int, slide_us: int) -> list[int]:
    """The ends of the windows that hold ``time_us``, earliest first."""
    last_start = time_us - time_us % slide_us
    ends = []
    start = last_start
    while start > time_us - size_us:
        ends.append(start + size_us)
        start -= slide_us
    return ends[::-1]


@dataclass(frozen=True)
class WindowAggregate:
    """A keyed aggregate per event-time window (a :class:`~megaphone.operators.process.
    ProcessFunction`); give it as a pipeline's ``update`` with an ``event_time`` column.

    ``size_us`` and ``slide_us`` (default ``size_us``: tumbling) in microseconds;
    ``agg`` one of :data:`WINDOW_AGGREGATIONS` over the ``value`` column (``count`` counts
    records; the others skip null values, and ``avg`` of no value is null);
    ``lateness_us``: how far the watermark trails the largest event time seen.
    ``vectorized`` (default): the runtime folds an epoch's records in columns
    (:mod:`~megaphone.operators.window_epoch`); ``False`` folds them record by record, the
    reference it equals (outputs, state and late counts), kept to compare the two. It is
    not part of the pipeline's setting: either runs on the other's state.
    Outputs are ``struct<start, end: timestamp[us], value>`` per key and window.

    >>> WindowAggregate(size_us=duration_us("10 seconds"), agg="max",
    ...                 lateness_us=duration_us("5 seconds"))  # doctest: +SKIP
    """

    size_us: int
    slide_us: int | None = None
    agg: str = "count"
    emit: str = "append"
    lateness_us: int = 0
    vectorized: bool = field(default=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.agg not in WINDOW_AGGREGATIONS:
            raise ValueError(f"agg must be one of {WINDOW_AGGREGATIONS}, got {self.agg!r}")
        if self.emit not in EMIT_MODES:
            raise ValueError(f"emit must be one of {EMIT_MODES}, got {self.emit!r}")
        if not isinstance(self.size_us, int) or self.size_us <= 0:
            raise ValueError(f"size_us must be a positive integer, got {self.size_us!r}")
        slide = self.slide
        if not isinstance(slide, int) or not 0 < slide <= self.size_us:
            raise ValueError(f"slide_us must be a positive integer up to size_us, got {slide!r}")
        if not isinstance(self.lateness_us, int) or self.lateness_us < 0:
            raise ValueError(f"lateness_us must be >= 0, got {self.lateness_us!r}")

    @property
    def slide(self) -> int:
        """The slide in microseconds (the size for tumbling windows)."""
        return self.size_us if self.slide_us is None else self.slide_us

    @property
    def emits_on_records(self) -> bool:
        """Whether records bring outputs themselves (update mode); in append mode only a
        window that closes does (a timer)."""
        return self.emit == "update"

    def timers_between(self, after_us: int | None, upto_us: int | None) -> bool:
        """Whether one of its timers can be due in an epoch whose watermark moves from
        ``after_us`` (the last epoch's) to ``upto_us``: a window end (``size`` modulo
        ``slide``) in ``(after_us, upto_us]``; ``True`` when the last watermark is unknown."""
        if upto_us is None:
            return False
        if after_us is None:
            return True
        first = after_us + 1 + (self.size_us - after_us - 1) % self.slide  # first end after
        return first <= upto_us

    def output_type(self, value_type: pa.DataType | None) -> pa.DataType:
        """``struct<start, end, value>``: value int64 for counts and integer sums, min and max
        of the value's type, float64 for averages and float sums."""
        if self.agg == "count":
            value = pa.int64()
        elif self.agg == "avg" or value_type is None:
            value = pa.float64()
        elif pa.types.is_integer(value_type) or pa.types.is_boolean(value_type):
            value = pa.int64()
        else:
            value = pa.float64()
        time = pa.timestamp("us", tz="UTC")
        return pa.struct([("start", time), ("end", time), ("value", value)])

    def process(self, key: Any, rows: list[Row], state: Any, ctx: Context
                ) -> tuple[Any, list[Any]]:
        """Fold the records into their windows (late contributions dropped and counted)."""
        windows = open_windows(state)
        touched: set[int] = set()
        for time_us, value in rows:
            for end in window_ends(time_us, self.size_us, self.slide):
                if ctx.is_late(end):
                    ctx.drop_late()
                    continue
                if end not in windows:
                    ctx.set_timer(end)
                windows[end] = fold(self.agg, windows.get(end), value)
                touched.add(end)
        outputs = [self._output(end, windows[end]) for end in sorted(touched)] \
            if self.emit == "update" else []
        return stored(windows), outputs

    def process_epoch(self, batch: EpochBatch, states: list[Any], ctx: Context
                      ) -> KeyResults | None:
        """The whole epoch in columns (``None``: run it record by record instead); the
        runtime's fast path, equal to :meth:`on_timer` and :meth:`process` key by key."""
        return fold_epoch(self, batch, states, ctx) if self.vectorized else None

    def on_timer(self, key: Any, time_us: int, state: Any, ctx: Context
                 ) -> tuple[Any, list[Any]]:
        """The window ending at ``time_us`` closed: emit it (append mode) and purge it."""
        windows = open_windows(state)
        acc = windows.pop(time_us, None)
        outputs = [self._output(time_us, acc)] if acc is not None and self.emit == "append" \
            else []
        return stored(windows), outputs

    def _output(self, end: int, acc: list) -> dict[str, Any]:
        return {"start": end - self.size_us, "end": end, "value": result(self.agg, acc)}

