"""RocksDB's compactions yield the CPU to the epochs (docs/transfer.md, "The senders'
compaction")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rocksdict import Rdict

from megaphone.state_backends.rocksdb import RocksDBBackend
from megaphone.state_backends.rocksdb_tuning import compaction_threads_idle

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc")


def _thread_classes(name: str) -> list[int]:
    """The scheduling class of each of this process's threads called ``name``."""
    classes = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as fh:
            if fh.read().strip() == name:
                classes.append(os.sched_getscheduler(int(task)))
    return classes


def _compact(db: Rdict) -> None:
    for round_ in range(3):  # three overlapping files, then one compaction of them all
        for i in range(2_000):
            db[i.to_bytes(8, "big")] = bytes([round_]) * 16
        db.flush()
    db.compact_range(None, None)


def _open_compact_and_check(path: str) -> None:
    """Open a store, compact it, and check the threads' classes: run in a fresh interpreter,
    so that no store opened before (by another test) has set them already."""
    store = RocksDBBackend(path, "int64", 16)
    try:
        _compact(store._db)
        compactions = _thread_classes("rocksdb:low")
        assert compactions and all(cls == os.SCHED_IDLE for cls in compactions)
        assert compaction_threads_idle() == 0  # nothing left to move
        assert os.SCHED_IDLE not in _thread_classes("rocksdb:high")  # flushes
    finally:
        store.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE")
def test_compactions_run_in_the_idle_scheduling_class(tmp_path: Path) -> None:
    """A store's open moves RocksDB's compaction threads to SCHED_IDLE, and they stay there
    through a compaction (RocksDB no longer lowers their priority itself, which would reset
    the class); flushes keep theirs."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [root, os.environ.get("PYTHONPATH")]))}
    code = ("from tests.test_rocksdb_tuning import _open_compact_and_check; "
            f"_open_compact_and_check({str(tmp_path / 'db')!r})")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
