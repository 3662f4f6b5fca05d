"""The state operator S of one worker for a group of G >= 1 epochs: install moved state, then
apply and commit each epoch's records (docs/architecture.md, "An epoch is a group of one").

Engine-agnostic: :func:`export_worker` runs in the tasks that ship state out of old owners,
:func:`apply_worker` in each worker's task (partition ``w`` is worker ``w``); both take arrow
batches and an :class:`EpochSpec`. Exactly once: a worker's state, outputs and epoch marker
are one atomic store write, and a replay re-emits the stored outputs (docs/worker-store.md,
"The design"); bins that leave a worker are deleted there only at the next epoch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.migrator.statedir.faults import crash_point
from megaphone.migrator.task.columns import (
    BIN,
    EVENT_TIME,
    KEY,
    KIND,
    LABEL,
    LOAD_BINS,
    LOAD_COUNTS,
    OUT_EPOCH,
    REPORT,
    VALUE,
    RowKind,
)
from megaphone.migrator.task.host_duties import check_state_dir, prune_away_copies
from megaphone.migrator.task.hot_split import (
    Partials,
    builtin_partials,
    combine_partials,
    sketch,
    take_partials,
)
from megaphone.migrator.task.process_step import apply_process
from megaphone.migrator.task.spec import EpochSpec
from megaphone.migrator.task.transfer import Arrivals, TimedInput, export_rows, rows
from megaphone.migrator.task.updates import (
    apply_builtin,
    apply_custom,
    custom_outputs,
    group_values,
    partial_aggregates,
)
from megaphone.records import WorkerMetrics, WorkerReport
from megaphone.state_backends.bin_files import file_min_bytes
from megaphone.state_backends.encoding import encode_keys
from megaphone.state_backends.host import host_id
from megaphone.state_backends.remote import DurableSpec, RemoteStore
from megaphone.state_backends.wire import batch_to_ipc

_BINS = pa.list_(pa.int32())
#: The kinds of shuffle rows an epoch applies: records and hot keys' partials.
_APPLIED = pa.array([RowKind.RECORD, RowKind.PARTIAL], pa.int8())

#: The wall-clock marks (``time.time()``) an apply task reports in
#: :attr:`~megaphone.records.WorkerMetrics.marks`, one per phase boundary and none per record:
#: ``task`` (its start), ``begun`` (store opened), ``installed``, ``applied``, ``committed``
#: (absent when the epoch is replayed) and ``end`` (outputs yielded), plus ``install_wait``,
#: the seconds of the install phase spent waiting for the shuffle.
MARKS = ("task", "begun", "installed", "applied", "committed", "end")


def result_schema(output_schema: pa.Schema, grouped: bool = False) -> pa.Schema:
    """What each worker's task returns to the driver: its outputs, then rows of JSON reports
    (its own, with the records it applied per bin, and those of the exporters that shipped
    bins to it); in a group's job (``grouped``) every row also names its epoch."""
    epoch = [pa.field(OUT_EPOCH, pa.int64())] if grouped else []
    return pa.schema([*output_schema, pa.field(REPORT, pa.string()),
                      pa.field(LOAD_BINS, _BINS), pa.field(LOAD_COUNTS, _BINS), *epoch])


def bin_counts(bins: np.ndarray, partials: Partials | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """The bins that had records among ``bins`` (the bin of each record) and ``partials`` (each
    partial row standing for its records), and how many each."""
    weights = None
    if partials is not None:
        weights = np.concatenate([np.ones(len(bins)), np.asarray(partials.records, float)])
        bins = np.concatenate([bins, np.asarray(partials.bins, np.int32)])
    counts = np.bincount(bins, weights=weights).astype(np.int64)
    hot = np.flatnonzero(counts)
    return hot.astype(np.int32), counts[hot].astype(np.int32)


def open_store(spec: EpochSpec, worker: int, at_home: bool = True) -> RemoteStore:
    """A task's handle on ``worker``'s store (with its durable copy's spec when the pipeline
    has a checkpoint location): at the worker's home when that is another host whose service
    is known and ``at_home`` (docs/placement.md), else in this host's store service."""
    durable = None if spec.checkpoint is None else \
        DurableSpec(spec.checkpoint, worker, spec.snapshot_every,
                    spec.committed_tokens.get(worker, ""), spec.pipeline_id or "", spec.secret)
    home = spec.homes.get(worker) if at_home else None
    away = home is not None and home[0] != host_id(spec.local_dir)
    return RemoteStore(spec.local_dir, str(spec.worker_path(worker)), spec.backend,
                       spec.key_type, spec.num_bins, worker, durable,
                       home[1] if away else None, spec.siblings.get(worker) if away else None)


def export_worker(spec: EpochSpec, sender: int) -> Iterator[pa.RecordBatch]:
    """Stream the state of the bins leaving ``sender`` as shuffle rows bound for their new owners
    (:func:`~megaphone.migrator.task.transfer.export_rows`), its report last; its store is read,
    not changed.
    """
    check_state_dir(spec)
    has_state = bool(spec.outgoing.get(sender)) and (
        spec.checkpoint is not None or spec.worker_path(sender).exists())
    yield from export_rows(spec, sender, open_store(spec, sender) if has_state else None)


def pulled_exports(spec: EpochSpec, receiver: int) -> Iterator[pa.RecordBatch]:
    """The shuffle rows :func:`export_worker` would send ``receiver``, read by its own task
    from each sender's store (``spec.pull_exports``: docs/transfer.md, "Receivers that pull"),
    each sender's report (of the bins it sends ``receiver``) last."""
    for sender in sorted(spec.outgoing):
        mine = tuple(move for move in spec.outgoing[sender] if move[1] == receiver)
        if mine:
            yield from export_worker(dataclasses.replace(spec, outgoing={sender: mine}), sender)


def apply_worker(
    spec: EpochSpec, worker: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Run ``worker``'s part of a group of G >= 1 epochs: drop departed bins and install arrivals
    at the first epoch (state installs as it streams in, records wait for the last chunk), then
    apply and commit each epoch's records in order, by their label in a group (docs/groups.md).
    Yields per epoch the outputs, then the report rows (:func:`result_schema`), with the
    exporters' reports at the first epoch.
    """
    started, task_started = time.perf_counter(), time.time()  # the trace's "task" mark too
    check_state_dir(spec)
    pruned = prune_away_copies(spec)
    timed = TimedInput(batches)
    schema = result_schema(spec.output_schema, spec.grouped)
    incoming = spec.incoming.get(worker, ())
    if worker not in spec.live and not incoming:
        for _ in timed:  # no records can be routed to a worker without bins
            pass
        if spec.worker_path(worker).exists() and worker not in spec.outgoing:
            # Scale in: its last bins left in an earlier, committed epoch; release its storage.
            open_store(spec, worker, at_home=False).destroy()
        if timed.export_reports:
            yield _tagged(spec, report_rows(schema, timed.export_reports), spec.epoch)
        return
    store = open_store(spec, worker)
    group_start = spec.epoch if spec.grouped else None
    host = host_id(spec.local_dir)
    metrics, marks = _new_metrics(host, len(incoming), task_started)
    t0 = time.perf_counter()
    apply, stored = store.begin(spec.epoch, spec.required_epoch(worker), spec.run_id,
                                group_start=group_start, started=spec.started_at)
    metrics.begin_s = time.perf_counter() - t0
    marks["begun"] = time.time()
    pulled = _pull(spec, worker, incoming, timed)  # a replay's too: its senders report alike
    metrics.restored = store.restored
    metrics.remote, metrics.address = store.remote or None, store.address
    metrics.service = store.host_service()
    metrics.home_unreachable, metrics.pruned = store.home_unreachable or None, pruned or None
    if apply:
        store.drop_bins(sorted(set(spec.drops.get(worker, ())) | set(incoming)))
        arrivals = Arrivals(spec.for_epoch(0), worker, store.path, metrics)
        t0, waited = time.perf_counter(), timed.waiting
        metrics.install_method = arrivals.install(store, timed, incoming)
        metrics.install_s = time.perf_counter() - t0 - (timed.waiting - waited)
        marks["installed"], marks["install_wait"] = time.time(), timed.waiting - waited + pulled
        crash_point("install", spec.epoch, spec.local_dir)
        records = arrivals.records
    else:  # replayed: the state rows that came again are not installed, records and partials are
        records = [b.filter(pc.is_in(b.column(KIND), value_set=_APPLIED)) for b in timed]
    table = _records_table(records, spec.shuffle_schema)
    for i, (sub, part) in enumerate(_epochs(spec, table)):
        if i:  # a group's later epoch: its own metrics, its store's own begin
            (metrics, marks), started = _new_metrics(host), time.perf_counter()
            t0 = time.perf_counter()
            apply, stored = store.begin(sub.epoch, sub.required_epoch(worker), spec.run_id,
                                        group_start=group_start)
            metrics.begin_s = time.perf_counter() - t0
        load = yield from _epoch_rows(sub, store, part, worker, metrics, schema, apply, stored,
                                      incoming if i == 0 else (), group_start)
        metrics.useful_s = time.perf_counter() - started - (timed.waiting if i == 0 else 0.0)
        marks["end"] = time.time()
        own = WorkerReport(worker, metrics).to_json()
        extra = timed.export_reports if i == 0 else []
        yield _tagged(spec, report_rows(schema, [own, *extra], load), sub.epoch)


def _pull(spec: EpochSpec, worker: int, incoming: tuple[int, ...], timed: TimedInput
          ) -> float:
    """Where receivers pull (:func:`pulled_exports`), read this worker's arriving bins now,
    as waiting for input (before its install's stream, with which they share a connection);
    the seconds it took."""
    return timed.pull(pulled_exports(spec, worker)) if spec.pull_exports and incoming else 0.0


def _epochs(spec: EpochSpec, table: pa.Table) -> Iterator[tuple[EpochSpec, pa.Table]]:
    """The epochs of ``spec`` in order, each with its spec and records: the whole ``table`` for
    one epoch, a group's epochs by their label."""
    if not spec.grouped:
        yield spec, table
        return
    labels = table.column(LABEL)
    for i, label in enumerate(spec.labels):
        yield spec.for_epoch(i), table.filter(pc.equal(labels, pa.scalar(label, pa.int64())))


def _epoch_rows(spec: EpochSpec, store: RemoteStore, part: pa.Table, worker: int,
                metrics: WorkerMetrics, schema: pa.Schema, apply: bool, stored: bytes,
                incoming: tuple[int, ...], group_start: int | None
                ) -> Generator[pa.RecordBatch, None, tuple[np.ndarray, np.ndarray] | None]:
    """One epoch at ``worker``: applied and committed (or, committed already by this run,
    replayed); yields its output rows and returns the records it applied per bin (``None`` on
    a replay) for its report row."""
    load = None
    # The latest event time (partial rows carry their records'); a replay has the same records.
    if spec.has_event_time and part.num_rows:
        metrics.max_event_time = pc.max(part.column(EVENT_TIME)).as_py()
    if apply:
        outputs, load = apply_epoch(spec, store, part, worker, metrics, incoming, group_start)
    else:
        metrics.replayed = True
        outputs = pa.ipc.open_stream(stored).read_all() if stored else \
            spec.output_schema.empty_table()
    metrics.token = store.token  # the driver's commit names the attempt it took
    metrics.records_out = outputs.num_rows
    for batch in outputs.cast(spec.output_schema).to_batches():
        yield _tagged(spec, rows(schema, batch.num_rows, dict(zip(
            batch.schema.names, batch.columns, strict=True))), spec.epoch)
    return load


def _new_metrics(host: str, bins_in: int = 0, task: float | None = None
                 ) -> tuple[WorkerMetrics, dict[str, float]]:
    """An epoch's empty metrics and their marks; its ``task`` mark is when its useful time
    starts (the trace and ``useful_s`` measure the same span)."""
    marks = {"task": time.time() if task is None else task}
    return WorkerMetrics(records_in=0, records_out=0, bins_in=bins_in, keys_in=0, bytes_in=0,
                         replayed=False, marks=marks, host=host), marks


def _tagged(spec: EpochSpec, batch: pa.RecordBatch, epoch: int) -> pa.RecordBatch:
    """``batch`` (rows of a task's results) with, in a group's job, its epoch column set."""
    if not spec.grouped:
        return batch
    i = batch.schema.get_field_index(OUT_EPOCH)
    return batch.set_column(i, OUT_EPOCH, pa.array([epoch] * batch.num_rows, pa.int64()))


def apply_epoch(spec: EpochSpec, store: RemoteStore, table: pa.Table, worker: int,
                metrics: WorkerMetrics, incoming: tuple[int, ...], group_start: int | None = None
                ) -> tuple[pa.Table, tuple[np.ndarray, np.ndarray] | None]:
    """Apply one epoch's records (``table``) at ``worker`` and commit its store: the epoch's
    outputs and the records it applied per bin. ``group_start``: the first epoch of the group
    the epoch runs in (its store keeps the group's undo records; docs/groups.md)."""
    marks = metrics.marks if metrics.marks is not None else {}
    t0 = time.perf_counter()
    table, partials = take_partials(table)  # hot keys' partials from lessees, if any
    # A null key is a key of its own, applied like any (bin 0); counted to stay visible.
    metrics.null_keys = table.column(KEY).null_count or None
    metrics.records_in = table.num_rows + (partials.total if partials else 0)
    load = bin_counts(table.column(BIN).to_numpy(), partials) if metrics.records_in else None
    if partials is not None:
        metrics.split_records, metrics.split_keys = partials.total, len(partials.by_key())
    if spec.sketch_capacity:
        metrics.hot = sketch(table, partials, spec.sketch_capacity)
    if spec.update.is_process:  # an event-time operator: its due timers, then records
        outputs, keys, values, old = apply_process(spec, store, table, worker, metrics)
    else:
        outputs, keys, values, old = _apply_records(spec, store, table, worker, partials)
    if spec.combine_outputs is not None and outputs.num_rows:
        outputs = combined(spec.combine_outputs, outputs)
    metrics.apply_s = time.perf_counter() - t0
    marks["applied"] = time.time()
    crash_point("apply", spec.epoch, spec.local_dir)
    t0 = time.perf_counter()
    min_bytes = file_min_bytes(spec.transfer)
    health = store.commit(spec.epoch, keys, values, old, batch_to_ipc(outputs), incoming,
                          spec.run_id, group_start,
                          ahead=spec.ahead.get(worker, ()) if min_bytes is not None else None,
                          ahead_min_bytes=max(1, min_bytes or 0),
                          leaving=[b for b, _ in spec.outgoing.get(worker, ())]
                          if spec.pull_exports else ())
    metrics.ahead_bins = health.get("ahead") or None
    metrics.ahead_pending = health.get("ahead_pending")
    metrics.commit_s = time.perf_counter() - t0
    marks["committed"] = time.time()
    metrics.store_commit_s = health["seconds"]
    for name in ("stall_s", "pending_compaction_bytes", "l0_files", "compacting"):
        setattr(metrics, name, health[name])
    return outputs, load


def _records_table(records: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """The task's record batches as one table; batches whose columns differ only in being
    nullable (the JVM's and rows made here) are unified, not refused."""
    if not records:
        return schema.empty_table()
    if all(b.schema.equals(records[0].schema) for b in records[1:]):
        return pa.Table.from_batches(records)
    return pa.concat_tables([pa.Table.from_batches([b]) for b in records],
                            promote_options="default")


def combined(combine: Callable[[pa.Table], pa.Table], outputs: pa.Table) -> pa.Table:
    """``outputs`` through a chain's ``combine`` (:class:`~megaphone.Chain`), which must give a
    table of their schema: anything else fails the epoch, naming the combine."""
    result = combine(outputs)
    if not isinstance(result, pa.Table) or not result.schema.equals(outputs.schema):
        got = result.schema if isinstance(result, pa.Table) else type(result).__name__
        raise TypeError(f"the chain's combine {getattr(combine, '__name__', combine)!r} must "
                        f"return a pyarrow Table of its input's schema ({outputs.schema}), "
                        f"got {got}")
    return result


def report_rows(schema: pa.Schema, reports: list[str],
                 load: tuple[np.ndarray, np.ndarray] | None = None) -> pa.RecordBatch:
    """Rows of a task's results that carry only JSON reports; on the first, the records its
    worker applied per bin (``load``: bins and counts), when given."""
    columns = {REPORT: pa.array(reports, pa.string())}
    if load is not None:
        pad = [None] * (len(reports) - 1)
        columns[LOAD_BINS] = pa.array([load[0], *pad], _BINS)
        columns[LOAD_COUNTS] = pa.array([load[1], *pad], _BINS)
    return rows(schema, len(reports), columns)


def _apply_records(spec: EpochSpec, store: RemoteStore, table: pa.Table, worker: int,
                   partials: Partials | None = None
                   ) -> tuple[pa.Table, list[bytes], list[bytes | None], list[bytes | None]]:
    """One epoch's records applied to the current state: ``(outputs, keys, new, old)``.

    Nothing is written here; the caller commits the new values with the outputs. A key of a
    built-in update whose values were all null and that has no aggregate yet has an output
    row (a null aggregate, as in Spark) but nothing to commit: it is left out of the lists.
    Split keys come as ``partials`` (:mod:`~megaphone.migrator.task.hot_split`), consolidated
    here into what their records give.
    """
    update = spec.update
    schema = spec.output_schema
    if table.num_rows == 0 and partials is None:
        return schema.empty_table(), [], [], []
    if VALUE not in table.column_names:
        table = table.append_column(VALUE, pa.nulls(table.num_rows))
    grouped = partial_aggregates(update, table) if update.is_builtin else group_values(table)
    if partials is not None and update.is_builtin:
        grouped = pa.concat_tables([grouped, builtin_partials(update, partials, grouped)])
    bins = grouped.column(BIN).to_numpy()
    keys = grouped.column(KEY)
    raw_keys = encode_keys(bins, keys, spec.key_type)  # Arrow: a null key stays null
    if partials is not None and not update.is_builtin:  # the split keys' states after
        split = partials.by_key()
        raw_keys += encode_keys([b for b, _ in split.values()], list(split), spec.key_type)
    old = store.read(raw_keys)
    if update.is_builtin:
        new_raw, new_values = apply_builtin(update, grouped, old, spec.epoch, worker)
        outputs = pa.Table.from_arrays([keys, new_values], schema=schema) if len(keys) else \
            schema.empty_table()
        if new_values.null_count:  # keys with no aggregate yet (values all null): no state
            kept = np.flatnonzero(new_values.is_valid().to_numpy(zero_copy_only=False))
            raw_keys, new_raw, old = ([seq[i] for i in kept] for seq in (raw_keys, new_raw, old))
    else:  # f per key of the records, then the split keys' partials combined (the rest of old)
        n = len(grouped)
        new_raw, out_keys, out_values = apply_custom(update, grouped, old[:n], spec.epoch, worker)
        if partials is not None:
            more = combine_partials(update, partials, old[n:], spec.epoch, worker)
            new_raw, out_keys, out_values = (a + b for a, b in zip(
                (new_raw, out_keys, out_values), more, strict=True))
        outputs = custom_outputs(out_keys, out_values, schema, spec.epoch, worker)
    return outputs, list(raw_keys), list(new_raw), list(old)
