"""Dual mode for hot keys, the worker side (docs/hot-keys.md, "Dual mode on Spark"): lessees fold
each split key's records into one partial row bound for its owner (:func:`fold_partials`),
which consolidates them into what the unsplit path computes (:func:`take_partials`,
:func:`builtin_partials`, :func:`combine_partials`). Each worker also summarizes the keys it
applied (:func:`sketch`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.migrator.task.columns import (
    BIN,
    EVENT_TIME,
    KEY,
    KIND,
    LABEL,
    PARTIAL,
    VALUE,
    WORKER,
    RowKind,
)
from megaphone.migrator.task.spec import EpochSpec
from megaphone.migrator.task.transfer import rows
from megaphone.migrator.task.updates import (
    Update,
    group_values,
    partial_aggregates,
    update_failed,
)
from megaphone.operators.combiner import Combiner
from megaphone.plans.hot_keys import HeavyHitters
from megaphone.state_backends.encoding import unpack_value


def splittable(update: Update) -> bool:
    """Whether ``update``'s hot keys may be split: a built-in aggregation, or a
    :class:`~megaphone.operators.combiner.Combiner` (commutative and associative). A plain
    ``f`` may depend on the order of its records, and an event-time operator on timers: their
    keys stay at their owner (sequential mode)."""
    return update.is_builtin or isinstance(update.fn, Combiner)


def fold_partials(spec: EpochSpec, batches: Iterator[pa.RecordBatch],
                  schema: pa.Schema | None = None) -> Iterator[pa.RecordBatch]:
    """A lessee task: its records of the split keys, one partial row per key (shuffle rows of
    ``schema``, default ``spec.shuffle_schema``, bound for the key's owner); in a group's job
    one per key and epoch label, each carrying its label. All of the task's records of a key
    (at an epoch) go into one partial; a built-in's partial is its aggregate, a combiner's its
    ``fold``."""
    got = [b for b in batches if b.num_rows]
    if not got:
        return
    schema = schema or spec.shuffle_schema
    table = pa.Table.from_batches(got)
    if LABEL not in table.column_names:
        yield _fold(spec, table, schema, None)
        return
    labels = table.column(LABEL)
    for label in pc.unique(labels).to_pylist():
        yield _fold(spec, table.filter(pc.equal(labels, label)), schema, label)


def _fold(spec: EpochSpec, table: pa.Table, schema: pa.Schema, label: int | None
          ) -> pa.RecordBatch:
    """The partial rows of ``table``'s records (all of one epoch, of ``label`` in a group)."""
    aggregations = [([], "count_all")]
    if spec.has_event_time:  # the latest event time of the key's records, for latency
        aggregations.append((EVENT_TIME, "max"))
    counts = table.group_by([KEY, BIN, WORKER], use_threads=False).aggregate(aggregations)
    where = {row[KEY]: row for row in counts.to_pylist()}
    partials = _builtin_fold(spec, table) if spec.update.is_builtin else \
        _combiner_fold(spec, table)
    keys = list(partials)
    packb = msgpack.Packer().pack
    columns = {
        KEY: pa.array(keys, schema.field(KEY).type),
        BIN: pa.array([where[k][BIN] for k in keys], pa.int32()),
        WORKER: pa.array([where[k][WORKER] for k in keys], pa.int32()),
        PARTIAL: pa.array([packb([where[k]["count_all"], partials[k]]) for k in keys], pa.binary()),
    }
    if label is not None:
        columns[LABEL] = pa.array([label] * len(keys), pa.int64())
    if spec.has_event_time:
        columns[EVENT_TIME] = pa.array([where[k][f"{EVENT_TIME}_max"] for k in keys], pa.int64())
    return rows(schema, len(keys), {name: column.cast(schema.field(name).type)
                                    for name, column in columns.items()}, RowKind.PARTIAL)


def pass_and_fold(spec: EpochSpec, batches: Iterator[pa.RecordBatch]
                  ) -> Iterator[pa.RecordBatch]:
    """A map task that is its own lessee: records of keys not split pass through unchanged,
    those of the split keys are folded into partial rows (:func:`fold_partials`) at the end of
    the task. One pass, in the stage that reads the input: no second scan, no extra stage.
    Records keep their kind (:attr:`~megaphone.migrator.task.columns.RowKind.RECORD`)."""
    hot: list[pa.RecordBatch] = []
    schema = None  # the input's (Spark's Arrow types): partial rows must match it
    split = None  # the split keys as an array of the input's key type, built once
    for batch in batches:
        schema = batch.schema
        if split is None:
            split = pa.array(list(spec.split_keys), batch.column(KEY).type)
        mask = pc.is_in(batch.column(KEY), value_set=split)  # null key: false, kept cold
        n_hot = pc.sum(mask).as_py() or 0
        if n_hot < batch.num_rows:
            yield batch.filter(pc.invert(mask)) if n_hot else batch
        if n_hot:
            hot.append(batch.filter(mask))
    yield from fold_partials(spec, iter(hot), schema)


def _builtin_fold(spec: EpochSpec, table: pa.Table) -> dict[Any, Any]:
    """Each key's aggregate over the task's records (``None`` when its values are all null);
    an int64 sum that overflows here fails as it would at the owner."""
    grouped = partial_aggregates(spec.update, table)
    keys = grouped.column(KEY).to_pylist()
    if "partial_f" in grouped.column_names:
        ints = grouped.column("partial").fill_null(0).to_numpy().astype(np.float64)
        floats = grouped.column("partial_f").fill_null(0).to_numpy()
        for i in np.flatnonzero(np.abs(ints - floats) >= 2.0**63):
            raise update_failed("its int64 sum overflowed", keys[i], OverflowError(
                f"a lessee's partial sum {floats[i]:.6g} is outside [-2**63, 2**63)"),
                spec.epoch, None)
    return dict(zip(keys, grouped.column("partial").to_pylist(), strict=True))


def _combiner_fold(spec: EpochSpec, table: pa.Table) -> dict[Any, Any]:
    """Each key's ``fold`` of the task's values (an :class:`UpdateError` if it raises)."""
    combiner = spec.update.fn
    assert isinstance(combiner, Combiner)
    grouped = group_values(table)
    out = {}
    for key, values in zip(grouped.column(KEY).to_pylist(),
                           grouped.column("values").to_pylist(), strict=True):
        try:
            out[key] = combiner.fold(key, values)
        except Exception as exc:
            raise update_failed("its fold raised", key, exc, spec.epoch, None,
                                located=True) from exc
    return out


@dataclass(frozen=True)
class Partials:
    """The partial rows an owner received: per row its ``key``, ``bin``, the records it stands
    for and its ``partial`` (decoded)."""

    keys: list[Any]
    bins: list[int]
    records: list[int]
    partials: list[Any]

    @property
    def total(self) -> int:
        """The records the lessees folded into these partials."""
        return sum(self.records)

    def by_key(self) -> dict[Any, tuple[int, list[Any]]]:
        """Each key's bin and partials, keys in the order they first came."""
        out: dict[Any, tuple[int, list[Any]]] = {}
        for key, b, partial in zip(self.keys, self.bins, self.partials, strict=True):
            out.setdefault(key, (b, []))[1].append(partial)
        return out


def take_partials(table: pa.Table) -> tuple[pa.Table, Partials | None]:
    """Split an owner's input into its records and its partial rows (``None`` if none)."""
    is_partial = pc.equal(table.column(KIND), RowKind.PARTIAL)
    if not pc.any(is_partial).as_py():
        return table, None
    part = table.filter(is_partial)
    decoded = [unpack_value(raw) for raw in part.column(PARTIAL).to_pylist()]
    partials = Partials(part.column(KEY).to_pylist(), part.column(BIN).to_pylist(),
                        [int(d[0]) for d in decoded], [d[1] for d in decoded])
    records = table.filter(pc.invert(is_partial))
    stray = pc.is_in(records.column(KEY), value_set=part.column(KEY).combine_chunks())
    if pc.any(stray).as_py():  # never by construction: both come from one filter
        key = records.filter(stray).column(KEY)[0].as_py()
        raise RuntimeError(f"a record of split key {key!r} reached its owner unfolded, beside "
                           "its partials: the epoch's job routed it wrongly")
    return records, partials


def builtin_partials(update: Update, partials: Partials, like: pa.Table) -> pa.Table:
    """The consolidated rows (``key``, ``_bin``, ``partial``...) of the split keys, as
    :func:`~megaphone.migrator.task.updates.partial_aggregates` gives them for ``like`` (the owner's
    other keys) -- the aggregate of the partials is the aggregate of the records.

    ``count`` adds the partial counts; ``sum``, ``min`` and ``max`` aggregate the partials as
    if they were the records' values (nulls skipped, NaN ordered as Spark orders it)."""
    table = pa.table({KEY: pa.array(partials.keys, like.schema.field(KEY).type),
                      BIN: pa.array(partials.bins, pa.int32()),
                      VALUE: pa.array(partials.partials, update.output_arrow_type())})
    if update.kind == "count":
        grouped = table.group_by([KEY, BIN], use_threads=False).aggregate([(VALUE, "sum")])
        return grouped.rename_columns([KEY, BIN, "partial"]).cast(like.schema)
    return partial_aggregates(update, table).cast(like.schema)


def combine_partials(update: Update, partials: Partials, old_raw: list[bytes | None],
                     epoch: int, worker: int) -> tuple[list[bytes], list[Any], list[Any]]:
    """A combiner's split keys at their owner: each key's partials combined into its stored
    state (``old_raw``, in :meth:`Partials.by_key` order), outputs read from the result --
    as :func:`~megaphone.migrator.task.updates.apply_custom` returns them for unsplit keys."""
    combiner = update.fn
    assert isinstance(combiner, Combiner)
    packb = msgpack.Packer().pack
    new_raw: list[bytes] = []
    out_keys: list[Any] = []
    out_values: list[Any] = []
    for (key, (_, parts)), raw in zip(partials.by_key().items(), old_raw, strict=True):
        state = None if raw is None else unpack_value(raw)
        try:
            new = combiner.merge(state, parts)
            outputs = list(combiner.outputs(key, new))
            new_raw.append(packb(new))
        except Exception as exc:
            raise update_failed("its combine or outputs raised", key, exc, epoch, worker,
                                located=True) from exc
        out_keys += [key] * len(outputs)
        out_values += outputs
    return new_raw, out_keys, out_values


def sketch(table: pa.Table, partials: Partials | None, capacity: int) -> dict[str, Any]:
    """The worker's heaviest keys of the epoch with exact counts (records and split keys'
    partials), bounded to ``capacity`` counters (the null key is never split, so not listed)."""
    counts: dict[Any, float] = {}
    if table.num_rows:
        vc = pc.value_counts(table.column(KEY).combine_chunks())
        values, freq = vc.field(0), vc.field(1).to_numpy()
        if len(freq) > capacity:  # only the heaviest reach Python
            top = np.argpartition(-freq, capacity)[: capacity + 1]
            values, freq = values.take(pa.array(top)), freq[top]
        counts.update(zip(values.to_pylist(), freq.tolist(), strict=True))
    if partials is not None:
        for key, n in zip(partials.keys, partials.records, strict=True):
            counts[key] = counts.get(key, 0) + n
    counts.pop(None, None)
    total = table.num_rows + (partials.total if partials is not None else 0)
    return HeavyHitters.from_counts(list(counts), list(counts.values()), total,
                                    capacity).to_json()


__all__ = ["Partials", "builtin_partials", "combine_partials", "fold_partials", "pass_and_fold",
           "sketch", "splittable", "take_partials"]
