"""A plan with nothing to move (``rescale`` to the layout in place): accepted and done at once,
never queued nor written to the commit record, without disturbing a plan in flight; stale or
foreign empty plans are still refused."""

from __future__ import annotations

import uuid

import pytest

import megaphone
from megaphone import MigrationPlan, Move, Pipeline, PlanError, PlanStep
from megaphone.cli import main
from megaphone.plans.plan_queue import PlanQueue
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import RoutingTable

FP = Fingerprint("pipe", 16, "int64")


def assert_done_at_once(handle) -> None:
    p = handle.progress
    assert handle.done and handle.wait(0) and handle.error is None
    assert (p.steps_done, p.steps_total, p.bins_done, p.bins_total, p.epochs) == (0, 0, 0, 0, [])


@pytest.mark.parametrize("steps", [(), (PlanStep(0, ()),), (PlanStep(0, ()), PlanStep(3, ()))])
def test_the_queue_accepts_an_empty_plan_done_at_once_and_keeps_it_out(steps):
    queue = PlanQueue(RoutingTable.initial(FP, 2))
    handle = queue.submit(MigrationPlan(FP, 0, steps), next_epoch=4)
    assert_done_at_once(handle)
    assert queue.in_flight == [] and queue.to_list() == [] and queue.steps_due(4) == []
    assert queue.table.version == 0


def test_an_empty_plan_beside_a_plan_in_flight_leaves_it_alone():
    queue = PlanQueue(RoutingTable.initial(FP, 2))
    running = queue.submit(MigrationPlan.from_moves(queue.table, [[Move(0, 0, 1)],
                                                                  [Move(2, 0, 1)]]), 0)
    assert queue.steps_due(0) == [Move(0, 0, 1)]  # version 1 in force, the plan ends at 2
    saved = queue.to_list()
    for base in (1, 2):  # the version in force, or the one the plans in flight end at
        assert_done_at_once(queue.submit(MigrationPlan(FP, base, ()), 1))
    for base in (0, 3):
        with pytest.raises(PlanError, match="stale plan"):
            queue.submit(MigrationPlan(FP, base, ()), 1)
    with pytest.raises(PlanError, match="another pipeline"):
        queue.submit(MigrationPlan(Fingerprint("other", 16, "int64"), 1, ()), 1)
    assert queue.to_list() == saved and queue.in_flight == [running]
    queue.committed(0, {})
    assert queue.steps_due(1) == [Move(2, 0, 1)]
    queue.committed(1, {})
    assert running.done and running.progress.steps_done == 2


def test_an_empty_plan_is_accepted_behind_an_adaptive_plan():
    queue = PlanQueue(RoutingTable.initial(FP, 2))
    adaptive = MigrationPlan(FP, 0, (PlanStep(0, (Move(0, 0, 1),)),), policy={"name": "fluid"})
    queue.submit(adaptive, 0)
    assert_done_at_once(queue.submit(MigrationPlan(FP, 0, ()), 0))
    with pytest.raises(PlanError, match="an adaptive plan is in flight"):
        queue.submit(MigrationPlan.from_moves(queue.table, [[Move(1, 1, 0)]]), 0)


# -- on Spark ---------------------------------------------------------------------------------


def make(spark, tmp_path, **kw) -> Pipeline:
    return Pipeline(spark, str(tmp_path / "state"), key="k", update="count", num_bins=16,
                    key_type="int64", pipeline_id=uuid.uuid4().hex, **kw)


def feed(spark, pipe: Pipeline, keys) -> list:
    return sorted(map(tuple, pipe.process(spark.createDataFrame([(k,) for k in keys],
                                                                "k long")).collect()))


def test_rescale_to_the_current_size_is_done_at_once_and_the_pipeline_runs_on(spark, tmp_path,
                                                                              capsys):
    pipe = make(spark, tmp_path, workers=2)
    try:
        fresh = megaphone.rescale(pipe, workers=2)  # no state yet: the layout is balanced
        assert fresh.empty and fresh.steps == () and fresh.meta["bins_moved"] == 0
        assert_done_at_once(pipe.migrate(fresh))
        fresh.save(tmp_path / "empty.json")  # `megaphone migrate` hands it to this pipeline
        assert main(["migrate", str(tmp_path / "empty.json"), "--state-dir",
                     str(tmp_path / "state")]) == 0
        assert "nothing to move" in capsys.readouterr().out and pipe.in_flight == []
        assert feed(spark, pipe, [1, 2, 2]) == [(1, 1), (2, 2)]
        commit = pipe.state_dir.paths.commit.read_bytes()
        plan = megaphone.rescale(pipe, target=pipe.routing.owners().tolist())
        assert plan.empty and plan.meta["bins_moved"] == 0
        for handle in (pipe.migrate(plan), megaphone.migrate(plan),
                       pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[]]))):
            assert_done_at_once(handle)
        assert pipe.in_flight == [] and pipe.state_dir.paths.commit.read_bytes() == commit
        assert feed(spark, pipe, [1, 3]) == [(1, 2), (3, 1)]
        assert pipe.epoch == 1 and pipe.routing.version == 0
        assert pipe.state_dir.read_commit().plans == []
        # Beside a plan in flight: done at once, the other plan goes on undisturbed.
        running = pipe.migrate(MigrationPlan.from_moves(pipe.routing, [[Move(0, 0, 1)],
                                                                       [Move(2, 0, 1)]]))
        assert_done_at_once(pipe.migrate(MigrationPlan.from_moves(pipe.routing, [])))
        assert len(pipe.state_dir.read_commit().plans) == 1
        with pytest.raises(PlanError, match="stale plan"):
            pipe.migrate(MigrationPlan(pipe.fingerprint, 5, ()))
        feed(spark, pipe, [1])
        feed(spark, pipe, [2])
        assert running.done and running.progress.epochs == [2, 3]
        assert pipe.routing.owner(0) == 1 and pipe.routing.owner(2) == 1
        assert pipe.state_dir.read_commit().plans == []
    finally:
        pipe.close()


def test_offline_migrate_of_an_empty_plan_runs_no_epoch(spark, tmp_path):
    pipe = make(spark, tmp_path, workers=2)
    feed(spark, pipe, [1, 2])
    plan = MigrationPlan.from_moves(pipe.routing, [[], []])
    pipe.close()
    commit = (tmp_path / "state" / "commit.json").read_bytes()
    handle = megaphone.migrate(plan, state_dir=tmp_path / "state")
    assert_done_at_once(handle)
    assert (tmp_path / "state" / "commit.json").read_bytes() == commit
