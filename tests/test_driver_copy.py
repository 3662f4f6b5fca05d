"""The driver's copy under a checkpoint location folds old commit files into metrics files:
every epoch's metrics are kept exactly once, also when a driver is lost in the middle of a fold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megaphone.migrator.driver_copy import FOLD_COMMITS, KEEP_COMMITS, DriverCopy


def commit(copy: DriverCopy, seq: int, routing: Path) -> None:
    copy.add_metrics({"epoch": seq})
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
