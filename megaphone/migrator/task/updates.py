"""Keyed update functions: the built-in aggregations (vectorized) and a general Python ``f``.

An update turns one epoch's records of a worker into per-key state changes and outputs. It is
engine-agnostic: it sees a pyarrow table of records and a state backend, nothing of Spark. A
general ``f`` that fails on a key fails the worker's epoch with an :class:`UpdateError`.
"""

from __future__ import annotations

import ast
import math
import re
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.errors import MegaphoneError
from megaphone.migrator.task.columns import BIN, KEY, VALUE
from megaphone.operators.process import ProcessFunction
from megaphone.state_backends.encoding import unpack_value

#: ``f(key, values, state) -> (new_state, outputs)``: the general keyed update.
UpdateFn = Callable[[Any, list, Any], tuple[Any, Iterable[Any]]]
#: A pipeline's ``update``: an aggregation's name, a general ``f``, or an event-time operator.
UpdateArg = str | UpdateFn | ProcessFunction

AGGREGATIONS = ("count", "sum", "min", "max")
_STRING = pa.string()
#: How an :class:`UpdateError`'s message starts (the driver finds it in a failed job's error).
_FAILED = "update function failed on key "
_WHERE = re.compile(r"(?P<key>.*?) at epoch (?P<epoch>\d+)(?: on worker (?P<worker>\d+))?: ")
#: Errors pyarrow raises for a value of another type.
_CONVERT_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


class UpdateError(MegaphoneError, RuntimeError):
    """A general update ``f`` failed on a key: it raised, returned a state msgpack cannot
    encode, or an output that does not convert to the output type.

    The message names the key, the epoch, the worker and the original error (its type, text
    and the line of ``f`` it came from); ``key``, ``epoch`` and ``worker`` hold them too (None
    when unknown). Nothing of the epoch is committed: the pipeline stays at the epoch before,
    and its next batch runs that epoch again. Raised on the driver from the failed Spark
    job's error, which stays in ``__context__``.
    """

    def __init__(self, message: str, key: Any = None, epoch: int | None = None,
                 worker: int | None = None) -> None:
        super().__init__(message)
        self.key, self.epoch, self.worker = key, epoch, worker

    @classmethod
    def from_text(cls, text: str) -> UpdateError | None:
        """The error a worker raised, found in the text of the Spark error that carried it
        (the last such line), or None if the text holds none."""
        at = text.rfind(_FAILED)
        if at < 0:
            return None
        message = text[at:].splitlines()[0]
        where = _WHERE.match(message, len(_FAILED))
        if where is None:
            return cls(message)
        try:
            key = ast.literal_eval(where["key"])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            key = None  # a key whose repr is not a literal (a date, say): named in the message
        worker = where["worker"]
        return cls(message, key, int(where["epoch"]), None if worker is None else int(worker))


def update_failed(what: str, key: Any, exc: BaseException, epoch: int | None,
                  worker: int | None, *, located: bool = False) -> UpdateError:
    """The :class:`UpdateError` for ``f`` failing on ``key`` (``what`` it did), with ``exc``;
    ``located``: name the line ``exc`` was raised at (an error raised inside ``f``)."""
    where = f"{_FAILED}{_short(repr(key), 200)}"
    if epoch is not None:
        where += f" at epoch {epoch}" + (f" on worker {worker}" if worker is not None else "")
    frames = traceback.extract_tb(exc.__traceback__) if located else []
    line = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" \
        if frames else ""
    cause = _short(f"{type(exc).__name__}: {exc}", 400)
    return UpdateError(f"{where}: {what}: {cause}{line}", key, epoch, worker)


def pack_state(packb: Callable[[Any], bytes], state: Any, key: Any, epoch: int | None,
               worker: int | None) -> bytes:
    """``key``'s new ``state`` as msgpack bytes, or the :class:`UpdateError` saying it cannot be."""
    try:
        return packb(state)
    except (TypeError, ValueError, OverflowError) as exc:  # msgpack's for what it cannot encode
        raise update_failed(f"msgpack cannot encode its new state (a {type(state).__name__})",
                            key, exc, epoch, worker) from exc


def _short(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Update:
    """What a pipeline does per key: a built-in aggregation name, a general function, or an
    event-time operator (``kind="process"``: a :class:`~megaphone.operators.process.
    ProcessFunction` such as a window or a join).

    ``value_kind`` is ``"int"`` or ``"float"`` for the aggregations over a value column (the
    type of the stored aggregate); ``output_type`` is the pyarrow type of a general ``f``'s or
    an operator's outputs.
    """

    kind: str
    fn: UpdateFn | ProcessFunction | None = None
    value_kind: str = "int"
    output_type: pa.DataType = _STRING

    @property
    def is_builtin(self) -> bool:
        """True for count/sum/min/max, which run vectorized with no per-record Python call."""
        return self.fn is None

    @property
    def is_process(self) -> bool:
        """True for an event-time operator (state plus timers, run per key by the runtime)."""
        return self.kind == "process"

    def output_arrow_type(self) -> pa.DataType:
        """The pyarrow type of the output value column."""
        if not self.is_builtin:
            return self.output_type
        if self.kind == "count" or self.value_kind == "int":
            return pa.int64()
        return pa.float64()


def make_update(
    update: str | UpdateFn | ProcessFunction, value_kind: str | None,
    output_type: pa.DataType = _STRING,
) -> Update:
    """Check a user's ``update`` argument and build the :class:`Update` for it (for an
    operator, ``output_type`` is its output type for the pipeline's values)."""
    if isinstance(update, ProcessFunction):
        return Update("process", update, output_type=output_type)
    if callable(update):
        return Update("custom", update, output_type=output_type)
    if update not in AGGREGATIONS:
        raise ValueError(f"update must be one of {AGGREGATIONS} or a callable, got {update!r}")
    if update != "count" and value_kind not in ("int", "float"):
        raise ValueError(f"update {update!r} needs a numeric value column")
    return Update(update, None, value_kind or "int")


def apply_builtin(
    update: Update, records: pa.Table, old_raw: list[bytes | None],
    epoch: int | None = None, worker: int | None = None,
) -> tuple[list[bytes | None], pa.Array]:
    """Merge one epoch's per-key partial aggregates (``records``: ``key``, ``_bin``, ``partial``)
    into the stored msgpack values ``old_raw`` (None when new): the new msgpack values and the
    new aggregates (the epoch's outputs). Nulls and overflow as in Spark (README, "What it
    does"): a null partial leaves the aggregate as it was (a key with none gets no state:
    ``None``), and an int64 ``sum`` out of range raises :class:`UpdateError` naming the key.
    """
    column = records.column("partial")
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    present = np.fromiter((raw is not None for raw in old_raw), bool, len(old_raw))
    dtype = np.float64 if update.output_arrow_type() == pa.float64() else np.int64
    old = np.zeros(len(old_raw), dtype=dtype)
    if present.any():
        old[present] = [msgpack.unpackb(raw) for raw in old_raw if raw is not None]
    partial = column.fill_null(0).to_numpy().astype(dtype, copy=False)
    if update.kind in ("count", "sum"):
        merged = old + partial
    elif update.kind == "min":  # NaN orders above every number, as in Spark
        merged = np.fmin(old, partial)
    else:
        merged = np.maximum(old, partial)
    if "partial_f" in records.column_names:  # an integer sum: did it leave the int64 range?
        _check_int_sum(records, old, partial, merged, present & valid, epoch, worker)
    new = np.where(present & valid, merged, np.where(present, old, partial))
    packb = msgpack.Packer().pack
    known = present | valid
    if known.all():
        return [packb(v) for v in new.tolist()], pa.array(new)
    return ([packb(v) if k else None for v, k in zip(new.tolist(), known.tolist(), strict=True)],
            pa.array(new, mask=~known))


def partial_aggregates(update: Update, records: pa.Table) -> pa.Table:
    """Group an epoch's records by key (the null key too): one row per key with its ``partial``
    aggregate, nulls and NaN as Spark treats them (README, "What it does"): ``count`` counts
    null values, the others skip them (a key whose values are all null keeps its row, with a
    null partial). Records without a value column count as all null.
    """
    if VALUE not in records.column_names:
        records = records.append_column(VALUE, pa.nulls(records.num_rows))
    values = records.column(VALUE)
    if update.kind == "sum" and pa.types.is_integer(values.type):
        # The same sum in float64 beside it tells an int64 sum that wrapped around.
        floats = records.append_column("_vf", values.cast(pa.float64(), safe=False))
        grouped = floats.group_by([KEY, BIN], use_threads=False).aggregate(
            [(VALUE, "sum"), ("_vf", "sum")])
        return grouped.rename_columns([KEY, BIN, "partial", "partial_f"])
    if update.kind == "max" and pa.types.is_floating(values.type):
        # Arrow's max skips NaN; Spark orders NaN above every number, so a NaN is the max.
        grouped = records.append_column("_nan", pc.is_nan(values)).group_by(
            [KEY, BIN], use_threads=False).aggregate([(VALUE, "max"), ("_nan", "any")])
        partial = pc.if_else(grouped.column("_nan_any").fill_null(False), math.nan,
                             grouped.column(f"{VALUE}_max"))
        return grouped.select([KEY, BIN]).append_column("partial", partial)
    grouped = records.group_by([KEY, BIN], use_threads=False).aggregate(
        [([], "count_all")] if update.kind == "count" else [(VALUE, update.kind)])
    return grouped.rename_columns([KEY, BIN, "partial"])


def _check_int_sum(records: pa.Table, old: np.ndarray, partial: np.ndarray,
                   merged: np.ndarray, both: np.ndarray, epoch: int | None,
                   worker: int | None) -> None:
    """Raise :class:`UpdateError` for the first key whose int64 sum overflowed: in the epoch
    (a wrapped sum is 2**64 away from its float64 twin; rounding is far smaller) or when added
    to the stored sum (the signs say so)."""
    floats = records.column("partial_f").fill_null(0).to_numpy()
    wrapped = (np.abs(partial.astype(np.float64) - floats) >= 2.0**63) | \
        (both & (((old ^ merged) & (partial ^ merged)) < 0))
    if wrapped.any():
        i = int(np.flatnonzero(wrapped)[0])
        raise update_failed("its int64 sum overflowed", records.column(KEY)[i].as_py(),
                            OverflowError(f"{int(old[i])} stored + {floats[i]:.6g} in the "
                                          "epoch is outside [-2**63, 2**63)"), epoch, worker)


def apply_custom(
    update: Update, records: pa.Table, old_raw: list[bytes | None],
    epoch: int | None = None, worker: int | None = None,
) -> tuple[list[bytes], list[Any], list[Any]]:
    """Run ``f`` once per key of the epoch (``records``: ``key``, ``_bin``, ``values`` list).

    The null key is a key like any: ``f`` gets ``key=None`` for it. Returns the new msgpack
    states, and the output rows as parallel lists of keys and values. Raises
    :class:`UpdateError` (naming the key, and ``epoch`` and ``worker`` when given) if ``f``
    raises, does not return ``(new_state, outputs)`` or returns a state msgpack cannot encode.
    """
    assert update.fn is not None
    packb = msgpack.Packer().pack
    new_raw: list[bytes] = []
    out_keys: list[Any] = []
    out_values: list[Any] = []
    for key, vals, raw in zip(records.column(KEY).to_pylist(),
                              records.column("values").to_pylist(), old_raw, strict=True):
        try:
            result = update.fn(key, vals, None if raw is None else unpack_value(raw))
        except Exception as exc:
            raise update_failed("it raised", key, exc, epoch, worker, located=True) from exc
        try:
            state, outputs = result
            outputs = list(outputs)
        except Exception as exc:
            raise update_failed("it must return (new_state, an iterable of outputs)", key, exc,
                                epoch, worker) from exc
        new_raw.append(pack_state(packb, state, key, epoch, worker))
        out_keys += [key] * len(outputs)
        out_values += outputs
    return new_raw, out_keys, out_values


def custom_outputs(keys: list[Any], values: list[Any], schema: pa.Schema,
                   epoch: int | None = None, worker: int | None = None) -> pa.Table:
    """The output rows of :func:`apply_custom` as a table of ``schema`` (key, output).

    Raises :class:`UpdateError` naming the first key whose output does not convert to the
    output type.
    """
    out_type = schema.field(1).type
    try:
        converted = pa.array(values, out_type)
    except _CONVERT_ERRORS:
        for key, value in zip(keys, values, strict=True):
            try:
                pa.array([value], out_type)
            except _CONVERT_ERRORS as exc:
                raise update_failed(f"its output {_short(repr(value), 100)} does not convert to "
                                    f"the output type {out_type}", key, exc, epoch,
                                    worker) from exc
        raise  # only the whole list fails (never seen): the original error
    return pa.Table.from_arrays([pa.array(keys, schema.field(0).type), converted], schema=schema)


def group_values(records: pa.Table) -> pa.Table:
    """Group an epoch's records by key for ``f``: ``key``, ``_bin``, ``values`` (a list).

    Arrow's ``group_by`` puts the records with a null key in one group of their own.
    """
    grouped = records.group_by([KEY, BIN], use_threads=False).aggregate([(VALUE, "list")])
    return grouped.rename_columns([KEY, BIN, "values"])
