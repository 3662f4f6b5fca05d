"""One worker's epoch of an event-time operator: fire the timers the watermark passed, apply the
records, and commit state and timers in the epoch's one atomic write (docs/operators.md, "An
epoch of an event-time operator, at one worker"; timers are keys of their key's bin, so they
move with it, written as one group row per bin, time and epoch: "Timers in groups").
"""

from __future__ import annotations

import functools

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
    plain_type,
    run_epoch,
    timers_set,
)
from megaphone.records import WorkerMetrics
from megaphone.state_backends.encoding import BIN_PREFIX_LEN, encode_keys
from megaphone.state_backends.remote import RemoteStore
from megaphone.state_backends.timer_keys import (
    decode_timer_keys,
    expand_due,
    group_writes,
)


def apply_process(spec: EpochSpec, store: RemoteStore, table: pa.Table, worker: int,
                  metrics: WorkerMetrics
                  ) -> tuple[pa.Table, list[bytes], list[bytes | None], list[bytes | None]]:
    """Run the operator over ``worker``'s keys of the epoch: those with due timers, then
    those with records (``table``: ``key``, ``_bin``, ``_t`` and maybe ``value``). Returns
    ``(outputs, keys, new, old)``, the writes to commit (state and timers; ``None`` deletes)
    with their old values, and counts the late records and fired timers in ``metrics``."""
    fn = spec.update.fn
    assert isinstance(fn, ProcessFunction)
    due_rows = store.due_timers(spec.owned.get(worker, ()), spec.watermark) \
        if spec.watermark is not None else []
    due_values = store.read(due_rows)  # the groups' keys; every row's old value to undo
    due = expand_due(due_rows, due_values)
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
    t_keys, t_values, t_old = _timer_writes(store, spec.epoch, bins, state_keys, due_rows,
                                            due_values, *timers_set(result))
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


def _timer_writes(store: RemoteStore, epoch: int, bins: np.ndarray, state_keys: list[bytes],
                  due_rows: list[bytes], due_values: list[bytes | None],
                  new_slots: np.ndarray, new_times: np.ndarray
                  ) -> tuple[list[bytes], list[bytes | None], list[bytes | None]]:
    """The timer rows to write, with their old values: every due row deleted (each of its
    timers fired; ``due_rows`` are groups and per-key timers of an older store alike, with
    their stored ``due_values``), and the timers set (``(new_slots, new_times)``, a timer
    fired and set again included) as the epoch's own group per bin and time, whose old values
    are read. A row per bin and time, not a key per timer."""
    members = [state_keys[s][BIN_PREFIX_LEN:] for s in new_slots.tolist()]
    group_keys, group_values = group_writes(bins[new_slots], new_times, members, epoch)
    old = dict(zip(due_rows, due_values, strict=True))
    fresh = [k for k in group_keys if k not in old]
    old.update(zip(fresh, store.read(fresh), strict=True))
    writes: dict[bytes, bytes | None] = dict.fromkeys(due_rows)
    writes.update(zip(group_keys, group_values, strict=True))
    return list(writes), list(writes.values()), [old[k] for k in writes]
