"""RoutingTable: owners across many versions, moves, live workers, persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.routing.fingerprint import Fingerprint, FingerprintMismatch
from megaphone.routing.table import ROUTING_FORMAT, Move, RoutingTable, initial_owners

FP = Fingerprint("pipe", 16, "int64")


def ranges(workers: int, bins: int = 16) -> list[int]:
    """The reference initial map: ``workers`` contiguous runs of bins, sizes within one."""
    return [b * workers // bins for b in range(bins)]


def test_initial_map_is_contiguous_ranges():
    table = RoutingTable.initial(FP, workers=3)
    assert [table.owner(b) for b in range(16)] == [0] * 6 + [1] * 5 + [2] * 5 == ranges(3)
    assert table.version == 0 and table.workers() == [0, 1, 2]
    assert table.to_dict()["layout"] == "ranges"


@given(st.integers(1, 64), st.integers(1, 4096))
def test_ranges_are_contiguous_and_within_one_bin_of_even(workers, bins):
    owners = initial_owners(bins, workers)
    assert (np.diff(owners) >= 0).all()  # each worker's bins are one run, in worker order
    sizes = np.bincount(owners, minlength=workers)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == bins


def test_a_table_written_before_layouts_keeps_bin_mod_workers():
    """Format 1 tables (state directories of earlier releases) were always ``i mod W``."""
    table = RoutingTable.initial(FP, 3)
    table.apply_step([Move(15, 2, 0)], epoch=1)
    old = {**table.to_dict(), "format": "megaphone.routing/1"}
    del old["layout"]
    with pytest.raises(ValueError, match="is not its owner"):
        RoutingTable.from_dict(old, FP)  # bin 15 was worker 0's under i mod 3
    old["versions"][0]["moves"] = [[14, 2, 0]]
    again = RoutingTable.from_dict(old, FP)
    assert again.layout == "modulo" and again.owners(0).tolist() == [b % 3 for b in range(16)]
    assert again.to_dict()["format"] == ROUTING_FORMAT and again.owner(14) == 0


def test_an_unknown_layout_is_refused():
    data = RoutingTable.initial(FP, 2).to_dict()
    with pytest.raises(ValueError, match="unknown routing layout 'striped'"):
        RoutingTable.from_dict({**data, "layout": "striped"}, FP)


@st.composite
def histories(draw):
    """A random sequence of steps (scale out and in, moves back and forth) on 16 bins."""
    workers = draw(st.integers(1, 4))
    owners = ranges(workers)
    steps, epoch = [], 0
    for _ in range(draw(st.integers(0, 12))):
        epoch += draw(st.integers(0, 3))
        bins = draw(st.lists(st.integers(0, 15), min_size=1, max_size=6, unique=True))
        moves = []
        for b in bins:
            dst = draw(st.integers(0, 6).filter(lambda w, b=b: w != owners[b]))
            moves.append(Move(b, owners[b], dst))
            owners[b] = dst
        steps.append((epoch, moves))
    return workers, steps


@given(histories())
def test_owner_at_every_epoch_matches_a_replay(history):
    workers, steps = history
    table = RoutingTable.initial(FP, workers)
    expected = {-1: ranges(workers)}
    for epoch, moves in steps:
        table.apply_step(moves, epoch)
    # Reference: replay steps in order; the owners at epoch e are after every step with epoch <= e.
    last_epoch = steps[-1][0] if steps else 0
    for e in range(last_epoch + 2):
        owners = ranges(workers)
        for epoch, moves in steps:
            if epoch <= e:
                for m in moves:
                    owners[m.bin] = m.dst
        expected[e] = owners
        assert [table.owner(b, e) for b in range(16)] == owners
        assert table.owners(e).tolist() == owners
        assert table.workers(e) == sorted(set(owners))
    # Round trip through disk keeps every answer.
    again = RoutingTable.from_dict(json.loads(json.dumps(table.to_dict())), FP)
    assert again.version == table.version
    for e in range(last_epoch + 2):
        assert again.owners(e).tolist() == expected[e]
    for v in range(table.version + 1):
        assert again.moves_between(0, v) == table.moves_between(0, v)


def test_moves_between_versions_and_at_epoch():
    table = RoutingTable.initial(FP, 2)
    table.apply_step([Move(0, 0, 1), Move(9, 1, 0)], epoch=3)
    table.apply_step([Move(0, 1, 2)], epoch=4)
    assert table.moves_between(0, 2) == [Move(0, 0, 2), Move(9, 1, 0)]
    assert table.moves_at(3) == [Move(0, 0, 1), Move(9, 1, 0)]
    assert table.moves_at(4) == [Move(0, 1, 2)]
    assert table.moves_at(5) == []
    assert table.version_at(2) == 0 and table.version_at(3) == 1 and table.version_at(9) == 2


def test_scale_out_and_in_change_live_workers():
    table = RoutingTable.initial(FP, 2)
    table.apply_step([Move(b, b // 8, 2) for b in range(0, 16, 4)], epoch=1)
    assert table.workers() == [0, 1, 2]
    table.apply_step([Move(9, 1, 3)], epoch=1)
    assert table.workers() == [0, 1, 2, 3]
    table.apply_step([Move(b, 0, 1) for b in table.bins_of(0)], epoch=2)
    assert table.workers() == [1, 2, 3]
    assert table.workers(0) == [0, 1]


@pytest.mark.parametrize(
    ("moves", "message"),
    [
        ([Move(99, 0, 1)], "unknown bin 99"),
        ([Move(0, 1, 2)], "is not its owner"),
        ([Move(8, 0, 2)], "is not its owner"),
        ([Move(0, 7, 2)], "unknown source worker 7"),
        ([Move(0, 0, 1), Move(0, 0, 2)], "moved twice"),
        ([Move(0, 0, 0)], "to itself"),
        ([], "at least one bin"),
    ],
)
def test_bad_steps_are_refused_and_change_nothing(moves, message):
    table = RoutingTable.initial(FP, 2)
    before = table.to_dict()
    with pytest.raises(ValueError, match=message):
        table.apply_step(moves, epoch=1)
    assert table.to_dict() == before


def test_step_before_newest_epoch_is_refused():
    table = RoutingTable.initial(FP, 2)
    table.apply_step([Move(0, 0, 1)], epoch=5)
    with pytest.raises(ValueError, match="before the newest"):
        table.apply_step([Move(9, 1, 0)], epoch=4)


def test_save_load_checks_fingerprint_and_corruption(tmp_path):
    table = RoutingTable.initial(FP, 2)
    table.apply_step([Move(11, 1, 0)], epoch=2)
    path = tmp_path / "routing.json"
    table.save(path)
    assert RoutingTable.load(path, FP).owners().tolist() == table.owners().tolist()
    assert not list(tmp_path.glob(".*tmp"))
    with pytest.raises(FingerprintMismatch, match="num_bins is 16, expected 32"):
        RoutingTable.load(path, Fingerprint("pipe", 32, "int64"))
    with pytest.raises(FingerprintMismatch, match="pipeline_id"):
        RoutingTable.load(path, Fingerprint("other", 16, "int64"))
    path.write_text(path.read_text()[:20])
    with pytest.raises(ValueError, match="corrupt"):
        RoutingTable.load(path, FP)


def test_owners_array_is_read_only():
    table = RoutingTable.initial(FP, 2)
    with pytest.raises(ValueError):
        table.owners()[0] = 5
    assert np.array_equal(table.owners(), np.arange(16) // 8)
