"""One worker's epoch of an event-time operator (a :class:`~megaphone.operators.process.
ProcessFunction`): fire the timers the watermark passed, apply the records, and write state
and timers back in the epoch's one atomic commit.

Timers are keys of their key's bin (:func:`~megaphone.state_backends.encoding.
encode_timer_keys`); a worker fires the due timers of the bins it owns at the epoch, after it
installed the bins that arrived, so a moved key's timers fire at its new owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from megaphone.migrator.task.columns import BIN, EVENT_TIME, KEY, VALUE
from megaphone.migrator.task.spec import EpochSpec
from megaphone.migrator.task.updates import custom_outputs, update_failed
from megaphone.operators.process import Context, ProcessFunction, Row, plain_type, run_keys
from megaphone.state_backends.encoding import encode_keys
from megaphone.state_backends.remote import RemoteStore
from megaphone.state_backends.timer_keys import decode_timer_keys, encode_timer_keys

#: The stored value of a timer (the key says it all).
TIMER_VALUE = b""


@dataclass
class ProcessWrites:
    """An operator's epoch at one worker: outputs, the writes to commit (state and timers;
    ``None`` deletes) with their old values, and the records dropped as late."""

    outputs: pa.Table
    keys: list[bytes]
    values: list[bytes | None]
    old: list[bytes | None]
    late: int
    fired: int


def apply_process(spec: EpochSpec, store: RemoteStore, table: pa.Table, worker: int
                  ) -> ProcessWrites:
    """Run the operator over ``worker``'s keys of the epoch: those with due timers, then
    those with records (``table``: ``key``, ``_bin``, ``_t`` and maybe ``value``)."""
    fn = spec.update.fn
    assert isinstance(fn, ProcessFunction)
    due = store.due_timers(spec.owned.get(worker, ()), spec.watermark) \
        if spec.watermark is not None else []
    slots: dict[tuple[int, Any], int] = {}  # (bin, key) -> index
    bins: list[int] = []
    keys: list[Any] = []
    timers: list[list[int]] = []
    rows: list[list[Row]] = []

    def slot(b: int, key: Any) -> int:
        i = slots.get((b, key))
        if i is None:
            i = slots[(b, key)] = len(keys)
            bins.append(b)
            keys.append(key)
            timers.append([])
            rows.append([])
        return i

    if due:
        t_bins, t_times, t_keys = decode_timer_keys(due, spec.key_type)
        for b, t, k in zip(t_bins.tolist(), t_times.tolist(), t_keys, strict=True):
            timers[slot(b, k)].append(t)
    if table.num_rows:
        values = table.column(VALUE) if VALUE in table.column_names else None
        vals = values.cast(plain_type(values.type)).to_pylist() if values is not None \
            else [None] * table.num_rows
        times = table.column(EVENT_TIME).to_pylist() if EVENT_TIME in table.column_names \
            else [0] * table.num_rows  # an operator without event time (Spark's TimeMode None)
        for b, k, t, v in zip(table.column(BIN).to_pylist(), table.column(KEY).to_pylist(),
                              times, vals, strict=True):
            if t is None:
                raise ValueError(f"a record of key {k!r} has no event time: an event-time "
                                 "operator needs one on every record")
            rows[slot(b, k)].append((t, v))
    schema = spec.output_schema
    if not keys:
        return ProcessWrites(schema.empty_table(), [], [], [], 0, 0)
    bin_arr = np.asarray(bins, dtype=np.int64)
    state_keys = encode_keys(bin_arr, pa.array(keys, schema.field(0).type), spec.key_type)
    old = store.read(state_keys)
    states = [None if raw is None else msgpack.unpackb(raw, strict_map_key=False)
              for raw in old]
    ctx = Context(spec.epoch, spec.watermark, worker, spec.processing_time_us)

    def failed(what: str, key: Any, exc: BaseException) -> BaseException:
        return update_failed(what, key, exc, spec.epoch, worker, located=True)

    result = run_keys(fn, keys, timers, rows, states, ctx, failed)
    packb = msgpack.Packer().pack
    new: list[bytes | None] = []
    for key, state in zip(keys, result.states, strict=True):
        try:
            new.append(None if state is None else packb(state))
        except (TypeError, ValueError, OverflowError) as exc:
            raise update_failed(f"msgpack cannot encode its new state (a {type(state).__name__})",
                                key, exc, spec.epoch, worker) from exc
    t_keys, t_values, t_old = _timer_writes(spec, store, bin_arr, keys, result.fired,
                                            result.set)
    outputs = custom_outputs(result.out_keys, result.out_values, schema, spec.epoch, worker)
    return ProcessWrites(outputs, list(state_keys) + t_keys, new + t_values,
                         list(old) + t_old, result.late, len(due))


def _timer_writes(spec: EpochSpec, store: RemoteStore, bins: np.ndarray, keys: list[Any],
                  fired: list[list[int]], added: list[set[int]]
                  ) -> tuple[list[bytes], list[bytes | None], list[bytes | None]]:
    """The timer keys to write: fired timers deleted (unless set again), new ones set; with
    their old values (a new timer may exist already from an earlier epoch)."""
    del_idx, del_times, add_idx, add_times = [], [], [], []
    for i, (done, new) in enumerate(zip(fired, added, strict=True)):
        for t in set(done) - new:
            del_idx.append(i)
            del_times.append(t)
        for t in new - set(done):
            add_idx.append(i)
            add_times.append(t)
    if not del_idx and not add_idx:
        return [], [], []
    idx = np.asarray(del_idx + add_idx, dtype=np.int64)
    raw = encode_timer_keys(bins[idx], np.asarray(del_times + add_times, dtype=np.int64),
                            [keys[i] for i in idx.tolist()], spec.key_type)
    n_del = len(del_idx)
    old_added = store.read(raw[n_del:]) if add_idx else []
    return (list(raw), [None] * n_del + [TIMER_VALUE] * len(add_idx),
            [TIMER_VALUE] * n_del + list(old_added))
