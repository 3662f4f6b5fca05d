"""The exporter process that writes bins ahead (:mod:`megaphone.state_backends.bin_exporter`):
it follows its store's writes, pauses when asked, reports its failures, and is started again
after it died."""

from __future__ import annotations

import os
import threading
import time

import pytest

from megaphone.state_backends import open_backend
from megaphone.state_backends.bin_exporter import BinExporter, ExporterError
from tests.test_bin_files import BINS, filled


def written(store, exporter, b, pause=lambda: False):
    job = store.start_ahead(b, 1)
    assert job is not None
    path = store.write_ahead(job, exporter, pause)
    assert store.finish_ahead(job, path)
    return path


def ingested(tmp_path, name, files):
    receiver = open_backend("rocksdb", tmp_path / name, "int64", BINS)
    receiver.ingest_bin_files(files)
    return receiver


def test_the_exporter_sees_the_store_as_written_and_a_reopened_store_anew(tmp_path):
    """Keys written after the exporter first opened the store are in the next file it writes;
    after the store closes and opens again, the exporter follows the new opening."""
    exporter = BinExporter()
    try:
        store = filled(tmp_path / "s", {(0, k): k for k in range(100)})
        written(store, exporter, 0)
        store.put_many([1] * 50, list(range(50)), [7] * 50)  # after the exporter opened it
        written(store, exporter, 1)

        def same(b: int, n: int) -> None:
            receiver = ingested(tmp_path, f"r{b}", store.take_ahead(b))
            assert list(receiver.raw_items([b])) == list(store.raw_items([b]))
            assert len(list(receiver.raw_items([b]))) == n
            receiver.close()

        same(1, 50)
        store.close()  # (its files written ahead go with it)
        store = open_backend("rocksdb", tmp_path / "s", "int64", BINS)
        store.put_many([2] * 30, list(range(30)), [9] * 30)
        written(store, exporter, 2)
        same(2, 30)
        store.close()
    finally:
        exporter.close()


def test_the_exporter_pauses_while_asked_and_then_finishes(tmp_path):
    """While ``pause()`` is true an exporter not in ``SCHED_IDLE`` stops between two chunks of
    keys: a bin of many chunks is not done a second later; once it is false the file is
    written in full."""
    store = filled(tmp_path / "s", {(3, k): k for k in range(40_000)})
    exporter = BinExporter(idle=False)
    hold = threading.Event()
    hold.set()
    result: list[str] = []
    try:
        worker = threading.Thread(
            target=lambda: result.append(written(store, exporter, 3, hold.is_set)))
        worker.start()
        time.sleep(1.0)  # the whole bin takes about 40 ms unpaused
        assert worker.is_alive() and not result
        hold.clear()
        worker.join(30)
        assert result
        receiver = ingested(tmp_path, "r", store.take_ahead(3))
        assert list(receiver.raw_items([3])) == list(store.raw_items([3]))
        receiver.close()
    finally:
        exporter.close()
        store.close()


def test_a_failed_or_dead_exporter_raises_and_the_next_job_starts_it_again(tmp_path):
    """A store that is not there is the job's error, not the exporter's end; an exporter that
    died is an error for the job it had, and the next job starts a new one."""
    store = filled(tmp_path / "s", {(b, k): k for b in range(3) for k in range(20)})
    exporter = BinExporter()
    try:
        with pytest.raises(ExporterError, match="no RocksDB store"):
            exporter.export(str(tmp_path / "missing"), "t", 0, str(tmp_path / "x.sst"))
        written(store, exporter, 0)
        exporter._proc.kill()  # the exporter dies (the OOM killer, say)
        job = store.start_ahead(1, 1)
        with pytest.raises(ExporterError, match="exited"):
            store.write_ahead(job, exporter)
        written(store, exporter, 2)
        assert store.ahead_bins() == [0, 2]
    finally:
        exporter.close()
        store.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE class")
def test_an_idle_exporter_runs_in_sched_idle_and_is_never_paused(tmp_path):
    """By default the exporter runs in ``SCHED_IDLE``, where any other process takes its core
    at once: it writes its bin even while ``pause()`` says an epoch runs."""
    store = filled(tmp_path / "s", {(3, k): k for k in range(20_000)})
    exporter = BinExporter()
    try:
        written(store, exporter, 3, pause=lambda: True)
        assert exporter.yields and os.sched_getscheduler(exporter._proc.pid) == os.SCHED_IDLE
    finally:
        exporter.close()
        store.close()
