"""A worker's task in a group's job (docs/groups.md): the epochs of the group applied in order,
each committed to the worker's store on its own.

The records of every epoch of the group arrive in one shuffle, each carrying its epoch's label
(:data:`~megaphone.migrator.task.columns.LABEL`). Only the group's first epoch installs arriving
bins and drops departed ones (migrations happen at group boundaries only); then each epoch's
records are applied and committed as :func:`~megaphone.migrator.task.state_operator.apply_worker`
does for one epoch, with the group's start passed to the store so that it keeps the undo records and
outputs of the group's earlier epochs. A retried task (or job) of the same run replays the
epochs its store committed already and applies the rest; the results name each row's epoch
(:data:`~megaphone.migrator.task.columns.OUT_EPOCH`).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.migrator.statedir.faults import crash_point
from megaphone.migrator.task.columns import LABEL, OUT_EPOCH, STATE_VALUE
from megaphone.migrator.task.spec import EpochSpec
from megaphone.migrator.task.state_operator import (
    TimedInput,
    apply_epoch,
    check_state_dir,
    open_store,
    replayed_max_event_time,
    report_rows,
    result_schema,
)
from megaphone.migrator.task.transfer import Arrivals, rows
from megaphone.records import WorkerMetrics, WorkerReport
from megaphone.state_backends.remote import RemoteStore


def _tagged(batch: pa.RecordBatch, epoch: int) -> pa.RecordBatch:
    """``batch`` (rows of a group task's results) with its epoch column set to ``epoch``."""
    i = batch.schema.get_field_index(OUT_EPOCH)
    return batch.set_column(i, OUT_EPOCH, pa.array([epoch] * batch.num_rows, pa.int64()))


def _records_only(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The records among shuffle rows (state rows of a replayed first epoch set aside)."""
    return batch.filter(pc.invert(pc.is_valid(batch.column(STATE_VALUE))))


def _new_metrics(bins_in: int = 0) -> WorkerMetrics:
    return WorkerMetrics(records_in=0, records_out=0, bins_in=bins_in, keys_in=0, bytes_in=0,
                         replayed=False, marks={"task": time.time()})


def apply_group(spec: EpochSpec, worker: int, batches: Iterator[pa.RecordBatch]
                ) -> Iterator[pa.RecordBatch]:
    """Run ``worker``'s part of the group ``spec`` (``spec.grouped``): install what arrives
    for the first epoch, then apply and commit each epoch of ``spec.labels`` in order.

    Yields, per epoch, its outputs then its report row (the exporters' reports ride on the
    first epoch's), every row tagged with its epoch.
    """
    started = time.perf_counter()
    check_state_dir(spec)
    timed = TimedInput(batches)
    schema = result_schema(spec.output_schema, grouped=True)
    incoming = spec.incoming.get(worker, ())
    if worker not in spec.live and not incoming:
        for _ in timed:  # no records can be routed to a worker without bins
            pass
        if spec.worker_path(worker).exists() and worker not in spec.outgoing:
            open_store(spec, worker).destroy()  # scale in (see apply_worker)
        if timed.export_reports:
            yield _tagged(report_rows(schema, timed.export_reports), spec.epoch)
        return
    store = open_store(spec, worker)
    first = _new_metrics(len(incoming))
    t0 = time.perf_counter()
    apply, stored = store.begin(spec.epoch, spec.required_epoch(worker), spec.run_id,
                                group_start=spec.epoch)
    first.begin_s, first.restored = time.perf_counter() - t0, store.restored
    if apply:
        store.drop_bins(sorted(set(spec.drops.get(worker, ())) | set(incoming)))
        arrivals = Arrivals(spec.for_epoch(0), worker, store.path, first)
        t0, waited = time.perf_counter(), timed.waiting
        first.install_method = arrivals.install(store, timed, incoming)
        first.install_s = time.perf_counter() - t0 - (timed.waiting - waited)
        crash_point("install", spec.epoch, spec.local_dir)
        records = arrivals.records
    else:
        records = [_records_only(b) for b in timed]
    table = pa.Table.from_batches(records) if records else spec.shuffle_schema.empty_table()
    labels = table.column(LABEL)
    for i, label in enumerate(spec.labels):
        sub = spec.for_epoch(i)
        part = table.filter(pc.equal(labels, pa.scalar(label, pa.int64())))
        metrics = first if i == 0 else _new_metrics()
        epoch_started = started if i == 0 else time.perf_counter()
        if i > 0:
            t0 = time.perf_counter()
            apply, stored = store.begin(sub.epoch, sub.required_epoch(worker), spec.run_id,
                                        group_start=spec.epoch)
            metrics.begin_s = time.perf_counter() - t0
        load = yield from _epoch_rows(sub, store, part, worker, metrics, schema, apply, stored,
                                      incoming if i == 0 else (), spec.epoch)
        metrics.useful_s = time.perf_counter() - epoch_started - (timed.waiting if i == 0
                                                                   else 0.0)
        own = WorkerReport(worker, metrics).to_json()
        extra = timed.export_reports if i == 0 else []
        yield _tagged(report_rows(schema, [own, *extra], load), sub.epoch)


def _epoch_rows(spec: EpochSpec, store: RemoteStore, part: pa.Table, worker: int,
                metrics: WorkerMetrics, schema: pa.Schema, apply: bool, stored: bytes,
                incoming: tuple[int, ...], group_start: int
                ) -> Generator[pa.RecordBatch, None, tuple[np.ndarray, np.ndarray] | None]:
    """One epoch of the group at ``worker``: applied and committed (or, committed already by
    this run, replayed); yields its output rows and returns the records it applied per bin
    (``None`` on a replay) for its report row."""
    load = None
    if apply:
        outputs, load = apply_epoch(spec, store, part, worker, metrics, incoming, group_start)
    else:
        metrics.max_event_time = replayed_max_event_time(spec, part.to_batches())
        metrics.replayed = True
        outputs = pa.ipc.open_stream(stored).read_all() if stored else \
            spec.output_schema.empty_table()
    metrics.token = store.token
    metrics.records_out = outputs.num_rows
    for batch in outputs.cast(spec.output_schema).to_batches():
        yield _tagged(rows(schema, batch.num_rows, dict(zip(batch.schema.names, batch.columns,
                                                            strict=True))), spec.epoch)
    return load
