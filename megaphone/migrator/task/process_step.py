"""One worker's epoch of an event-time operator: fire the timers the watermark passed, apply the
records, and commit state and timers in the epoch's one atomic write (docs/operators.md, "An
epoch of an event-time operator, at one worker"; timers are keys of their key's bin, so they
move with it).
"""

from __future__ import annotations

import functools
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.migrator.task.columns import BIN, EVENT_TIME, KEY, VALUE
from megaphone.migrator.task.spec import EpochSpec
from megaphone.migrator.task.updates import custom_outputs, pack_state, update_failed
from megaphone.operators.process import (
    ColumnResults,
    Context,
    EpochBatch,
    ProcessFunction,
    pairs_in,
    plain_type,
    run_epoch,
    timer_columns,
)
from megaphone.records import WorkerMetrics
from megaphone.state_backends.encoding import encode_keys
from megaphone.state_backends.remote import RemoteStore
from megaphone.state_backends.timer_keys import decode_timer_keys, encode_timer_keys

#: The stored value of a timer (the key says it all).
TIMER_VALUE = b""


def apply_process(spec: EpochSpec, store: RemoteStore, table: pa.Table, worker: int,
                  metrics: WorkerMetrics
                  ) -> tuple[pa.Table, list[bytes], list[bytes | None], list[bytes | None]]:
    """Run the operator over ``worker``'s keys of the epoch: those with due timers, then
    those with records (``table``: ``key``, ``_bin``, ``_t`` and maybe ``value``). Returns
    ``(outputs, keys, new, old)``, the writes to commit (state and timers; ``None`` deletes)
    with their old values, and counts the late records and fired timers in ``metrics``."""
    fn = spec.update.fn
    assert isinstance(fn, ProcessFunction)
    due = store.due_timers(spec.owned.get(worker, ()), spec.watermark) \
        if spec.watermark is not None else []
    schema = spec.output_schema
    batch, bins, keys = _epoch_batch(spec, due, table)
    metrics.timers_fired = len(due)
    if not batch.keys:
        metrics.late_records = 0
        return schema.empty_table(), [], [], []
    state_keys = encode_keys(bins, keys, spec.key_type)
    old = store.read(state_keys)
    states = [None if raw is None else msgpack.unpackb(raw, strict_map_key=False)
              for raw in old]
    ctx = Context(spec.epoch, spec.watermark, worker, spec.processing_time_us)
    failed = functools.partial(update_failed, epoch=spec.epoch, worker=worker, located=True)
    result = run_epoch(fn, batch, states, ctx, failed)
    packb = msgpack.Packer().pack
    new = [None if state is None else pack_state(packb, state, key, spec.epoch, worker)
           for key, state in zip(batch.keys, result.states, strict=True)]
    t_keys, t_values, t_old = _timer_writes(spec, store, bins, batch.keys,
                                            *timer_columns(result))
    metrics.late_records = result.late
    outputs = _column_outputs(result, keys, schema, spec.epoch, worker) \
        if isinstance(result, ColumnResults) else \
        custom_outputs(result.out_keys, result.out_values, schema, spec.epoch, worker)
    return outputs, list(state_keys) + t_keys, new + t_values, list(old) + t_old


def _column_outputs(result: ColumnResults, keys: pa.Array, schema: pa.Schema,
                    epoch: int, worker: int) -> pa.Table:
    """The outputs a ``process_epoch`` gave in columns as a table of ``schema`` (key, output):
    their slots' keys, and their values cast to the output type (from its plain form); when
    they do not cast, as :func:`custom_outputs` converts them one by one (which names the
    first key whose output does not convert)."""
    try:
        values = result.out_array.cast(schema.field(1).type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return custom_outputs(result.out_keys, result.out_values, schema, epoch, worker)
    slot_keys = keys.take(pa.array(result.out_slots, pa.int64()))
    return pa.Table.from_arrays([slot_keys.cast(schema.field(0).type), values], schema=schema)


def _epoch_batch(spec: EpochSpec, due: list[bytes], table: pa.Table
                 ) -> tuple[EpochBatch, np.ndarray, pa.Array]:
    """The epoch's due timers and records as an :class:`EpochBatch`, with each slot's bin and
    key: a slot per ``(bin, key)``, found by one Arrow ``group_by`` (keys with due timers
    first, then in the order of their first record)."""
    key_type = table.schema.field(KEY).type
    t_bins, t_times, t_keys = decode_timer_keys(due, spec.key_type)
    keys = pa.concat_arrays([pa.array(t_keys, key_type), *table.column(KEY).chunks])
    bins = np.concatenate([t_bins, table.column(BIN).to_numpy().astype(np.int64, copy=False)])
    rows = pa.table({KEY: keys, BIN: bins, "_i": np.arange(len(bins))})
    firsts = rows.group_by([KEY, BIN], use_threads=False).aggregate([("_i", "list")])
    members = firsts.column("_i_list").combine_chunks()
    sizes = pc.list_value_length(members).to_numpy()
    flat = members.flatten().to_numpy()
    slot_of = np.empty(len(bins), np.int64)
    slot_of[flat] = np.repeat(np.arange(len(sizes)), sizes)
    first = flat[np.cumsum(sizes) - sizes]
    n = len(t_keys)
    times = table.column(EVENT_TIME) if EVENT_TIME in table.column_names else None
    if times is not None and times.null_count:
        i = int(np.flatnonzero(times.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"a record of key {table.column(KEY)[i].as_py()!r} has no event time: "
                         "an event-time operator needs one on every record")
    values = table.column(VALUE).combine_chunks() if VALUE in table.column_names else None
    slot_keys = keys.take(first)
    batch = EpochBatch(
        slot_keys.to_pylist(), slot_of[:n], t_times, slot_of[n:],
        np.zeros(table.num_rows, np.int64) if times is None  # Spark's TimeMode None
        else times.to_numpy().astype(np.int64, copy=False),
        None if values is None else values.cast(plain_type(values.type)))
    return batch, bins[first], slot_keys


def _timer_writes(spec: EpochSpec, store: RemoteStore, bins: np.ndarray, keys: list[Any],
                  done_slots: np.ndarray, done_times: np.ndarray, new_slots: np.ndarray,
                  new_times: np.ndarray
                  ) -> tuple[list[bytes], list[bytes | None], list[bytes | None]]:
    """The timer keys to write: the fired ``(done_slots, done_times)`` deleted (unless set
    again), the ``(new_slots, new_times)`` set; with their old values (a new timer may exist
    already from an earlier epoch). In columns (:func:`~megaphone.operators.process.pairs_in`
    each way), no Python set per key."""
    dels = ~pairs_in(done_slots, done_times, new_slots, new_times)
    adds = ~pairs_in(new_slots, new_times, done_slots, done_times)
    idx = np.concatenate([done_slots[dels], new_slots[adds]])
    at = np.concatenate([done_times[dels], new_times[adds]])
    if not len(idx):
        return [], [], []
    n_dels = int(dels.sum())
    raw = encode_timer_keys(bins[idx], at, [keys[i] for i in idx.tolist()], spec.key_type)
    old_added = store.read(raw[n_dels:]) if len(idx) > n_dels else []
    return (list(raw), [None] * n_dels + [TIMER_VALUE] * (len(idx) - n_dels),
            [TIMER_VALUE] * n_dels + list(old_added))
