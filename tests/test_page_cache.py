"""A store's table files read ahead into the page cache: which files, when, and within what."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import megaphone.state_backends.page_cache as page_cache
from megaphone.state_backends import EXPORT_SCHEMA, encode_keys, open_backend, pack_values
from megaphone.state_backends.page_cache import READ_AHEAD_CHUNK, PageCacheWarmer
from tests.helpers.mapped_files import mapped_tables

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise")


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every WILLNEED request as (file name, offset, length); the memory is plentiful."""
    calls: list[tuple[str, int, int]] = []

    def fake(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED
        calls.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), offset, length))

    monkeypatch.setattr(page_cache.os, "posix_fadvise", fake)
    monkeypatch.setattr(page_cache, "available_memory", lambda: 1 << 40)
    return calls


def _table(directory: Path, name: str, size: int) -> None:
    (directory / name).write_bytes(b"\0" * size)


def _join_warmers() -> None:
    for t in page_cache.threading.enumerate():
        if t.name == "megaphone-page-cache":
            t.join()


def test_each_new_table_file_is_read_ahead_once_in_chunks(tmp_path: Path, advised) -> None:
    _table(tmp_path, "000001.sst", 2 * READ_AHEAD_CHUNK + 1)
    _table(tmp_path, "LOG", 100)  # not a table file
    warmer = PageCacheWarmer(str(tmp_path))
    warmer.warm().join()
    assert advised == [("000001.sst", off, READ_AHEAD_CHUNK)
                       for off in (0, READ_AHEAD_CHUNK, 2 * READ_AHEAD_CHUNK)]
    assert warmer.warm() is None  # nothing new
    _table(tmp_path, "000002.sst", 10)
    warmer.warm().join()
    assert advised[-1] == ("000002.sst", 0, READ_AHEAD_CHUNK) and len(advised) == 4


def test_tables_larger_than_their_share_of_memory_stay_cold(
        tmp_path: Path, advised, monkeypatch: pytest.MonkeyPatch) -> None:
    _table(tmp_path, "000001.sst", 1000)
    monkeypatch.setattr(page_cache, "available_memory", lambda: 1000 * page_cache.WARM_SHARE - 1)
    assert PageCacheWarmer(str(tmp_path)).warm() is None
    monkeypatch.setattr(page_cache, "available_memory", lambda: None)  # the system won't say
    assert PageCacheWarmer(str(tmp_path)).warm() is None
    assert advised == []


def test_available_memory_is_read_where_the_system_reports_it() -> None:
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo")
    assert page_cache.available_memory() > 0


def test_a_writer_store_warms_its_tables_and_ingested_ones_a_reader_does_not(
        tmp_path: Path, advised) -> None:
    path = tmp_path / "w"
    store = open_backend("rocksdb", str(path), "int64", 8)
    keys = np.arange(1000, dtype=np.int64)
    bins = keys % 8
    batch = pa.record_batch([pa.array(encode_keys(bins, keys, "int64"), pa.binary()),
                             pa.array(pack_values([1] * 1000), pa.binary())],
                            schema=EXPORT_SCHEMA)
    store.import_sst([batch])
    store.close()
    _join_warmers()
    ingested = {name for name, _, _ in advised}
    tables = {n for n in os.listdir(path) if n.endswith(".sst")}
    assert tables and tables <= ingested  # the ingestion's files, read ahead after it
    advised.clear()
    open_backend("rocksdb", str(path), "int64", 8, read_only=True).close()
    assert advised == []
    writer = open_backend("rocksdb", str(path), "int64", 8)
    _join_warmers()
    writer.close()
    assert {name for name, _, _ in advised} >= tables  # a reopened writer starts warm


def test_a_table_file_deleted_while_listed_is_left_out(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("000007.sst", "000008.sst"):
        (tmp_path / name).write_bytes(b"x" * 10)
    real_scandir = os.scandir

    class Listing:  # 000007.sst goes (a compaction's input) after the listing saw it
        def __enter__(self):
            self.entries = real_scandir(tmp_path)
            listed = list(self.entries.__enter__())
            (tmp_path / "000007.sst").unlink()
            return listed

        def __exit__(self, *exc):
            return self.entries.__exit__(*exc)

    monkeypatch.setattr(page_cache.os, "scandir", lambda path: Listing())
    assert page_cache.table_files(str(tmp_path)) == {"000008.sst": 10}


needs_populate = pytest.mark.skipif(
    not hasattr(page_cache.mmap, "MAP_POPULATE") or not os.path.exists("/proc/self/maps"),
    reason="no MAP_POPULATE or /proc/self/maps")


@needs_populate
def test_warmed_files_stay_mapped_until_deleted_or_closed(tmp_path: Path, advised) -> None:
    _table(tmp_path, "000001.sst", 3 * 4096)
    _table(tmp_path, "000002.sst", 4096)
    _table(tmp_path, "000003.sst", 0)  # nothing to map
    warmer = PageCacheWarmer(str(tmp_path))
    warmer.warm().join()
    assert warmer.mapped() == ["000001.sst", "000002.sst"]
    assert mapped_tables(tmp_path) == {"000001.sst", "000002.sst"}
    (tmp_path / "000001.sst").unlink()  # a compaction's input
    _table(tmp_path, "000004.sst", 4096)  # its output
    warmer.warm().join()
    assert warmer.mapped() == ["000002.sst", "000004.sst"]
    assert mapped_tables(tmp_path) == {"000002.sst", "000004.sst"}
    warmer.close()
    assert warmer.mapped() == [] and mapped_tables(tmp_path) == set()
    _table(tmp_path, "000005.sst", 4096)
    warmer._load(["000005.sst"])  # a warm-up still running when the store closed
    assert warmer.mapped() == [] and mapped_tables(tmp_path) == set()


@needs_populate
def test_a_store_maps_its_compactions_files_and_unmaps_all_when_closed(
        tmp_path: Path, advised) -> None:
    path = tmp_path / "w"
    store = open_backend("rocksdb", str(path), "int64", 8)
    for start in (0, 1000):  # two flushed tables, then one compacted from them
        keys = np.arange(start, start + 1000, dtype=np.int64)
        store.put_many(keys % 8, keys, [1] * 1000)
        store.flush()
    store.warm_page_cache()
    _join_warmers()
    before = {n for n in os.listdir(path) if n.endswith(".sst")}
    assert before and mapped_tables(path) == before
    store._db.compact_range(None, None)
    after = {n for n in os.listdir(path) if n.endswith(".sst")}
    assert after != before
    store.warm_page_cache()
    _join_warmers()
    assert mapped_tables(path) == after  # the inputs' mappings released
    store.close()
    assert mapped_tables(path) == set()
