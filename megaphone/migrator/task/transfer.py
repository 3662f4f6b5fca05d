"""Moving bins through an epoch's shuffle: the sender's export and the receiver's arrivals, as
rows or as parts of a whole-bin SST file, or with homes as a file's reference
(docs/transfer.md); memory stays bounded by the chunk size and nothing passes the driver.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

from megaphone.migrator.statedir.faults import crash_point
from megaphone.migrator.task.columns import (
    BIN,
    EXPORT_REPORT,
    KIND,
    STATE_FILE,
    STATE_KEY,
    STATE_VALUE,
    WORKER,
    RowKind,
)
from megaphone.migrator.task.spec import EpochSpec
from megaphone.records import WorkerMetrics, WorkerReport
from megaphone.state_backends.bin_files import (
    BinFile,
    FileAssembler,
    file_min_bytes,
    file_parts,
    transfer_dir,
)
from megaphone.state_backends.encoding import payload_bytes
from megaphone.state_backends.handoff import FileRef, LinkRef, crossings
from megaphone.state_backends.host import host_id
from megaphone.state_backends.remote import RemoteStore

#: Every :class:`RowKind`, as the shuffle's kind column holds them.
KINDS = pa.array(list(RowKind), pa.int8())


def rows(schema: pa.Schema, n: int, columns: dict[str, pa.Array], kind: RowKind | None = None
         ) -> pa.RecordBatch:
    """``n`` rows of ``schema`` holding ``columns`` by name (and, given ``kind``, shuffle rows
    of that kind), null in every other column."""
    if kind is not None:
        columns = {**columns, KIND: pa.repeat(pa.scalar(kind, pa.int8()), n)}
    return pa.RecordBatch.from_arrays(
        [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in schema],
        schema=schema)


def export_rows(spec: EpochSpec, sender: int, store: RemoteStore | None
                ) -> Iterator[pa.RecordBatch]:
    """Ship the bins leaving ``sender`` (read from its ``store``, ``None`` if it has none) as
    shuffle rows bound for their new owners, then the sender's report as one last row, to
    the worker that gets its first bin. The store is read, not changed."""
    started, schema = time.perf_counter(), spec.shuffle_schema
    moves = spec.outgoing.get(sender, ())
    bytes_by_bin: dict[int, int] = {}
    keys_out = files = ahead = ahead_bytes = 0
    min_bytes = file_min_bytes(spec.transfer)
    spans: list[list[float]] = []  # [bin, start, end] on the wall clock, for the trace
    hosts = [] if store is None else [store_host(spec, sender, store), host_id(spec.local_dir)]
    # By new owner, then by bin.
    for b, dst in sorted(moves, key=lambda move: (move[1], move[0])) if store is not None else ():
        spans.append([b, time.time(), 0.0])
        for item in store.export([b], spec.chunk_bytes, spec.required_epoch(sender),
                                 spec.epoch, spec.run_id, file_min_bytes=min_bytes,
                                 keep=bool(spec.homes and spec.secret),
                                 link_as=sender if links_within(spec) else None):
            if isinstance(item, BinFile | FileRef | LinkRef):
                f = item if isinstance(item, BinFile) else item.file
                yield from _file_rows(schema, dst, item, spec, hosts)
                keys, size = f.keys, f.bytes
                files += f.kind != "patch"
                if f.kind == "ahead":
                    ahead, ahead_bytes = ahead + 1, ahead_bytes + f.bytes
            else:
                keys, size = item.num_rows, payload_bytes(item)
                yield _bound(schema, dst, b, RowKind.STATE, {
                    STATE_KEY: item.column(0), STATE_VALUE: item.column(1)}, item.num_rows)
                crash_point("export", spec.epoch, spec.local_dir)
            keys_out += keys
            bytes_by_bin[b] = bytes_by_bin.get(b, 0) + size
        spans[-1][2] = time.time()
    if moves:
        metrics = WorkerMetrics(bins_out=len(moves), keys_out=keys_out, files_out=files,
                                ahead_out=ahead or None, ahead_bytes_out=ahead_bytes or None,
                                bytes_out=sum(bytes_by_bin.values()),
                                export_s=time.perf_counter() - started,
                                export_spans=spans or None)
        report = WorkerReport(sender, metrics, bytes_by_bin).to_json()
        yield rows(schema, 1, {WORKER: pa.array([min(dst for _, dst in moves)], pa.int32()),
                               EXPORT_REPORT: pa.array([report])}, RowKind.EXPORT_REPORT)


def receivers_pull(local_slots: int | None, manifest: Mapping[str, Any], transfer: str
                   ) -> bool:
    """Whether an epoch's receivers read the bins they install from their senders' stores in
    their own tasks, with no export tasks before the shuffle (docs/transfer.md, "Receivers that
    pull"): when every task runs on the driver's host (a local master, ``local_slots``), every
    store is in the state directory (no checkpoint location in ``manifest``) and bins go as
    files where they can (a RocksDB store, ``transfer`` not ``"rows"``), so that what a
    receiver reads at once is file references and bins under the file threshold."""
    return local_slots is not None and not manifest.get("checkpoint") and \
        manifest.get("backend") == "rocksdb" and transfer != "rows"


def links_within(spec: EpochSpec) -> bool:
    """Whether moving bins' files are linked from store to store (docs/transfer.md, "Within
    the state directory"): without a checkpoint location, where every worker's store is in the
    state directory, which each task's store service reaches."""
    return spec.checkpoint is None


def _bound(schema: pa.Schema, dst: int, b: int, kind: RowKind, columns: dict[str, pa.Array],
           n: int = 1) -> pa.RecordBatch:
    """``n`` shuffle rows of ``kind`` carrying ``columns`` of bin ``b`` to worker ``dst``."""
    return rows(schema, n, {WORKER: pa.array([dst] * n, pa.int32()),
                            BIN: pa.array([b] * n, pa.int32()), **columns}, kind)


def store_host(spec: EpochSpec, worker: int, store: RemoteStore) -> str:
    """The id of the host whose service holds ``worker``'s ``store``."""
    return spec.homes[worker][0] if store.remote else host_id(spec.local_dir)


def _file_rows(schema: pa.Schema, dst: int, f: BinFile | FileRef | LinkRef, spec: EpochSpec,
               hosts: list[str]) -> Iterator[pa.RecordBatch]:
    """One shuffle row per part of bin file ``f`` to worker ``dst``, each naming the ``hosts``
    its bytes went through (the file is deleted once shipped, or when shipping fails); a
    reference to a file kept at the sender's home, or in its store for a sibling store to
    link, goes as one row without bytes."""
    if isinstance(f, FileRef | LinkRef):
        yield _bound(schema, dst, f.file.bin, RowKind.FILE_PART,
                     {STATE_FILE: pa.array([msgpack.packb(f.to_wire())], pa.binary())})
        crash_point("export", spec.epoch, spec.local_dir)
        return
    try:
        for offset, data in file_parts(f.path, spec.chunk_bytes):
            desc = msgpack.packb({**f.to_wire(), "offset": offset, "hosts": hosts})
            yield _bound(schema, dst, f.bin, RowKind.FILE_PART, {
                STATE_FILE: pa.array([desc], pa.binary()),
                STATE_VALUE: pa.array([data], pa.binary())})
            crash_point("export", spec.epoch, spec.local_dir)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f.path)


class Arrivals:
    """What reaches a worker's task, sorted out: records (kept in :attr:`records` for after the
    installs), row chunks of moving state (streamed to the store by :meth:`chunks`) and parts of
    bin files (written to the store's incoming transfer directory, ingested once whole), all by
    :meth:`install`.
    """

    def __init__(self, spec: EpochSpec, worker: int, store_path: str,
                 metrics: WorkerMetrics) -> None:
        self.spec, self.worker, self.metrics = spec, worker, metrics
        self.records: list[pa.RecordBatch] = []
        self.files = FileAssembler(transfer_dir(store_path, "in"))
        self.refs: list[FileRef] = []  # files kept at their senders' homes
        self.links: list[LinkRef] = []  # files kept in their senders' stores, to link
        self._paths: dict[str, tuple[int, list[str]]] = {}  # per file: bytes, hosts so far
        self._arrived = False

    def chunks(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``(k, v)`` chunks among ``batches``; records are set aside, file parts written."""
        for batch in batches:
            is_state = pc.equal(batch.column(KIND), RowKind.STATE)
            is_file = pc.equal(batch.column(KIND), RowKind.FILE_PART)
            moving = pc.or_(is_state, is_file)
            n_moving = pc.sum(moving).as_py() or 0
            if n_moving < batch.num_rows:
                self.records.append(batch.filter(pc.invert(moving)) if n_moving else batch)
            if not n_moving:
                continue
            if pc.any(is_file).as_py():
                self._file_parts(batch.filter(is_file))
            state = batch if pc.all(is_state).as_py() else batch.filter(is_state)
            if state.num_rows:
                self._arrival()
                self.metrics.keys_in += state.num_rows
                kv = pa.RecordBatch.from_arrays(
                    [state.column(STATE_KEY), state.column(STATE_VALUE)], names=["k", "v"])
                self.metrics.bytes_in += payload_bytes(kv)
                yield kv

    def _file_parts(self, parts: pa.RecordBatch) -> None:
        for desc, data in zip(parts.column(STATE_FILE).to_pylist(),
                              parts.column(STATE_VALUE).to_pylist(), strict=True):
            wire = msgpack.unpackb(desc, raw=False)
            if "source" in wire:
                self.refs.append(ref := FileRef.from_wire(wire))
                self._paths[ref.file.name] = (ref.file.bytes, [ref.host])
            elif "link" in wire:
                self.links.append(link := LinkRef.from_wire(wire))
                self._paths[link.file.name] = (link.file.bytes, [])
            else:
                f = BinFile.from_wire(wire)
                self.files.add(f, int(wire["offset"]), data)
                self._paths[f.name] = (f.bytes, [*wire.get("hosts", ()),
                                                 host_id(self.spec.local_dir)])
            self._arrival()

    def _arrival(self) -> None:
        if not self._arrived:
            self._arrived = True
            crash_point("receive", self.spec.epoch, self.spec.local_dir)

    def install(self, store: RemoteStore, batches: Iterable[pa.RecordBatch],
                incoming: tuple[int, ...]) -> str | None:
        """Install every bin that arrives among ``batches`` (rows as they stream in, files once
        whole) and keep the records; the install path taken (``"chunk"``, ``"sst"``,
        ``"files"``, or two of them joined by ``+``), ``None`` when nothing was to arrive."""
        try:
            if not incoming:  # read the records without a round trip to the store
                for _ in self.chunks(batches):
                    pass
                if self._arrived:
                    raise RuntimeError(
                        f"worker {self.worker} received state at epoch {self.spec.epoch} but "
                        "installs no bin: the epoch's layout is inconsistent")
                return None
            by_rows = store.install(self.chunks(batches))
            by_files = self._ingest(store, incoming)
            taken = [by_rows["method"] if by_rows["keys"] else None, by_files]
            return "+".join(filter(None, taken)) or by_rows["method"]
        finally:
            self.files.discard()

    def _ingest(self, store: RemoteStore, incoming: Iterable[int]) -> str | None:
        """Ingest the bin files received whole, and have the store's service pull those kept
        at their senders' homes; the method taken, ``None`` if there were none. Fails loudly on
        a file of a bin this worker does not install at this epoch. Counts the bytes pulled
        home to home and the bytes times the host crossings of every file."""
        files = self.files.complete()
        stray = sorted(({f.bin for f in files} | {r.file.bin for r in self.refs}
                        | {r.file.bin for r in self.links}) - set(incoming))
        if stray:
            raise RuntimeError(f"worker {self.worker} received files of bins {stray} at epoch "
                               f"{self.spec.epoch} but does not install them: the epoch's "
                               "layout is inconsistent")
        replies = [store.ingest(files, self.spec.chunk_bytes)] if files else []
        if self.refs:
            replies.append(pulled := store.pull(self.refs, self.spec.chunk_bytes))
            self.metrics.h2h_bytes = pulled["bytes"]
        if self.links:
            replies.append(store.link(self.links, [str(self.spec.worker_path(r.worker))
                                                   for r in self.links]))
        if not replies:
            return None
        here = store_host(self.spec, self.worker, store)
        self.metrics.across_bytes = sum(n * crossings(*path, here)
                                        for n, path in self._paths.values())
        self.metrics.keys_in += sum(r["keys"] for r in replies)
        self.metrics.bytes_in += sum(r["bytes"] for r in replies)
        self.metrics.files_in = sum(f.kind != "patch" for f in [
            *files, *(r.file for r in self.refs), *(r.file for r in self.links)])
        return "+".join(dict.fromkeys(r["method"] for r in replies))


class TimedInput:
    """Wrap the task's input: time spent waiting for it is excluded from useful time, the
    exporters' reports are set aside (:attr:`export_reports`) from records and state, and a
    row of no known :class:`RowKind` fails the task (:func:`check_kinds`)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._it = iter(batches)
        self.waiting = 0.0
        self.export_reports: list[str] = []

    def pull(self, batches: Iterable[pa.RecordBatch]) -> float:
        """Read ``batches`` now, timed as waiting for input, and yield them first: the moving
        state a receiver pulls (docs/transfer.md, "Receivers that pull"); bin files go as
        references, so only bins under the file threshold come as rows. The seconds it took."""
        t0 = time.perf_counter()
        pulled = list(batches)
        seconds = time.perf_counter() - t0
        self.waiting += seconds
        self._it = itertools.chain(pulled, self._it)
        return seconds

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            t0 = time.perf_counter()
            batch = next(self._it, None)
            self.waiting += time.perf_counter() - t0
            if batch is None:
                return
            check_kinds(batch)
            has = pc.equal(batch.column(KIND), RowKind.EXPORT_REPORT)
            if pc.any(has).as_py():
                self.export_reports += batch.filter(has).column(EXPORT_REPORT).to_pylist()
                batch = batch.filter(pc.invert(has))
            yield batch


def check_kinds(batch: pa.RecordBatch) -> None:
    """Fail loudly if a shuffle row's kind is null or no :class:`RowKind`: consumers select rows
    by kind, and would take such a row for what it is not, or drop it without a trace."""
    known = pc.is_in(batch.column(KIND), value_set=KINDS)
    if not pc.all(known).as_py():
        bad = batch.column(KIND).filter(pc.invert(known))
        raise RuntimeError(f"{len(bad)} shuffle rows of unknown kind (first: {bad[0].as_py()}; "
                           f"known: {', '.join(f'{k.name}={k.value}' for k in RowKind)}): a "
                           "producer of the epoch's shuffle did not set its rows' kind")
