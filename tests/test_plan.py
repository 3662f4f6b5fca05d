"""MigrationPlan: JSON round trip and every way a plan can be invalid."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import megaphone.plans
from megaphone.errors import MegaphoneError
from megaphone.plans.plan import MigrationPlan, PlanError, PlanStep
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move, RoutingTable

FP = Fingerprint("pipe", 16, "str")


def table() -> RoutingTable:
    return RoutingTable.initial(FP, 2)


def plan(*steps, base=0, epochs="relative", fp=FP) -> MigrationPlan:
    built = tuple(PlanStep(e, tuple(Move(*m) for m in ms)) for e, ms in steps)
    return MigrationPlan(fp, base, built, epochs)


@given(
    st.lists(
        st.tuples(st.integers(0, 100), st.lists(st.tuples(st.integers(0, 15), st.integers(0, 9),
                                                          st.integers(0, 9)), max_size=5)),
        max_size=5,
    ),
    st.sampled_from(["relative", "absolute"]),
)
def test_json_round_trip(steps, epochs):
    p = plan(*steps, epochs=epochs)
    assert MigrationPlan.from_json(p.to_json()) == p
    assert MigrationPlan.from_json(p.to_json(indent=2)).to_dict() == p.to_dict()


def test_valid_plan_passes_and_end_version():
    p = plan((0, [(0, 0, 2), (9, 1, 3)]), (2, [(0, 2, 1)]))
    p.validate(table())
    assert p.end_version == 2
    assert p.absolute_epochs(10) == [10, 12]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (plan((0, [(0, 0, 1)]), base=3), "stale plan: it starts from routing version 3"),
        (plan((0, [(16, 0, 1)])), r"step 0 \(epoch 0\): unknown bin 16"),
        (plan((0, [(2, -1, 1)])), r"step 0 \(epoch 0\), bin 2: negative source worker -1"),
        (plan((0, [(2, 5, 1)])), r"step 0 \(epoch 0\), bin 2: unknown source worker 5"),
        (plan((0, [(2, 0, 1)]), (1, [(2, 0, 1)])),
         r"step 1 \(epoch 1\), bin 2: source worker 0 is not the owner at that point"),
        (plan((0, [(11, 1, 0), (11, 1, 0)])), r"step 0 \(epoch 0\): bin 11 is moved twice"),
        (plan((0, []), (1, [(0, 0, 1)])), r"step 0 \(epoch 0\): moves no bin"),
        (plan((0, [(0, 0, 1)]), (1, [])), r"step 1 \(epoch 1\): moves no bin"),
        (plan(base=3), "stale plan: it starts from routing version 3"),  # empty, yet stale
        (plan(fp=Fingerprint("other", 16, "str")), "another pipeline"),
        (plan((2, []), (1, [])), "not after the previous step"),
        (plan((2, [(0, 0, 1)]), (2, [(9, 1, 0)])), "not after the previous step"),
        (plan((0, [(0, 0, 1)]), fp=Fingerprint("other", 16, "str")), "another pipeline"),
        (plan((0, [(0, 0, 5000)])), "destination worker 5000"),
        (plan((0, [(0, 0, 0)])), "to itself"),
    ],
)
def test_invalid_plans_are_rejected_with_their_own_message(bad, message):
    t = table()
    before = t.to_dict()
    with pytest.raises(PlanError, match=message):
        bad.validate(t)
    assert t.to_dict() == before


def test_absolute_epoch_in_the_past_is_stale():
    p = plan((3, [(0, 0, 1)]), epochs="absolute")
    with pytest.raises(PlanError, match="already passed"):
        p.validate(table(), next_epoch=4)
    p.validate(table(), next_epoch=3)


@pytest.mark.parametrize("steps", [(), ((0, []),), ((0, []), (1, []))])
def test_a_plan_that_moves_nothing_is_valid_and_ends_where_it_starts(steps):
    p = plan(*steps, base=0)
    assert p.empty and p.moves == [] and p.end_version == 0
    p.validate(table(), next_epoch=5)
    assert MigrationPlan.from_moves(table(), []).empty
    assert MigrationPlan.from_moves(table(), [[]]).empty
    assert not plan((0, [(0, 0, 1)])).empty


def with_(**fields) -> str:
    return json.dumps({**plan((0, [(0, 0, 1)])).to_dict(), **fields})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"format": "x"}', "plan format"),
        (json.dumps({**plan((0, [(0, 0, 1)])).to_dict(), "extra": 1}), "unknown fields"),
        (with_(steps=[{"epoch": "1", "moves": []}]),
         "step 0 epoch must be an integer"),
        (with_(steps=[{"epoch": 1, "moves": [[1, 2]]}]),
         r"must be \[bin, from_worker, to_worker\]"),
        (with_(base_version=True),
         "base_version must be an integer"),
        (json.dumps({**plan((0, [(0, 0, 1)])).to_dict(), "epochs": "sometimes"}), "epochs must be"),
    ],
)
def test_malformed_json_is_a_plan_error(text, message):
    with pytest.raises(PlanError, match=message):
        MigrationPlan.from_json(text)


def test_from_moves_spaces_steps_by_gap():
    p = MigrationPlan.from_moves(table(), [[Move(0, 0, 1)], [Move(9, 1, 0)]], gap=2)
    assert [s.epoch for s in p.steps] == [0, 3]
    p.validate(table())


def test_from_moves_takes_numpy_integers_and_refuses_other_numbers():
    import numpy as np

    owners = table().owners()  # numpy integers, as a script building moves would use them
    p = MigrationPlan.from_moves(table(), [[(np.int64(1), owners[1], np.int32(0))]])
    assert MigrationPlan.from_json(p.to_json()) == p  # plain ints: the JSON writes them
    assert all(type(v) is int for v in p.steps[0].moves[0])
    for bad in [(1.5, 0, 1), (1, "a", 0), (1, 0)]:
        with pytest.raises(PlanError, match="integers"):
            MigrationPlan.from_moves(table(), [[bad]])


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any level (TYPE_CHECKING blocks included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_plans_never_import_the_runtime_and_plan_not_the_policies():
    root = Path(megaphone.plans.__file__).parent
    for path in root.glob("*.py"):
        runtime = {n for n in _imported(path) if n.startswith("megaphone.migrator")}
        assert not runtime, f"{path.name} imports {sorted(runtime)}"
    assert not {n for n in _imported(root / "plan.py") if n.startswith("megaphone.plans.policy")}


def test_plan_error_is_a_megaphone_error_and_a_value_error():
    assert issubclass(PlanError, MegaphoneError) and issubclass(PlanError, ValueError)
