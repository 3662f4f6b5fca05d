"""DS2 and the deadline cost model read their times from SnailTrail traces (issue #18, item 4):
hand-built traces whose times differ from the metrics, with hand-computed answers; and a live
pipeline whose policies see the traces of the epochs they see the metrics of."""

from __future__ import annotations

import pytest

from megaphone.plans import make_plan
from megaphone.plans.cost_model import CostModel
from megaphone.plans.ds2 import rates_from_metrics
from megaphone.plans.policy import EpochView
from megaphone.records import EpochMetrics
from megaphone.routing.table import Move
from megaphone.snailtrail import Activity, Dependency, EpochTrace
from megaphone.snailtrail.usage import WorkerUsage, epoch_usage

DRIVER = None


def migration_trace(epoch: int = 3) -> EpochTrace:
    """Worker 0 exports bin 7 to worker 1 (1 s) and applies 2 s after a 1 s shuffle wait;
    worker 1 installs (0.5 s) and applies (4 s); the driver submits before and commits after."""
    return EpochTrace(epoch, [
        Activity(0, "submit", DRIVER, 0.0, 0.5),
        Activity(1, "schedule", 0, 0.5, 1.0),
        Activity(2, "begin", 0, 1.0, 1.25),
        Activity(3, "wait", 0, 1.25, 2.25),
        Activity(4, "apply", 0, 2.25, 4.25),
        Activity(5, "output", 0, 4.25, 4.5),
        Activity(6, "export", 0, 1.0, 2.0, bin=7, lane=1),
        Activity(7, "schedule", 1, 0.5, 1.0),
        Activity(8, "install", 1, 2.0, 2.5, bin=7),
        Activity(9, "apply", 1, 2.5, 6.5),
        Activity(10, "flush", 1, 6.5, 7.0),
        Activity(11, "commit", DRIVER, 7.0, 7.5),
    ], [Dependency(0, 1, "schedule"), Dependency(0, 7, "schedule"),
        Dependency(6, 8, "shuffle"), Dependency(10, 11)])


def test_usage_sums_each_workers_work_and_leaves_out_scheduling_and_waiting():
    usage = epoch_usage(migration_trace())
    assert set(usage) == {0, 1}  # the driver is no worker
    # worker 0: begin 0.25 + apply 2 + output 0.25 (the wait and the schedule are not work)
    assert usage[0] == WorkerUsage(useful_s=2.5, install_s=0.0, export_s=1.0, waited_s=1.0)
    # worker 1: install 0.5 + apply 4 + flush 0.5
    assert usage[1] == WorkerUsage(useful_s=5.0, install_s=0.5, export_s=0.0, waited_s=0.0)
    assert usage[1].processing_s == pytest.approx(4.5)
    assert epoch_usage(EpochTrace(0, [], [])) == {}


def record(epoch: int, per_worker: dict[str, dict], duration_s: float = 8.0,
           bytes_moved: int = 0) -> EpochMetrics:
    return EpochMetrics.from_dict({
        "epoch": epoch, "started": 0.0, "finished": duration_s, "duration_s": duration_s,
        "bytes_moved": bytes_moved, "per_worker": dict(per_worker)})


#: What the metrics say of epoch 3: each worker's useful time twice what its trace shows.
METRICS_3 = record(3, {"0": {"records_in": 100, "records_out": 10, "useful_s": 5.0,
                             "export_s": 2.0, "bytes_out": 1000},
                       "1": {"records_in": 900, "records_out": 90, "useful_s": 10.0,
                             "install_s": 1.0, "bytes_in": 1000}}, bytes_moved=1000)
METRICS_4 = record(4, {"0": {"records_in": 100, "records_out": 10, "useful_s": 1.0},
                       "1": {"records_in": 100, "records_out": 10, "useful_s": 1.0}}, 2.0)


def test_ds2_reads_useful_time_from_the_trace_where_there_is_one():
    from_metrics = rates_from_metrics([METRICS_3, METRICS_4])
    # worker 0: 200 records / (5 + 1) s; worker 1: 1000 / (10 + 1)
    assert from_metrics.processing_rate == pytest.approx(200 / 6 + 1000 / 11)
    traced = rates_from_metrics([METRICS_3, METRICS_4], [migration_trace(3)])
    # epoch 3's times from its trace (2.5 s and 5 s), epoch 4's (untraced) from the metrics
    assert traced.processing_rate == pytest.approx(200 / 3.5 + 1000 / 6)
    assert traced.useful_s == pytest.approx(3.5 + 6.0)
    assert (traced.records_in, traced.records_out) == (1200, 120)  # counts: the metrics'
    # a trace of an epoch outside the window changes nothing
    assert rates_from_metrics([METRICS_4], [migration_trace(3)]) == \
        rates_from_metrics([METRICS_4])


def test_the_cost_model_reads_export_install_and_processing_times_from_the_trace():
    from_metrics = CostModel.fit([METRICS_3], parallelism=2)
    assert from_metrics.epochs_traced == 0
    assert from_metrics.per_record_s[1] == pytest.approx((10.0 - 1.0) / 900)
    assert from_metrics.export_s_per_byte[0] == pytest.approx(2.0 / 1000)
    model = CostModel.fit([METRICS_3], parallelism=2, traces=[migration_trace(3)])
    assert model.epochs_traced == 1 and model.epochs_seen == 1
    assert model.per_record_s == pytest.approx({0: 2.5 / 100, 1: 4.5 / 900})
    assert model.export_s_per_byte == pytest.approx({0: 1.0 / 1000})
    assert model.install_s_per_byte == pytest.approx({1: 0.5 / 1000})
    # the epoch's length is the metrics' (8 s), its stages the trace's: export max(1, 1/2) = 1,
    # apply max(2.5, 5, 7.5/2) = 5; so 2 s outside them, none of it (one epoch) known as quiet
    assert model.overhead_s == pytest.approx(2.0)


def test_a_live_pipelines_policy_sees_the_traces_of_the_epochs_it_sees(spark, tmp_path):
    from megaphone import Pipeline

    views: list[EpochView] = []

    def policy(view: EpochView) -> list[Move]:
        views.append(view)
        return list(view.remaining) if len(views) >= 3 else []

    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                    num_bins=8)
    batch = spark.createDataFrame([(f"k{i % 13}",) for i in range(200)], "k string")
    pipe.process_arrow(batch)
    owner = int(pipe.routing.owners()[0])
    pipe.migrate(make_plan(pipe.routing, [Move(0, owner, 1 - owner)], "fluid"), policy=policy)
    for _ in range(4):
        pipe.process_arrow(batch)
    assert len(views) == 3
    for view in views:
        assert [t.epoch for t in view.traces] == [m.epoch for m in view.history]
        rates = rates_from_metrics(view.history, view.traces)
        # the trace's useful time is the workers' own marks: the metrics' up to clock reads
        assert rates.useful_s == pytest.approx(rates_from_metrics(view.history).useful_s,
                                               rel=0.05, abs=0.02)
    assert [t.epoch for t in pipe.trace_records()] == [m.epoch for m in pipe.metric_records()]
    pipe.close()
    reopened = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                        num_bins=8)
    assert [t.epoch for t in reopened.trace_records()] == list(range(5))
    reopened.close()
