"""RoutingTable: owners across many versions, moves, live workers, persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.routing.fingerprint import Fingerprint, FingerprintMismatch
from megaphone.routing.table import Move, RoutingTable

FP = Fingerprint("pipe", 16, "int64")


def test_initial_map_is_bin_mod_workers():
    table = RoutingTable.initial(FP, workers=3)
    assert [table.owner(b) for b in range(16)] == [b % 3 for b in range(16)]
    assert table.version == 0 and table.workers() == [0, 1, 2]


@st.composite
def histories(draw):
    """A random sequence of steps (scale out and in, moves back and forth) on 16 bins."""
    workers = draw(st.integers(1, 4))
    owners = [b % workers for b in range(16)]
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
    expected = {-1: [b % workers for b in range(16)]}
    for epoch, moves in steps:
        table.apply_step(moves, epoch)
    # Reference: replay steps in order; the owners at epoch e are after every step with epoch <= e.
    last_epoch = steps[-1][0] if steps else 0
    for e in range(last_epoch + 2):
        owners = [b % workers for b in range(16)]
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
    table.apply_step([Move(0, 0, 1), Move(1, 1, 0)], epoch=3)
    table.apply_step([Move(0, 1, 2)], epoch=4)
    assert table.moves_between(0, 2) == [Move(0, 0, 2), Move(1, 1, 0)]
    assert table.moves_at(3) == [Move(0, 0, 1), Move(1, 1, 0)]
    assert table.moves_at(4) == [Move(0, 1, 2)]
    assert table.moves_at(5) == []
    assert table.version_at(2) == 0 and table.version_at(3) == 1 and table.version_at(9) == 2


def test_scale_out_and_in_change_live_workers():
    table = RoutingTable.initial(FP, 2)
    table.apply_step([Move(b, b % 2, 2 + b % 2) for b in range(0, 16, 4)], epoch=1)
    assert table.workers() == [0, 1, 2]
    table.apply_step([Move(1, 1, 3)], epoch=1)
    assert table.workers() == [0, 1, 2, 3]
    table.apply_step([Move(b, 0, 1) for b in table.bins_of(0)], epoch=2)
    assert table.workers() == [1, 2, 3]
    assert table.workers(0) == [0, 1]


@pytest.mark.parametrize(
    ("moves", "message"),
    [
        ([Move(99, 0, 1)], "unknown bin 99"),
        ([Move(0, 1, 2)], "is not its owner"),
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
        table.apply_step([Move(1, 1, 0)], epoch=4)


def test_save_load_checks_fingerprint_and_corruption(tmp_path):
    table = RoutingTable.initial(FP, 2)
    table.apply_step([Move(3, 1, 0)], epoch=2)
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
    assert np.array_equal(table.owners(), np.arange(16) % 2)
