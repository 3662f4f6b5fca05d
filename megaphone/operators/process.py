"""Keyed process functions with event-time timers: the one primitive windows and joins are
built from (Flink's ``KeyedProcessFunction``, on Megaphone's bins).

A :class:`ProcessFunction` sees, per key and epoch, the timers of the key that the watermark
has passed (``on_timer``, in time order) and then the epoch's records of the key
(``process``, in event-time order), with the key's state; it returns the new state and
outputs, and asks for timers through its :class:`Context`. Timers are stored as keys of the
key's bin (``state_backends.encoding``), so they migrate, commit and recover with the state.

Engine-agnostic: :func:`run_epoch` takes an epoch's keys, due timers and records as columns
(:class:`EpochBatch`) with the keys' decoded states and returns the state and timer writes
and the outputs; the runtime does the I/O around it. A function with a ``process_epoch``
method may run the whole batch at once in columns (a window of a built-in aggregate does);
any other goes key by key through :func:`run_keys`.

The watermark of an epoch is the largest event time of every epoch committed before it,
less the function's ``lateness_us`` (``None`` before any event time was seen). It is fixed
before the epoch runs, so every worker, and every re-run of the epoch, sees the same one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

#: One record of a key: ``(event_time_us, value)``.
Row = tuple[int, Any]


class Context:
    """What a process function sees besides key, records and state: the epoch, its
    watermark, its processing time (microseconds, fixed by the driver for the epoch; ``None``
    when not given) and the timers it sets; it also counts the records it drops as late."""

    __slots__ = ("_new_timers", "epoch", "late", "processing_time", "watermark", "worker")

    def __init__(self, epoch: int, watermark: int | None, worker: int | None = None,
                 processing_time: int | None = None) -> None:
        self.epoch = epoch
        self.watermark = watermark
        self.worker = worker
        self.processing_time = processing_time
        self.late = 0
        self._new_timers: set[int] = set()

    def set_timer(self, time_us: int) -> None:
        """Call ``on_timer(key, time_us, ...)`` once the watermark reaches ``time_us`` (in this
        or a later epoch; setting the same time twice sets one timer)."""
        self._new_timers.add(int(time_us))

    def is_late(self, time_us: int) -> bool:
        """True when ``time_us`` is at or before the watermark: what it would open is closed."""
        return self.watermark is not None and time_us <= self.watermark

    def drop_late(self, n: int = 1) -> None:
        """Count ``n`` records (or contributions) dropped as late: a metric, never silent."""
        self.late += n

    def take_timers(self) -> set[int]:
        """The timers set since the last call (the runtime writes them)."""
        timers, self._new_timers = self._new_timers, set()
        return timers


@runtime_checkable
class ProcessFunction(Protocol):
    """A keyed operator with state and event-time timers.

    ``lateness_us``: how far the watermark trails the largest event time seen.
    ``output_type(value_type)``: the Arrow type of its outputs, given its input values'.
    State is any msgpack-serializable value, ``None`` for none (the key's state is deleted).

    Two optional declarations let a chain leave the stage after this one out of an epoch that
    this one provably emits nothing in (docs/operators.md, "Idle later stages"): an
    ``emits_on_records`` attribute, ``False`` when only timers bring outputs, and
    ``timers_between(after_us, upto_us)``: whether one of its timers can be due in an epoch
    whose watermark moves from the last epoch's ``after_us`` to ``upto_us``. Without them a
    function is taken to emit on records and to fire any time.
    """

    lateness_us: int

    def output_type(self, value_type: pa.DataType | None) -> pa.DataType:
        """The Arrow type of the outputs for input values of ``value_type``."""
        ...

    def process(self, key: Any, rows: list[Row], state: Any, ctx: Context
                ) -> tuple[Any, list[Any]]:
        """Apply one epoch's records of ``key`` (sorted by event time): new state, outputs."""
        ...

    def on_timer(self, key: Any, time_us: int, state: Any, ctx: Context
                 ) -> tuple[Any, list[Any]]:
        """The watermark passed a timer of ``key`` set for ``time_us``: new state, outputs."""
        ...


def watermark(max_event_time: int | None, lateness_us: int) -> int | None:
    """The watermark of an epoch: the largest event time committed before it less the
    allowed lateness (``None`` before any event time was seen)."""
    return None if max_event_time is None else max_event_time - lateness_us


def plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with temporal types as their integers (timestamps and durations int64, dates
    int32 or int64), nested too: what records look like to an operator, and what msgpack
    stores."""
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_time64(t) or \
            pa.types.is_date64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, plain_type(f.type), f.nullable) for f in t])
    if pa.types.is_list(t):
        return pa.list_(plain_type(t.value_type))
    return t


@dataclass
class KeyResults:
    """What :func:`run_keys` returns: per key (in input order) its new state, the timers
    it fired and set; the outputs as parallel lists; and the records dropped as late."""

    states: list[Any] = field(default_factory=list)
    fired: list[list[int]] = field(default_factory=list)
    set: list[set[int]] = field(default_factory=list)
    out_keys: list[Any] = field(default_factory=list)
    out_values: list[Any] = field(default_factory=list)
    late: int = 0


@dataclass
class ColumnResults:
    """What a ``process_epoch`` may return instead of :class:`KeyResults`: the same results
    with the timers and outputs in columns, so that neither it nor the runtime builds a
    Python object per timer or output. The per-key lists :class:`KeyResults` has are
    properties here, made on demand (to compare the two)."""

    #: The key of each slot (the batch's ``keys``).
    keys: list[Any]
    #: Per slot (key), its new state.
    states: list[Any]
    #: ``(slots, times)`` of the timers fired, and of those set (int64 arrays).
    fired_at: tuple[np.ndarray, np.ndarray]
    set_at: tuple[np.ndarray, np.ndarray]
    #: Each output's slot, and the outputs: an Arrow array of the function's output type, or
    #: of its plain form (temporal types as their integers, :func:`plain_type`).
    out_slots: np.ndarray
    out_array: pa.Array
    late: int = 0

    @property
    def fired(self) -> list[list[int]]:
        """The timers each slot fired (as :attr:`KeyResults.fired`)."""
        return _per_slot(len(self.keys), *self.fired_at)

    @property
    def set(self) -> list[set[int]]:
        """The timers each slot set (as :attr:`KeyResults.set`)."""
        return [set(times) for times in _per_slot(len(self.keys), *self.set_at)]

    @property
    def out_keys(self) -> list[Any]:
        """Each output's key (as :attr:`KeyResults.out_keys`)."""
        return [self.keys[s] for s in self.out_slots.tolist()]

    @property
    def out_values(self) -> list[Any]:
        """The outputs as Python values (as :attr:`KeyResults.out_values`)."""
        return self.out_array.to_pylist()


def timers_set(result: KeyResults | ColumnResults) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, times)`` of the timers ``result`` set, as int64 arrays (a slot's times in
    their collection's order), whichever form it has them in. (The runtime needs no list of
    those fired: every due timer fires.)"""
    if isinstance(result, ColumnResults):
        return result.set_at
    return _flat(result.set)


def _flat(per_slot: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(slot, time)`` pairs of per-slot collections of times, as two int64 arrays."""
    sizes = np.fromiter(map(len, per_slot), np.int64, len(per_slot))
    times = np.fromiter(itertools.chain.from_iterable(per_slot), np.int64, int(sizes.sum()))
    return np.repeat(np.arange(len(per_slot), dtype=np.int64), sizes), times


def _per_slot(slots: int, at: np.ndarray, times: np.ndarray) -> list[list[int]]:
    """The times of each of ``slots`` slots from ``(at, times)`` pairs, in their order."""
    out: list[list[int]] = [[] for _ in range(slots)]
    for slot, t in zip(at.tolist(), times.tolist(), strict=True):
        out[slot].append(t)
    return out


@dataclass
class EpochBatch:
    """One epoch of an operator at one worker, as columns.

    ``keys``: one per slot, in the order the runtime met them (keys with due timers first).
    The due timers are ``(timer_slots[i], timer_times[i])``; the records ``(slots[i],
    times[i], values[i])`` in arrival order (``values`` ``None`` without a value column).
    Values are plain (temporal types as their integers, as msgpack stores them).
    """

    keys: list[Any]
    timer_slots: np.ndarray
    timer_times: np.ndarray
    slots: np.ndarray
    times: np.ndarray
    values: pa.Array | None

    def timers(self) -> list[list[int]]:
        """The due timers of each slot."""
        return _per_slot(len(self.keys), self.timer_slots, self.timer_times)

    def rows(self) -> list[list[Row]]:
        """The records of each slot, ``(time, value)`` in arrival order."""
        out: list[list[Row]] = [[] for _ in self.keys]
        values = [None] * len(self.slots) if self.values is None else self.values.to_pylist()
        for slot, t, v in zip(self.slots.tolist(), self.times.tolist(), values, strict=True):
            out[slot].append((t, v))
        return out


def pairs_in(slots: np.ndarray, times: np.ndarray, other_slots: np.ndarray,
             other_times: np.ndarray) -> np.ndarray:
    """Which ``(slots[i], times[i])`` pairs are among the ``(other_slots, other_times)``
    pairs: one ``isin`` over a code per pair (a slot, and its time's rank among all the
    times), no Python per pair. Timers and windows of an epoch's keys are such pairs."""
    ranks = np.unique(np.concatenate([times, other_times]))
    return np.isin(slots * len(ranks) + np.searchsorted(ranks, times),
                   other_slots * len(ranks) + np.searchsorted(ranks, other_times))


def run_epoch(fn: ProcessFunction, batch: EpochBatch, states: Sequence[Any], ctx: Context,
              on_error: Callable[[str, Any, BaseException], BaseException] | None = None
              ) -> KeyResults | ColumnResults:
    """Run ``fn`` over one epoch's ``batch`` (``states``: the decoded state of each slot):
    through its ``process_epoch(batch, states, ctx)`` if it has one and that does not decline
    (returns ``None``), else key by key through :func:`run_keys`. Either way the result is
    the same: ``process_epoch`` is only a faster way to compute it (and may give it as
    :class:`ColumnResults`)."""
    process_epoch = getattr(fn, "process_epoch", None)
    if process_epoch is not None:
        result = process_epoch(batch, states, ctx)
        if result is not None:
            return result
    return run_keys(fn, batch.keys, batch.timers(), batch.rows(), states, ctx, on_error)


def run_keys(fn: ProcessFunction, keys: Sequence[Any], timers: Sequence[Sequence[int]],
             rows: Sequence[list[Row]], states: Sequence[Any], ctx: Context,
             on_error: Callable[[str, Any, BaseException], BaseException] | None = None
             ) -> KeyResults:
    """Run ``fn`` over one epoch's keys: for each key, its due ``timers`` (ascending) through
    ``on_timer``, then its ``rows`` (sorted here by event time) through ``process``.

    ``states`` are the keys' current states (decoded). ``on_error(what, key, exc)`` turns an
    error of ``fn`` into the error raised (it names key and epoch); by default it propagates.
    A timer fired and set again in the same epoch stays set. A function with a true
    ``rows_first`` attribute gets each key's rows before its timers (Spark's order), and one
    with an ``end_epoch()`` method has it called once the epoch's keys are done (or failed).
    """
    out = KeyResults()
    rows_first = getattr(fn, "rows_first", False)
    done = False
    try:
        for key, due, key_rows, state in zip(keys, timers, rows, states, strict=True):
            outputs: list[Any] = []
            try:
                if key_rows and rows_first:
                    state, emitted = fn.process(key, sorted(key_rows, key=_time), state, ctx)
                    outputs += emitted
                for time_us in sorted(due):
                    state, emitted = fn.on_timer(key, time_us, state, ctx)
                    outputs += emitted
                if key_rows and not rows_first:
                    state, emitted = fn.process(key, sorted(key_rows, key=_time), state, ctx)
                    outputs += emitted
            except Exception as exc:
                if on_error is None:
                    raise
                raise on_error("it raised", key, exc) from exc
            out.states.append(state)
            out.fired.append(list(due))
            out.set.append(ctx.take_timers())
            out.out_keys += [key] * len(outputs)
            out.out_values += outputs
        done = True
    finally:
        _end_epoch(fn, done, on_error)
    out.late = ctx.late
    return out


def _end_epoch(fn: ProcessFunction, done: bool,
               on_error: Callable[[str, Any, BaseException], BaseException] | None) -> None:
    """Call ``fn.end_epoch()`` if it has one; its error is raised when the epoch's keys were
    done (else the keys' error, already raising, wins)."""
    end_epoch = getattr(fn, "end_epoch", None)
    if end_epoch is None:
        return
    try:
        end_epoch()
    except Exception as exc:
        if done:
            if on_error is None:
                raise
            raise on_error("its end of epoch raised", None, exc) from exc


def _time(row: Row) -> int:
    return row[0]
