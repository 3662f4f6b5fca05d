"""RocksDB's compactions yield the CPU to the epochs (docs/transfer.md, "The senders'
compaction")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rocksdict import Rdict

from megaphone.state_backends.rocksdb_tuning import db_options

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc")


def _compaction_nices() -> list[int]:
    nices = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as fh:
            if fh.read().strip() != "rocksdb:low":
                continue
        with open(f"/proc/self/task/{task}/stat") as fh:
            nices.append(int(fh.read().rsplit(")", 1)[1].split()[16]))
    return nices


def test_a_compaction_runs_at_the_lowest_cpu_priority(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path / "db"), options=db_options())
    try:
        for round_ in range(3):  # three overlapping files, then one compaction of them all
            for i in range(2_000):
                db[i.to_bytes(8, "big")] = bytes([round_]) * 16
            db.flush()
        db.compact_range(None, None)
    finally:
        db.close()
    assert 19 in _compaction_nices()  # the thread that ran it; flushes keep theirs
