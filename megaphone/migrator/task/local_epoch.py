"""One epoch's tasks run in this process, in the order Spark runs them: every exporter spills its
shuffle rows per receiving worker, then every worker installs and applies. Offline migration
runs its steps through it, so the live epoch's task code is the one way state moves.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from megaphone.migrator.task.columns import REPORT, WORKER
from megaphone.migrator.task.spec import EpochSpec
from megaphone.migrator.task.state_operator import apply_worker, export_worker
from megaphone.records import WorkerReport


def run_epoch_tasks(spec: EpochSpec, partitions: int, spill_dir: str) -> list[WorkerReport]:
    """Run every task of ``spec``'s epoch for workers ``0..partitions-1`` with no records; the
    reports of the workers and the exporters. Exports finish first, as a map stage does, their
    rows spilled to Arrow IPC files under ``spill_dir`` (memory stays bounded by the chunk size).
    """
    _spill_exports(spec, spill_dir)
    reports: list[WorkerReport] = []
    for worker in range(partitions):
        for batch in apply_worker(spec, worker, _spilled(spill_dir, worker)):
            reports += map(WorkerReport.from_json, batch.column(REPORT).drop_null().to_pylist())
    return reports


def _spill_path(spill_dir: str, worker: int) -> str:
    return os.path.join(spill_dir, f"to-{worker}.arrow")


def _spill_exports(spec: EpochSpec, spill_dir: str) -> None:
    """Every sender's shuffle rows, appended to the spill file of the worker they go to."""
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    with contextlib.ExitStack() as closing:
        for sender in sorted(spec.outgoing):
            for batch in export_worker(spec, sender):
                for worker in pc.unique(batch.column(WORKER)).to_pylist():
                    if worker not in writers:
                        writers[worker] = closing.enter_context(pa.ipc.new_stream(
                            _spill_path(spill_dir, worker), spec.shuffle_schema))
                    writers[worker].write_batch(
                        batch.filter(pc.equal(batch.column(WORKER), worker)))


def _spilled(spill_dir: str, worker: int) -> Iterator[pa.RecordBatch]:
    """The shuffle rows spilled for ``worker`` (none if nothing was sent to it)."""
    path = _spill_path(spill_dir, worker)
    if not os.path.exists(path):
        return
    with pa.memory_map(path) as source:
        yield from pa.ipc.open_stream(source)
