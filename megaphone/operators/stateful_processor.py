"""Spark's ``StatefulProcessor`` (``groupBy(key).transformWithState(...)``) run unchanged as a
megaphone update: :class:`TransformWithState` turns the processor into a
:class:`~megaphone.operators.process.ProcessFunction`. A processor written for
``transformWithStateInPandas`` runs as well (``processor_api``): it gets each key's rows of an
epoch as one pandas DataFrame (:mod:`~megaphone.operators.pandas_input`) and yields DataFrames.

The processor gets a handle of megaphone's (:class:`Handle`) whose value, list and map states
and timers live in one msgpack value per key, under the key's bin: they migrate, commit
atomically and recover like every other state. Timers are kept in that value (for
``listTimers``) and mirrored as megaphone timers, which wake the key up when the watermark
passes them; in ``ProcessingTime`` mode the epoch's watermark is its processing time (fixed by
the driver), so they fire by the clock. State TTLs count from that processing time. Per key
and epoch the order is Spark's: ``handleInputRows`` with the epoch's rows, then
``handleExpiredTimer`` for each expired timer, in time order. docs/operators.md says where
this differs from Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    TimerValues,
)
from pyspark.sql.types import StructType

from megaphone.operators.durations import duration_us
from megaphone.operators.pandas_input import PandasInput
from megaphone.operators.process import Context
from megaphone.operators.processor_handle import Handle, KeyState, fields

#: The time modes of Spark's ``transformWithState`` (megaphone runs them all).
TIME_MODES = ("None", "EventTime", "ProcessingTime")
#: The Spark APIs a processor may be written for: Rows in and out, or pandas DataFrames.
ROW_API = "transformWithState"
PANDAS_API = "transformWithStateInPandas"
PROCESSOR_APIS = (ROW_API, PANDAS_API)

class TransformWithState:
    """A Spark ``StatefulProcessor`` as a megaphone update (what ``Pipeline(update=processor,
    output_type=..., time_mode=...)`` builds); give it rows of every input column.

    ``output_schema``: the processor's output rows (Spark's ``outputStructType``).
    ``time_mode``: ``"None"``, ``"EventTime"`` or ``"ProcessingTime"``.
    ``lateness_us``: the delay of Spark's ``withWatermark`` on the event-time column.
    ``processor_api``: the Spark API the processor is written for (:data:`PROCESSOR_APIS`);
    with ``transformWithStateInPandas`` its input is pandas frames, with timestamps in
    ``timezone`` (Spark's session time zone), and its outputs must be frames.
    ``init`` is called here once with a checking handle (as Spark's driver does), then once per
    worker and epoch before its first key, and ``close`` at the end of that worker's epoch
    (Spark: once per task and batch).
    """

    #: Spark's order per key: the rows first, then the expired timers.
    rows_first = True
    #: Rows reach ``process`` with every input column (a struct), as Spark groups them.
    reads_rows = True

    def __init__(self, processor: StatefulProcessor, output_schema: StructType,
                 time_mode: str = "None", lateness_us: int = 0,
                 processor_api: str = ROW_API, timezone: str = "UTC") -> None:
        if not isinstance(processor, StatefulProcessor):
            raise TypeError(f"expected a pyspark StatefulProcessor, got "
                            f"{type(processor).__name__}")
        if processor_api not in PROCESSOR_APIS:
            raise ValueError(f"processor_api must be one of {PROCESSOR_APIS}, got "
                             f"{processor_api!r}")
        if time_mode not in TIME_MODES:
            raise ValueError(f"time_mode must be one of {TIME_MODES}, got {time_mode!r}")
        if type(processor).handleInitialState is not StatefulProcessor.handleInitialState:
            raise ValueError(f"{type(processor).__name__} implements handleInitialState: "
                             "initial state is not supported")
        if not isinstance(output_schema, StructType):
            raise TypeError(f"output_type must be a StructType for a StatefulProcessor, got "
                            f"{output_schema!r}")
        if lateness_us < 0:
            raise ValueError(f"the watermark delay must be >= 0, got {lateness_us} us")
        self.processor = processor
        self.output_schema = output_schema
        self.time_mode = time_mode
        self.lateness_us = lateness_us
        #: Input and outputs are pandas frames (Spark's ``transformWithStateInPandas``).
        self.pandas = processor_api == PANDAS_API
        self.timezone = timezone
        self._frames: PandasInput | None = None
        self.needs_event_time = time_mode == "EventTime"
        #: Its timers are due by the epoch's processing time, which is then its watermark.
        self.processing_time = time_mode == "ProcessingTime"
        self._input: StructType | None = None
        self._handle: Handle | None = None
        probe = Handle(time_mode, probe=True)
        processor.init(probe)  # refuses TTL and timers in init now, not in an epoch
        processor.close()

    @property
    def setting(self) -> str:
        """What the state directory's manifest keeps of it: the processor's class and the
        options, so that one processor's state is never opened with another's."""
        cls = type(self.processor)
        api = "TransformWithStateInPandas" if self.pandas else "TransformWithState"
        return (f"{api}({cls.__module__}.{cls.__qualname__}, "
                f"time_mode={self.time_mode}, lateness_us={self.lateness_us}, "
                f"output={self.output_schema.simpleString()})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None}

    def output_type(self, value_type: pa.DataType | None) -> pa.DataType:
        """The Arrow type of the output rows; ``value_type`` (the input rows' struct) is kept
        to turn rows back into Spark's Python values."""
        if value_type is not None:
            self._input = from_arrow_type(value_type)
            if self.pandas:
                self._frames = PandasInput(value_type, self.timezone)
        return to_arrow_type(self.output_schema, timezone="UTC")

    def open(self) -> Handle:
        """The worker's handle, calling ``init`` with it the first time in this epoch."""
        if self._handle is None:
            self._handle = Handle(self.time_mode)
            self.processor.init(self._handle)
        return self._handle

    def end_epoch(self) -> None:
        """The worker's epoch ended: ``close`` the processor if it was opened."""
        if self._handle is not None:
            self._handle = None
            self.processor.close()

    def process(self, key: Any, rows: list[tuple[int, Any]], state: Any, ctx: Context
                ) -> tuple[Any, list[Any]]:
        """``handleInputRows`` with the key's rows (late ones dropped), then expired timers."""
        handle = self._key(state, ctx)
        kept = rows
        if self.needs_event_time:
            kept = [r for r in rows if not ctx.is_late(r[0])]
            ctx.drop_late(len(rows) - len(kept))
        before = set(handle.key_state.timers)
        outputs: list[Any] = []
        if kept:
            inputs = self._inputs([v for _, v in kept])
            outputs += self._outputs(self.processor.handleInputRows(
                (key,), inputs, self._timer_values(ctx)))
        outputs += self._fire(key, handle, ctx)
        self._wake(handle, before, ctx)
        return handle.key_state.encode(), outputs

    def on_timer(self, key: Any, time_us: int, state: Any, ctx: Context
                 ) -> tuple[Any, list[Any]]:
        """A megaphone timer woke the key: fire its expired timers (none if already fired)."""
        handle = self._key(state, ctx)
        before = set(handle.key_state.timers)
        outputs = self._fire(key, handle, ctx)
        self._wake(handle, before, ctx)
        return handle.key_state.encode(), outputs

    def _key(self, state: Any, ctx: Context) -> Handle:
        """The handle on the key's state as of the epoch's processing time (expired TTL
        entries dropped)."""
        handle = self.open()
        now = ctx.processing_time
        handle.now_ms = None if now is None else now // 1000
        handle.key_state = KeyState(state, handle.now_ms)
        return handle

    def _watermark_ms(self, ctx: Context) -> int:
        if not self.needs_event_time:
            return -1
        return 0 if ctx.watermark is None else ctx.watermark // 1000

    def _timer_values(self, ctx: Context) -> TimerValues:
        """Spark's: both times -1 in mode ``None``; else the batch's processing time, and the
        watermark in ``EventTime`` mode (-1 in ``ProcessingTime``)."""
        if self.time_mode == "None" or ctx.processing_time is None:
            return TimerValues(-1, self._watermark_ms(ctx))
        return TimerValues(ctx.processing_time // 1000, self._watermark_ms(ctx))

    def _fire(self, key: Any, handle: Handle, ctx: Context) -> list[Any]:
        """Spark's expired timers of the key (time < watermark, or < processing time in
        ``ProcessingTime`` mode), ascending, each deleted after its ``handleExpiredTimer``."""
        if self.processing_time:
            if ctx.processing_time is None:
                return []
            wm = ctx.processing_time // 1000
        elif not self.needs_event_time or ctx.watermark is None:
            return []
        else:
            wm = self._watermark_ms(ctx)
        fired: set[int] = set()
        outputs: list[Any] = []
        while True:
            due = [t for t in handle.key_state.timers if t < wm and t not in fired]
            if not due:
                return outputs
            t = min(due)
            fired.add(t)
            outputs += self._outputs(self.processor.handleExpiredTimer(
                (key,), self._timer_values(ctx), ExpiredTimerInfo(t)))
            handle.key_state.timers.discard(t)

    @staticmethod
    def _wake(handle: Handle, before: set[int], ctx: Context) -> None:
        """A megaphone timer for each new timer, due when Spark's would expire (time <
        watermark, or processing time, in ms); a deleted timer's wake-up finds nothing to
        fire."""
        for t in handle.key_state.timers - before:
            ctx.set_timer((t + 1) * 1000)

    def _inputs(self, values: list[Any]) -> Iterator[Any]:
        """The key's rows as ``handleInputRows`` takes them: Rows, or one pandas frame."""
        if self._frames is not None:
            return iter([self._frames.frame(values)])
        return (self._row(v) for v in values)

    def _row(self, value: Any) -> Row:
        """An input row as Spark gives it: a Row of every column, Spark's Python values."""
        assert self._input is not None
        fields = tuple(value[n] for n in self._input.names) if isinstance(value, dict) \
            else tuple(value)
        return self._input.fromInternal(fields) if self._input.needConversion() \
            else Row(**dict(zip(self._input.names, fields, strict=True)))

    def _outputs(self, produced: Iterable[Any] | None) -> list[dict[str, Any]]:
        """The processor's output Rows (or pandas frames) as values of the output type."""
        if produced is None:
            return []
        names = self.output_schema.names
        out: list[dict[str, Any]] = []
        for item in produced:
            if hasattr(item, "itertuples"):  # a pandas frame, as transformWithStateInPandas
                rows: Iterable[Any] = (fields(r) for r in
                                       item[names].itertuples(index=False, name=None))
            elif self.pandas:
                raise ValueError(f"a transformWithStateInPandas processor must yield pandas "
                                 f"DataFrames, got a {type(item).__name__} (as in Spark)")
            else:
                rows = [item]
            for row in rows:
                internal = self.output_schema.toInternal(row)
                out.append(dict(zip(names, internal, strict=True)))
        return out


def transform_with_state(processor: StatefulProcessor, output_schema: StructType,
                         time_mode: str | None, event_time: str | None,
                         watermark_delay: int | float | str | None,
                         processor_api: str | None = None, timezone: str = "UTC"
                         ) -> TransformWithState:
    """The update for ``Pipeline(update=processor, output_type=..., time_mode=...,
    event_time=..., watermark_delay=..., processor_api=...)``, refusing what Spark's
    ``transformWithState`` would be given differently: ``time_mode`` is required;
    ``"EventTime"`` needs the event-time column (Spark's ``withWatermark`` column,
    ``watermark_delay`` its delay), and the other modes take neither. ``processor_api``
    (default ``"transformWithState"``) says which Spark API the processor is written for;
    ``timezone`` is the session time zone a pandas processor's timestamps are in."""
    if time_mode is None:
        raise ValueError("a StatefulProcessor needs time_mode ('None', 'EventTime' or "
                         "'ProcessingTime'), as Spark's transformWithState does")
    if time_mode == "EventTime" and event_time is None:
        raise ValueError("time_mode 'EventTime' needs the event_time column (the column of "
                         "Spark's withWatermark)")
    if time_mode != "EventTime" and (event_time is not None or watermark_delay is not None):
        raise ValueError(f"time_mode {time_mode!r} uses no event time: event_time and "
                         "watermark_delay are for time_mode 'EventTime'")
    lateness = 0 if watermark_delay is None else duration_us(watermark_delay)
    return TransformWithState(processor, output_schema, time_mode, lateness,
                              processor_api or ROW_API, timezone)
