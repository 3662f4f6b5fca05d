"""Smoke test of the store read benchmark (``bench/store_reads.py``): it loads a store per
compression, reads every key it asks for (it stops otherwise) and writes its results. No
timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import megaphone.state_backends.rocksdb as rocksdb_backend
from tests.helpers.bench_modules import bench_module


@pytest.mark.skipif(not hasattr(__import__("os"), "posix_fadvise"), reason="no posix_fadvise")
def test_store_reads_loads_reads_and_reports(spark, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # the benchmark swaps the stores' options for this process: put the product's back after
    monkeypatch.setattr(rocksdb_backend, "db_options", rocksdb_backend.db_options)
    with bench_module("store_reads") as store_reads:
        assert store_reads.main(["--keys", "20000", "--compressions", "zstd,none",
                                 "--rounds", "2", "--per", "100",
                                 "--stores", str(tmp_path / "stores"),
                                 "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "reads-20000.json").read_text())
    assert [r["compression"] for r in rows] == ["zstd", "none"]
    # the same keys take more room without compression: the option reached the store
    assert rows[1]["table_bytes"] > rows[0]["table_bytes"] > 0
