"""The DS2 controller: policy logic on a fake pipeline, then one short run on real Spark."""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

from megaphone import MigrationPlan, Pipeline
from megaphone.cli import main
from megaphone.migrator.control.ds2_controller import DS2Controller
from megaphone.plans.autoscale import Policy, input_span, select_window
from megaphone.plans.scale_decision import ScaleDecision, decide_once, explain
from megaphone.records import EpochMetrics, epoch_records

# -- a fake pipeline -------------------------------------------------------------------------


@dataclass
class FakeRouting:
    n: int
    num_bins: int = 64

    def workers(self) -> list[int]:
        return list(range(self.n))


@dataclass
class FakePlan:
    workers: int
    steps: list = field(default_factory=lambda: [object()])
    strategy: str = "fluid"
    meta: dict = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.steps


class FakePipe:
    """Metrics of a pipeline whose workers process ``1 / cost`` records per useful second.

    Epoch ``e`` covers the input interval ``[e, e + 1)`` seconds and finishes at
    ``e + 1 + duration``; every worker gets an equal share of ``rate`` records.
    """

    def __init__(self, workers: int, cost: float = 0.001) -> None:
        self.routing = FakeRouting(workers)
        self.cost = cost
        self.in_flight: list[Any] = []
        self.submitted: list[FakePlan] = []
        self._metrics: list[dict] = []

    def metrics(self) -> list[dict]:
        return list(self._metrics)

    def metric_records(self, last: int | None = None) -> list[EpochMetrics]:
        return list(epoch_records(self._metrics[-last:] if last else self._metrics))

    def trace_records(self, last: int | None = None) -> list:
        return []  # untraced: DS2 reads the metrics' useful time

    def migrate(self, plan: FakePlan) -> str:
        self.submitted.append(plan)
        self.in_flight.append(plan)
        return f"handle-{len(self.submitted)}"

    def run(self, epochs: int, rate: float, overhead: float = 0.0, moved: int = 0,
            event_time: bool = True) -> None:
        for _ in range(epochs):
            e = len(self._metrics)
            n = self.routing.n
            share = rate / n
            useful = share * self.cost
            per_worker = {str(w): {"records_in": share, "records_out": share / 2,
                                   "useful_s": useful,
                                   "max_event_time": (e + 1) * 1e6 if event_time else None}
                          for w in range(n)}
            self._metrics.append({
                "epoch": e, "started": e + 1.0, "finished": e + 1.0 + useful + overhead,
                "duration_s": useful + overhead, "records_in": rate, "records_out": rate / 2,
                "latency_s": useful + overhead, "bins_moved": moved, "workers": n,
                "per_worker": per_worker,
            })

    @property
    def now(self) -> float:
        return self._metrics[-1]["finished"]


def controller(pipe: FakePipe, **policy: Any) -> DS2Controller:
    policy.setdefault("warmup_epochs", 0)
    return DS2Controller(pipe, Policy(**policy), planner=lambda p, n: FakePlan(n))


# -- policy logic ----------------------------------------------------------------------------


def test_ds2_decision_waits_for_the_activation_period_then_submits_once():
    pipe = FakePipe(workers=2)  # 1000 records/s per worker
    ctl = controller(pipe, activation=2)
    pipe.run(3, rate=3500)
    first = ctl.step(pipe.now)
    assert first.action == "pending" and first.target == 4  # ceil(3500 / 1000)
    assert first.epochs == (0, 2) and first.source_rate == pytest.approx(3500)
    assert first.numbers["per_instance_rate"] == pytest.approx(1000)
    assert first.numbers["source"] == "event-time"
    assert "held 1/2 windows" in first.reason and not pipe.submitted
    pipe.run(3, rate=3500)
    second = ctl.step(pipe.now)
    assert second.action == "scale" and second.epochs == (3, 5)
    assert [p.workers for p in pipe.submitted] == [4]
    assert ctl.handles == ["handle-1"]
    assert second.plan == {"steps": 1, "strategy": "fluid"}


def test_activation_needs_identical_consecutive_decisions():
    pipe = FakePipe(workers=2)
    ctl = controller(pipe, activation=2)
    pipe.run(2, rate=3500)
    assert ctl.step(pipe.now).target == 4
    pipe.run(2, rate=5500)
    d = ctl.step(pipe.now)
    assert (d.action, d.target) == ("pending", 6)  # another count: the streak restarts
    pipe.run(2, rate=1800)
    assert ctl.step(pipe.now).action == "hold"  # back to 2: the streak is gone
    pipe.run(2, rate=5500)
    assert ctl.step(pipe.now).action == "pending"
    assert not pipe.submitted
    pipe.run(2, rate=5500)
    assert ctl.step(pipe.now).action == "scale"
    assert [p.workers for p in pipe.submitted] == [6]


def test_scale_down_by_exactly_one_is_ignored_but_by_two_is_not():
    pipe = FakePipe(workers=4)
    ctl = controller(pipe, activation=1)
    pipe.run(2, rate=2500)  # ceil(2.5) = 3: down by one
    d = ctl.step(pipe.now)
    assert (d.action, d.target, d.current) == ("ignore-down-by-one", 3, 4)
    assert not pipe.submitted
    pipe.run(2, rate=1500)  # 2: down by two
    assert ctl.step(pipe.now).action == "scale"
    assert [p.workers for p in pipe.submitted] == [2]
    # Without the rule a down-by-one is acted on.
    other = FakePipe(workers=4)
    ctl = controller(other, activation=1, ignore_down_by_one=False)
    other.run(2, rate=2500)
    assert ctl.step(other.now).action == "scale"


def test_nothing_is_submitted_while_a_plan_is_in_flight():
    pipe = FakePipe(workers=2)
    ctl = controller(pipe, activation=1)
    pipe.in_flight.append("someone else's plan")
    pipe.run(2, rate=5000)
    d = ctl.step(pipe.now)
    assert d.action == "in-flight" and not pipe.submitted
    pipe.in_flight.clear()
    pipe.run(2, rate=5000)
    d = ctl.step(pipe.now)
    assert d.action == "scale" and d.epochs == (2, 3)  # the in-flight window was used up
    pipe.run(2, rate=9000)
    assert ctl.step(pipe.now).action == "in-flight"  # its own plan is running now
    assert len(pipe.submitted) == 1


def test_a_plan_with_nothing_to_move_is_not_submitted():
    pipe = FakePipe(workers=2)
    ctl = DS2Controller(pipe, Policy(activation=1, warmup_epochs=0),
                        planner=lambda p, n: FakePlan(n, steps=[]))
    pipe.run(2, rate=3500)
    d = ctl.step(pipe.now)
    assert (d.action, d.target) == ("nothing-to-move", 4)
    assert not pipe.submitted and ctl.handles == []


def test_the_controller_skips_a_real_empty_plan(spark, tmp_path):
    """An empty :class:`MigrationPlan` from the planner (a layout already in place)."""
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                    num_bins=16, key_type="int64", pipeline_id=uuid.uuid4().hex)
    try:
        ctl = DS2Controller(pipe, Policy(activation=1, warmup_epochs=0),
                            planner=lambda p, n: MigrationPlan.from_moves(p.routing, [[]]))
        d = ctl._submit(ScaleDecision(time=0.0, action="scale", current=2, target=3))
        assert d.action == "nothing-to-move" and ctl.handles == [] and pipe.in_flight == []
    finally:
        pipe.close()


def test_warmup_epochs_after_a_rescale_are_left_out():
    pipe = FakePipe(workers=4)
    ctl = controller(pipe, activation=1, warmup_epochs=2)
    pipe.run(2, rate=1000, moved=3)  # epochs 0, 1 moved state (the last rescale)
    pipe.run(2, rate=20_000)  # epochs 2, 3: warm-up, their rate must not count
    d = ctl.step(pipe.now)
    assert d.action == "warmup" and d.skipped == 4 and not pipe.submitted
    pipe.run(2, rate=3800)
    d = ctl.step(pipe.now)
    assert (d.action, d.epochs, d.skipped, d.target) == ("hold", (4, 5), 0, 4)
    assert d.source_rate == pytest.approx(3800)


def test_warmup_seconds_after_a_rescale():
    pipe = FakePipe(workers=2)
    ctl = controller(pipe, activation=1, warmup_s=2.5)
    pipe.run(1, rate=1000, moved=1)  # finishes at ~1.5
    pipe.run(4, rate=1500)  # epochs 1..4 start at 2, 3, 4, 5: those before 4.0 are warm-up
    d = ctl.step(pipe.now)
    assert d.epochs == (3, 4) and d.skipped == 3


def test_step_only_sees_epochs_finished_by_now():
    pipe = FakePipe(workers=2)
    pipe.run(4, rate=1000)
    window = select_window(epoch_records(pipe.metrics()), after_epoch=0, now=3.9,
                           policy=Policy())
    assert [m.epoch for m in window.epochs] == [1, 2]
    assert window.previous.epoch == 0


def test_epoch_overhead_headroom_and_bounds():
    pipe = FakePipe(workers=2)
    pipe.run(3, rate=1800, overhead=0.25)  # a quarter of each 1 s interval is lost
    d = controller(pipe, activation=9).step(pipe.now)
    # demand = 1800 / (1 - 0.25) = 2400 -> ceil(2.4) = 3 (2 without the correction)
    assert d.numbers["overhead"] == pytest.approx(0.25)
    assert d.numbers["demand"] == pytest.approx(2400)
    assert d.target == 3
    assert controller(pipe, activation=9, epoch_overhead=False).step(pipe.now).target == 2
    d = controller(pipe, activation=9, headroom=1.0).step(pipe.now)
    assert d.numbers["demand"] == pytest.approx(4800) and d.target == 5
    d = controller(pipe, activation=9, headroom=1.0, max_workers=4).step(pipe.now)
    assert (d.proposed, d.target) == (5, 4)
    # (activation 9: these controllers only decide, nothing is submitted)
    low = FakePipe(workers=4)
    low.run(2, rate=100)
    d = controller(low, activation=1, min_workers=2).step(low.now)
    assert (d.proposed, d.target, d.action) == (1, 2, "scale")


def test_epoch_overhead_is_the_median_of_the_epochs_since_the_last_rescale():
    pipe = FakePipe(workers=2)
    pipe.run(5, rate=1000, overhead=0.4)  # before the rescale: not part of the measure
    pipe.run(1, rate=1000, moved=2)
    pipe.run(2, rate=1000, overhead=0.1)
    ctl = controller(pipe, activation=9)
    ctl.step(pipe.now)
    pipe.run(1, rate=1000, overhead=0.2)
    d = ctl.step(pipe.now)
    assert d.epochs == (8, 8)  # the window is the last epoch; the overhead uses 3 epochs
    assert d.numbers["overhead"] == pytest.approx(0.1)
    pipe.run(1, rate=1000, overhead=0.3)
    pipe.run(1, rate=1000, overhead=0.3)
    assert ctl.step(pipe.now).numbers["overhead"] == pytest.approx(0.2)  # median of 5
    # A controller started on a running pipeline does not measure the epochs before it.
    fresh = FakePipe(workers=2)
    fresh.run(3, rate=1000, overhead=0.45)  # e.g. a cold start
    started = controller(fresh, activation=9)
    started.start()
    started.stop()
    fresh.run(2, rate=1000, overhead=0.05)
    assert started.step(fresh.now).numbers["overhead"] == pytest.approx(0.05)


def test_source_rate_override_and_wall_time_fallback():
    pipe = FakePipe(workers=2)
    pipe.run(3, rate=1000, event_time=False)
    d = controller(pipe, activation=1).step(pipe.now)
    assert d.numbers["source"] == "wall-time"
    # epochs 1, 2 (epoch 0 marks the start): 2000 records over finished(2) - finished(0) = 2 s
    assert d.source_rate == pytest.approx(1000)
    seen = []
    ctl = DS2Controller(pipe, Policy(activation=1, warmup_epochs=0),
                        source_rate=lambda w: seen.append(len(w)) or 6000.0,
                        planner=lambda p, n: FakePlan(n))
    d = ctl.step(pipe.now)
    assert (d.numbers["source"], d.source_rate, d.target, seen) == ("given", 6000, 6, [3])
    records, epochs, seconds, method = input_span(select_window(epoch_records(pipe.metrics()),
                                                                1, 99, Policy()))
    assert (records, epochs, method) == (1000, 1, "wall-time") and seconds == pytest.approx(1)


def test_empty_and_unmeasurable_windows():
    pipe = FakePipe(workers=2)
    ctl = controller(pipe, activation=1)
    assert ctl.step(0.0).action == "no-data"
    pipe.run(2, rate=0)
    for m in pipe._metrics:
        for wm in m["per_worker"].values():
            wm["useful_s"] = 0.0
    d = ctl.step(pipe.now)
    assert d.action == "error" and "useful time" in d.reason


def test_decisions_are_logged_with_their_numbers(caplog):
    pipe = FakePipe(workers=2)
    ctl = controller(pipe, activation=1)
    pipe.run(3, rate=3500)
    with caplog.at_level(logging.DEBUG, logger="megaphone.autoscale"):
        ctl.step(pipe.now)
        pipe.run(2, rate=3500)
        ctl.step(pipe.now)
    lines = [r.getMessage() for r in caplog.records if r.name == "megaphone.autoscale"]
    assert lines[0].startswith("DS2Controller scale: 2 -> 4 workers; epochs 0..2")
    assert "source 3500.0 rec/s" in lines[0] and "per_instance_rate 1000.0" in lines[0]
    assert "ceil(3500.0 / 1000.0) = 4" in lines[0]
    assert lines[1].startswith("DS2Controller in-flight")
    assert [d.action for d in ctl.decisions] == ["scale", "in-flight"]
    record = ctl.decisions[0].to_dict()
    assert record["numbers"]["processing_rate"] == pytest.approx(2000)
    assert record["current"] == 2 and record["target"] == 4


def test_decide_once_on_a_record_and_explain():
    pipe = FakePipe(workers=2)
    pipe.run(20, rate=1500)
    pipe.run(5, rate=4200)
    policy = Policy(interval_s=3.0, warmup_epochs=0)
    d = decide_once(epoch_records(pipe.metrics()), 2, policy, num_bins=64)
    assert d.epochs == (22, 24) and d.action == "scale" and d.target == 5
    text = explain(d)
    assert "decision    scale: 2 -> 5 workers" in text
    assert "DS2         ceil(4200.0 / 1000.0) = 5 worker(s)" in text
    assert decide_once(epoch_records(pipe.metrics()), 2, policy, in_flight=1).action == \
        "in-flight"
    assert decide_once([], 2, policy).action == "no-data"


def test_ds2_sees_hosts_and_says_when_its_target_exceeds_their_slots():
    """2 -> 5 workers (the record above) against the hosts known: the hosts needed are
    counted over their slots; beyond the known slots the decision says the new workers would
    share cores, and bounds the target only when the policy asks it to."""
    pipe = FakePipe(workers=2)
    pipe.run(20, rate=1500)
    pipe.run(5, rate=4200)
    records = epoch_records(pipe.metrics())
    policy = Policy(interval_s=3.0, warmup_epochs=0)
    roomy = decide_once(records, 2, policy, hosts={"a": 4, "b": 4})
    assert (roomy.target, roomy.numbers["hosts_known"], roomy.numbers["slots_known"],
            roomy.numbers["hosts_needed"]) == (5, 2, 8, 2)
    assert "task slots" not in roomy.reason
    assert "hosts       2 known with 8 task slot(s); 5 workers need 2 host(s)" in explain(roomy)
    full = decide_once(records, 2, policy, hosts={"a": 2, "b": 1})
    assert full.action == "scale" and full.target == 5 and full.numbers["hosts_needed"] == 3
    assert "5 workers exceed the 3 task slots of the 2 known host(s): the new workers would " \
        "share cores, adding no capacity until a host joins (3 hosts needed)" in full.reason
    assert "capacity    5 workers exceed the 3 task slots" in explain(full)
    bound = decide_once(records, 2, replace(policy, bound_by_slots=True),
                        hosts={"a": 2, "b": 1})
    assert (bound.action, bound.target, bound.proposed) == ("scale", 3, 5)
    assert bound.reason.endswith("bounded to 3")
    # Never below the current count: already over the slots, bounding holds.
    over = decide_once(records, 4, replace(policy, bound_by_slots=True), hosts={"a": 3})
    assert (over.action, over.target, over.proposed) == ("hold", 4, 5)
    unknown = decide_once(records, 2, policy, hosts={"a": None, "b": 4})
    assert unknown.target == 5 and unknown.numbers["slots_known"] is None
    assert "task slots of the 2 known host(s) unknown" in unknown.reason
    assert "hosts       2 known, task slots unknown" in explain(unknown)
    assert "hosts_known" not in decide_once(records, 2, policy).numbers  # no hosts given


def test_the_thread_evaluates_every_interval():
    pipe = FakePipe(workers=2)
    pipe.run(2, rate=1500)
    ctl = DS2Controller(pipe, Policy(interval_s=0.05, warmup_epochs=0),
                        planner=lambda p, n: FakePlan(n), clock=lambda: 1e9)
    assert ctl.start() is ctl and ctl.running
    try:
        deadline = time.time() + 10
        while len(ctl.decisions) < 3 and time.time() < deadline:
            time.sleep(0.02)
    finally:
        ctl.stop()
    assert not ctl.running and len(ctl.decisions) >= 3
    assert ctl.decisions[0].action == "no-data"  # start() begins after the epochs it found


@pytest.mark.parametrize("bad", [
    {"interval_s": 0}, {"activation": 0}, {"min_workers": 3, "max_workers": 2},
    {"strategy": "sideways"}, {"balance": "vibes"}, {"headroom": -0.1},
])
def test_policy_checks_its_fields(bad):
    with pytest.raises(ValueError):
        Policy(**bad)


# -- one real run ------------------------------------------------------------------------------

COST_S = 0.002  # synthetic cost model: 2 ms of work per record

# Python workers cannot import this test module: ship slow_count by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def slow_count(key, values, state):
    """A count whose work is ``COST_S`` per record (sleeps, so workers run it in parallel)."""
    time.sleep(len(values) * COST_S)
    total = (state or 0) + len(values)
    return total, [str(total)]


def test_step_decides_and_submits_a_plan_that_completes_on_spark(spark, tmp_path, capsys):
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", value="v", update=slow_count,
                    workers=1, num_bins=16, key_type="int64", pipeline_id=uuid.uuid4().hex,
                    event_time="t")

    def feed(e: int, n: int = 100) -> None:
        batch = spark.range(e * n, (e + 1) * n, 1, 1).select(
            (F.col("id") % 50).alias("k"), F.lit(1).alias("v"),
            F.timestamp_seconds(F.lit(float(e + 1))).alias("t"))
        pipe.process(batch)

    try:
        for e in range(2):
            feed(e)
        # One worker sustains < 500 records/s (2 ms each); the source is 1500 records/s.
        code = main(["plan", "--ds2", "--state-dir", str(tmp_path / "state"), "--window", "1e6",
                     "--source-rate", "1500", "--strategy", "all-at-once",
                     "-o", str(tmp_path / "ds2.json")])
        out = capsys.readouterr().out
        assert code == 0 and "decision    scale: 1 -> " in out and "DS2         ceil(" in out
        slots = spark.sparkContext.defaultParallelism  # a local master: one host, its slots
        assert f"hosts       1 known with {slots} task slot(s)" in out
        assert (tmp_path / "ds2.json").exists()
        # Measured from the record: 100 records per 1 s of event time.
        code = main(["plan", "--ds2", "--state-dir", str(tmp_path / "state"), "--window", "1e6",
                     "--json"])
        shown = json.loads(capsys.readouterr().out)
        assert code == 0 and shown["numbers"]["source"] == "event-time"
        assert shown["source_rate"] == pytest.approx(100.0) and shown["current"] == 1
        assert (shown["numbers"]["hosts_known"], shown["numbers"]["slots_known"]) == (1, slots)

        policy = Policy(activation=1, warmup_epochs=0, max_workers=3, strategy="all-at-once")
        ctl = DS2Controller(pipe, policy, source_rate=1500.0)
        decision = ctl.step()
        assert decision.action == "scale", decision
        assert decision.target == 3 and decision.numbers["per_instance_rate"] < 500
        assert decision.numbers["hosts_known"] == 1  # the controller reads the pipeline's
        handle = ctl.handles[0]
        feed(2)  # all at once: the plan's one step runs in this epoch
        assert handle.wait(0) and pipe.routing.workers() == [0, 1, 2]
        moving = [m for m in pipe.metrics() if m["bins_moved"]]
        assert [m["epoch"] for m in moving] == [2] and moving[0]["records_out"] > 0
        assert ctl.step().action == "warmup"  # only the epoch that moved state
        feed(3)
        after = ctl.step()
        assert (after.action, after.current, after.epochs) == ("hold", 3, (3, 3))
        auto = pipe.autoscale(Policy(interval_s=60))  # the Pipeline entry point
        assert isinstance(auto, DS2Controller) and auto.running
        auto.stop()
        assert not auto.running
    finally:
        pipe.close()
