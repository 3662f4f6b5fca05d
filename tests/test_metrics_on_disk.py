"""Metrics on disk: the driver's copy under a checkpoint location folds old commit files into
metrics files, keeping every epoch's metrics exactly once (also when a driver is lost in the
middle of a fold) and only the newest ones, as the state directory does: disk stays flat."""

from __future__ import annotations

from pathlib import Path

import pytest

from megaphone.migrator.statedir.directory import METRICS_CHUNK, StateDir
from megaphone.migrator.statedir.driver_copy import (
    FOLD_COMMITS,
    KEEP_COMMITS,
    KEEP_FOLDS,
    DriverCopy,
)


def commit(copy: DriverCopy, seq: int, routing: Path) -> None:
    copy.pending_metrics.append({"epoch": seq})
    copy.write_commit({"seq": seq}, routing)


def test_old_commits_are_folded_once_by_a_driver_that_lists_them_first(tmp_path):
    """A driver's first commit used to be listed twice (listed after it was written, then
    appended), so the fold deleted one file twice and failed after 150 commits."""
    routing = tmp_path / "routing.json"
    routing.write_bytes(b"{}")
    uri = str(tmp_path / "checkpoint")
    n = KEEP_COMMITS + 2 * FOLD_COMMITS + 3
    copy = DriverCopy(uri)
    for seq in range(n):
        commit(copy, seq, routing)
    fresh = DriverCopy(uri)
    assert [m["epoch"] for m in fresh.metrics()] == list(range(n))
    assert fresh.latest_commit() == {"seq": n - 1}


def test_a_fold_cut_short_by_a_lost_driver_keeps_every_metric_once(tmp_path, monkeypatch):
    routing = tmp_path / "routing.json"
    routing.write_bytes(b"{}")
    uri = str(tmp_path / "checkpoint")
    copy = DriverCopy(uri)
    n = KEEP_COMMITS + FOLD_COMMITS
    for seq in range(n - 1):
        commit(copy, seq, routing)

    class LostAfterOneDelete:  # the driver dies after the first delete of its fold
        def __init__(self, fs) -> None:
            self.fs, self.deleted = fs, 0

        def __getattr__(self, name: str):
            return getattr(self.fs, name)

        def delete_file(self, path: str) -> None:
            if self.deleted:
                raise SystemExit("driver lost")
            self.deleted += 1
            self.fs.delete_file(path)

    monkeypatch.setattr(copy, "fs", LostAfterOneDelete(copy.fs))
    with pytest.raises(SystemExit):
        commit(copy, n - 1, routing)  # the fold: metrics file written, one commit deleted
    monkeypatch.undo()
    restarted = DriverCopy(uri)
    assert [m["epoch"] for m in restarted.metrics()] == list(range(n))
    commit(restarted, n, routing)  # deletes what the lost driver folded
    assert [m["epoch"] for m in DriverCopy(uri).metrics()] == list(range(n + 1))
    assert len(list((tmp_path / "checkpoint").rglob("s*.json"))) == KEEP_COMMITS + 1


def test_the_copy_keeps_the_newest_metrics_only_so_its_size_stays_flat(tmp_path):
    routing = tmp_path / "routing.json"
    routing.write_bytes(b"{}")
    uri = str(tmp_path / "checkpoint")
    copy = DriverCopy(uri)
    n = KEEP_COMMITS + (KEEP_FOLDS + 3) * FOLD_COMMITS
    for seq in range(n):
        commit(copy, seq, routing)
    kept = [m["epoch"] for m in DriverCopy(uri).metrics()]
    assert kept == list(range(n - KEEP_COMMITS - KEEP_FOLDS * FOLD_COMMITS, n))


def test_the_state_directory_keeps_one_or_two_chunks_of_metrics(tmp_path):
    state = StateDir(tmp_path, {"fingerprint": {"pipeline_id": "p", "num_bins": 8,
                                                "key_type": "int64"}})
    for epoch in range(METRICS_CHUNK):
        state.append_metrics({"epoch": epoch})
    assert [m["epoch"] for m in state.read_metrics()] == list(range(METRICS_CHUNK))
    reopened = StateDir(tmp_path, state.manifest)  # counts the lines it finds
    for epoch in range(METRICS_CHUNK, 3 * METRICS_CHUNK + 7):
        reopened.append_metrics({"epoch": epoch})
    assert [m["epoch"] for m in reopened.read_metrics()] == \
        list(range(2 * METRICS_CHUNK, 3 * METRICS_CHUNK + 7))
    assert [m["epoch"] for m in reopened.read_metrics(last=3)] == \
        [3 * METRICS_CHUNK + 4, 3 * METRICS_CHUNK + 5, 3 * METRICS_CHUNK + 6]
