"""SnailTrail's core: trace records, the program activity graph (PAG) of a window, and critical
participation CP(a) = N_a * w_a / (N * (t_e - t_s)) by path counting.

The hand-built cases spell out their arithmetic: forward counts f (paths from a source into a
vertex), backward counts b (paths from a vertex to a sink), N = sum of f over the sinks, and
N_a = f(start of a) * b(end of a). In every case sum(N_a * w_a) = N * (t_e - t_s), so the CPs
sum to 1. Pure Python, no Spark.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.snailtrail import (
    COMM,
    GAP,
    LINK,
    RECORDED,
    Activity,
    CriticalReport,
    Dependency,
    EpochTrace,
    analyze,
    build_pag,
    clip,
    count_paths,
    critical_participation,
    trace_span,
)

DRIVER = None


def _label(edge) -> str:
    span = f"[{edge.start:g},{edge.end:g}]"
    if edge.role == COMM:
        return f"{edge.kind} {edge.sender[0]}->{edge.worker} {span}"
    return f"{edge.kind} {edge.worker} {span}" + (" gap" if edge.role == GAP else "")


def table(report: CriticalReport) -> dict[str, int]:
    """N_a of every reported edge, by a readable label."""
    labels = [_label(item.edge) for item in report.items]
    assert len(set(labels)) == len(labels)
    return {_label(item.edge): item.paths for item in report.items}


def assert_cp(report: CriticalReport, expected: dict[str, tuple[int, float]]) -> None:
    """Every item's N_a and CP equal the hand-computed (N_a, w_a); CP = N_a*w_a/(N*span)."""
    assert table(report) == {label: n_a for label, (n_a, _) in expected.items()}
    span = report.t_e - report.t_s
    for item in report.items:
        n_a, w_a = expected[_label(item.edge)]
        assert item.edge.weight == pytest.approx(w_a)
        assert item.cp == pytest.approx(n_a * w_a / (report.paths * span), rel=1e-12)
    assert report.total() == pytest.approx(1.0)


# --- hand-built graphs --------------------------------------------------------------------


def test_a_single_chain_has_one_path_and_cp_is_each_share_of_the_window():
    trace = EpochTrace(0, [Activity(1, "apply", 0, 0.0, 4.0), Activity(2, "commit", 0, 6.0, 10.0)])
    report = analyze([trace], 0.0, 10.0)
    # one timeline: source -link- apply [0,4] - wait [4,6] - commit [6,10] -link- sink
    # N = 1, each N_a = 1, CP = w_a / 10
    assert report.paths == 1
    assert_cp(report, {"apply 0 [0,4]": (1, 4), "wait 0 [4,6] gap": (1, 2),
                       "commit 0 [6,10]": (1, 4)})
    assert [i.cp for i in report.items] == pytest.approx([0.4, 0.2, 0.4])


def barrier_trace() -> EpochTrace:
    """The driver submits, two workers apply (worker 1 slower), the driver commits after both."""
    return EpochTrace(3, [
        Activity(0, "submit", DRIVER, 0, 1), Activity(3, "commit", DRIVER, 8, 10),
        Activity(1, "apply", 0, 2, 5), Activity(2, "apply", 1, 2, 8),
    ], [Dependency(0, 1, "schedule"), Dependency(0, 2, "schedule"), Dependency(1, 3),
        Dependency(2, 3)])


def test_two_workers_joined_at_a_barrier():
    report = analyze([barrier_trace()], 0, 10)
    # driver: Sd -link- submit.s -submit- submit.e -wait [1,8]- commit.s -commit- commit.e -link- Td
    # worker i: Si -wait [0,2]- apply_i.s -apply_i- apply_i.e -wait- Ti
    # comm: submit.e -> apply_0.s, apply_1.s (schedule, 1 s); apply_0.e -> commit.s (3 s);
    #       apply_1.e -> commit.s (0 s)
    # forward:  submit.s = submit.e = 1; apply_i.s = apply_i.e = 1 (Si) + 1 (submit.e) = 2;
    #           commit.s = commit.e = Td = 1 (wait) + 2 + 2 = 5; T0 = T1 = 2  ->  N = 5 + 2 + 2 = 9
    # backward: commit.s = 1; apply_i.e = apply_i.s = Si = 1 (Ti) + 1 (commit.s) = 2;
    #           submit.e = Sd = 1 (wait) + 2 + 2 = 5  ->  N = 5 + 2 + 2 = 9 as well
    assert report.paths == 9
    assert_cp(report, {
        "submit None [0,1]": (1 * 5, 1),        # N_a * w_a = 5
        "wait None [1,8] gap": (1 * 1, 7),      # 7
        "commit None [8,10]": (5 * 1, 2),       # 10
        "apply 0 [2,5]": (2 * 2, 3),            # 12
        "apply 1 [2,8]": (2 * 2, 6),            # 24: the straggler
        "wait 0 [0,2] gap": (1 * 2, 2),         # 4
        "wait 0 [5,10] gap": (2 * 1, 5),        # 10
        "wait 1 [0,2] gap": (1 * 2, 2),         # 4
        "wait 1 [8,10] gap": (2 * 1, 2),        # 4
        "schedule None->0 [1,2]": (1 * 2, 1),   # 2
        "schedule None->1 [1,2]": (1 * 2, 1),   # 2
        "comm 0->None [5,8]": (2 * 1, 3),       # 6
        "comm 1->None [8,8]": (2 * 1, 0),       # 0
    })  # sum = 5+7+10+12+24+4+10+4+4+2+2+6+0 = 90 = N * (t_e - t_s) = 9 * 10
    # by worker, communication left out: driver 5+7+10, worker 0 12+4+10, worker 1 24+4+4
    assert report.by_worker() == pytest.approx({DRIVER: 22 / 90, 0: 26 / 90, 1: 32 / 90})
    assert list(report.by_worker()) == [1, 0, DRIVER]
    # stragglers: work only (waits excluded): worker 1's apply counts twice worker 0's
    assert report.by_worker(exclude_kinds=("wait",)) == pytest.approx(
        {1: 24 / 90, DRIVER: 15 / 90, 0: 12 / 90})
    assert report.by_channel() == pytest.approx(
        {(0, DRIVER): 6 / 90, (DRIVER, 0): 2 / 90, (DRIVER, 1): 2 / 90, (1, DRIVER): 0.0})
    assert report.by_kind() == pytest.approx({"apply": 36 / 90, "wait": 29 / 90,
                                              "commit": 10 / 90, "comm": 6 / 90,
                                              "submit": 5 / 90, "schedule": 4 / 90})
    assert report.by_bin() == {}


def test_several_critical_paths_tie():
    trace = EpochTrace(0, [Activity(0, "submit", DRIVER, 0, 1), Activity(4, "commit", DRIVER, 5, 6)]
                       + [Activity(w + 1, "apply", w, 1, 5) for w in range(3)],
                       [Dependency(0, w + 1, "schedule") for w in range(3)]
                       + [Dependency(w + 1, 4) for w in range(3)])
    report = analyze([trace], 0, 6)
    # three critical paths, submit -> apply_w -> commit, each 6 s of work with no wait.
    # forward: submit.e = 1; apply_w.s = apply_w.e = 1 (Sw) + 1 = 2;
    #          commit.s = 1 (driver's wait) + 3 * 2 = 7 = Td; Tw = 2  ->  N = 7 + 3 * 2 = 13
    # backward: apply_w.e = 1 (Tw) + 1 (commit.s) = 2 = apply_w.s = Sw; submit.e = 1 + 3 * 2 = 7
    assert report.paths == 13
    expected = {
        "submit None [0,1]": (1 * 7, 1),        # 7
        "wait None [1,5] gap": (1 * 1, 4),      # 4
        "commit None [5,6]": (7 * 1, 1),        # 7
    }
    for w in range(3):
        expected |= {
            f"apply {w} [1,5]": (2 * 2, 4),     # 16 each
            f"wait {w} [0,1] gap": (1 * 2, 1),  # 2
            f"wait {w} [5,6] gap": (2 * 1, 1),  # 2
            f"schedule None->{w} [1,1]": (1 * 2, 0),
            f"comm {w}->None [5,5]": (2 * 1, 0),
        }
    assert_cp(report, expected)  # 7 + 4 + 7 + 3 * (16 + 2 + 2) = 78 = 13 * 6
    top = report.top(3)
    assert {i.edge.kind for i in top} == {"apply"} and {i.edge.worker for i in top} == {0, 1, 2}
    assert len({i.cp for i in top}) == 1 and top[0].cp == pytest.approx(16 / 78)
    assert report.by_worker(exclude_kinds=("wait",)) == pytest.approx(
        {0: 16 / 78, 1: 16 / 78, 2: 16 / 78, DRIVER: 14 / 78})


def test_gaps_become_waits_and_touching_activities_are_linked():
    trace = EpochTrace(0, [Activity(1, "export", 0, 1, 2, bin=4), Activity(2, "install", 0, 2, 3),
                           Activity(3, "wait", 0, 3, 4), Activity(4, "apply", 0, 5, 7)])
    pag = build_pag([trace], 0, 10)
    line = [(e.role, e.kind, e.start, e.end) for e in pag.edges]
    assert line == [(GAP, "wait", 0, 1), (RECORDED, "export", 1, 2), (LINK, LINK, 2, 2),
                    (RECORDED, "install", 2, 3), (LINK, LINK, 3, 3), (RECORDED, "wait", 3, 4),
                    (GAP, "wait", 4, 5), (RECORDED, "apply", 5, 7), (GAP, "wait", 7, 10)]
    assert [pag.times[v] for v in pag.sources + pag.sinks] == [0, 10]
    report = critical_participation(pag)
    # one path, N = 1: waits are 1 + 1 + 3 (gaps) + 1 (recorded) = 6 of the window's 10 s
    assert report.paths == 1 and len(report.items) == 7  # links are not reported
    assert report.by_kind() == pytest.approx({"wait": 0.6, "apply": 0.2, "export": 0.1,
                                              "install": 0.1})
    assert report.by_bin() == pytest.approx({4: 0.1})


def test_clipping_to_the_window():
    trace = EpochTrace(0, [
        Activity(1, "apply", 0, -2, 3), Activity(2, "export", 0, 8, 15),  # cut to [0,3], [8,10]
        Activity(3, "commit", DRIVER, 11, 12),                              # outside: left out
        Activity(4, "install", 1, 4, 6)],
        [Dependency(1, 4, "shuffle"), Dependency(4, 3)])                    # 4 -> 3 left out
    report = analyze([trace], 0, 10)
    assert build_pag([trace], 0, 10).timelines == ((0, 0), (1, 0))  # the driver had nothing
    # w0: S0 -link- a1 [0,3] -wait [3,8]- a2 [8,10] -link- T0;  w1: S1 -wait [0,4]- a4 -wait- T1
    # shuffle a1.e (3) -> a4.s (4)
    # forward: a1 = a2 = T0 = 1; a4.s = 1 (S1) + 1 (a1.e) = 2 = T1  ->  N = 1 + 2 = 3
    # backward: a4 = 1; a2 = 1; a1.e = 1 (wait) + 1 (shuffle) = 2 = S0; S1 = 1  ->  N = 2 + 1 = 3
    assert report.paths == 3
    assert_cp(report, {
        "apply 0 [0,3]": (1 * 2, 3),          # 6
        "wait 0 [3,8] gap": (1 * 1, 5),       # 5
        "export 0 [8,10]": (1 * 1, 2),        # 2
        "shuffle 0->1 [3,4]": (1 * 1, 1),     # 1
        "wait 1 [0,4] gap": (1 * 1, 4),       # 4
        "install 1 [4,6]": (2 * 1, 2),        # 4
        "wait 1 [6,10] gap": (2 * 1, 4),      # 8
    })  # 6+5+2+1+4+4+8 = 30 = 3 * 10


def test_clip_keeps_instants_on_the_boundary_and_drops_intervals_that_only_touch():
    assert clip(Activity(0, "apply", 0, 2, 5), 5, 10) is None
    assert clip(Activity(0, "apply", 0, 10, 12), 5, 10) is None
    assert clip(Activity(0, "commit", 0, 5, 5), 5, 10) == Activity(0, "commit", 0, 5, 5)
    assert clip(Activity(0, "commit", 0, 10, 10), 5, 10) is not None
    assert clip(Activity(0, "apply", 0, 4, 11), 5, 10) == Activity(0, "apply", 0, 5, 10)


def test_summaries_by_kind_worker_and_bin_of_a_migration():
    trace = EpochTrace(1, [
        Activity(0, "layout", DRIVER, 0, 1), Activity(1, "export", 0, 1, 3, bin=7),
        Activity(2, "install", 1, 4, 5, bin=7), Activity(3, "apply", 1, 5, 8)],
        [Dependency(0, 1), Dependency(1, 2, "shuffle")])
    report = analyze([trace], 0, 8)
    # forward: layout.e = 1; export.s = 1 (S0) + 1 = 2; install.s = 1 (S1) + 2 = 3 = apply = T1;
    #          Td = 1, T0 = 2  ->  N = 1 + 2 + 3 = 6
    # backward: install.s = apply = 1; export.e = 1 (T0) + 1 = 2; layout.e = 1 (Td) + 2 = 3
    assert report.paths == 6
    assert_cp(report, {
        "layout None [0,1]": (1 * 3, 1),      # 3
        "wait None [1,8] gap": (1 * 1, 7),    # 7
        "comm None->0 [1,1]": (1 * 2, 0),     # 0
        "wait 0 [0,1] gap": (1 * 2, 1),       # 2
        "export 0 [1,3]": (2 * 2, 2),         # 8
        "wait 0 [3,8] gap": (2 * 1, 5),       # 10
        "shuffle 0->1 [3,4]": (2 * 1, 1),     # 2 (bin 7: both ends are bin 7)
        "wait 1 [0,4] gap": (1 * 1, 4),       # 4
        "install 1 [4,5]": (3 * 1, 1),        # 3
        "apply 1 [5,8]": (3 * 1, 3),          # 9
    })  # 3+7+0+2+8+10+2+4+3+9 = 48 = 6 * 8
    assert report.by_bin() == pytest.approx({7: (8 + 2 + 3) / 48})
    assert report.by_kind() == pytest.approx({"wait": 23 / 48, "apply": 9 / 48, "export": 8 / 48,
                                              "layout": 3 / 48, "install": 3 / 48,
                                              "shuffle": 2 / 48, "comm": 0.0})
    assert list(report.by_kind())[:2] == ["wait", "apply"]
    assert report.by_worker() == pytest.approx({0: 20 / 48, 1: 16 / 48, DRIVER: 10 / 48})
    assert report.by_channel() == pytest.approx({(0, 1): 2 / 48, (DRIVER, 0): 0.0})


def test_a_window_over_two_epochs_joins_their_timelines():
    first = EpochTrace(1, [Activity(0, "apply", 0, 0, 3), Activity(1, "commit", DRIVER, 3, 4)],
                       [Dependency(0, 1)])
    second = EpochTrace(2, [Activity(0, "submit", DRIVER, 4, 5), Activity(1, "apply", 0, 6, 9)],
                        [Dependency(0, 1, "schedule")])  # the same ids, another epoch
    report = analyze([second, first], 0, 10)
    # driver: Sd -wait [0,3]- commit [3,4] -link- submit [4,5] -wait [5,10]- Td
    # w0: S0 -link- apply1 [0,3] -wait [3,6]- apply2 [6,9] -wait [9,10]- T0
    # comm apply1.e -> commit.s (0 s); schedule submit.e -> apply2.s (1 s)
    # forward: apply1 = 1; commit.s = 1 + 1 = 2 = submit = Td; apply2.s = 1 + 2 = 3 = T0 -> N = 5
    # backward: apply2 = 1; submit.e = 1 + 1 = 2 = commit; apply1.e = 1 + 2 = 3 = S0; Sd = 2
    assert report.paths == 5
    assert_cp(report, {
        "wait None [0,3] gap": (1 * 2, 3),    # 6
        "commit None [3,4]": (2 * 2, 1),      # 4
        "submit None [4,5]": (2 * 2, 1),      # 4
        "wait None [5,10] gap": (2 * 1, 5),   # 10
        "apply 0 [0,3]": (1 * 3, 3),          # 9
        "wait 0 [3,6] gap": (1 * 1, 3),       # 3
        "apply 0 [6,9]": (3 * 1, 3),          # 9
        "wait 0 [9,10] gap": (3 * 1, 1),      # 3
        "comm 0->None [3,3]": (1 * 2, 0),     # 0
        "schedule None->0 [5,6]": (2 * 1, 1),  # 2
    })  # 6+4+4+10+9+3+9+3+0+2 = 50 = 5 * 10
    assert sorted(i.edge.epoch for i in report.items if i.edge.kind == "apply") == [1, 2]


def test_lanes_are_timelines_of_their_own_and_add_up_by_worker():
    trace = EpochTrace(0, [Activity(0, "apply", 0, 0, 4), Activity(1, "flush", 0, 1, 3, lane=1)])
    report = analyze([trace], 0, 4)
    # two timelines, one path each: N = 2; CP = w_a / (2 * 4)
    assert report.paths == 2
    assert sorted((i.edge.lane, i.edge.kind, i.cp) for i in report.items) == [
        (0, "apply", 0.5), (1, "flush", 0.25), (1, "wait", 0.125), (1, "wait", 0.125)]
    assert report.by_worker() == pytest.approx({0: 1.0})


def test_path_counts_stay_exact_beyond_64_bits():
    rounds = 80
    acts = [Activity(2 * k + w, "apply", w, 2 * k, 2 * k + 1) for k in range(rounds)
            for w in (0, 1)]
    deps = [Dependency(2 * k + w, 2 * (k + 1) + 1 - w, "shuffle") for k in range(rounds - 1)
            for w in (0, 1)]
    report = analyze([EpochTrace(0, acts, deps)], 0, 2 * rounds)
    # every round's start gets its own timeline's paths and the other's: f doubles each round,
    # f(round k) = 2**k on both, N = 2 * 2**(rounds - 1)
    assert report.paths == 2**rounds and isinstance(report.paths, int)
    assert report.total() == pytest.approx(1.0)


def test_a_dependency_within_one_timeline_adds_no_edge():
    trace = EpochTrace(0, [Activity(1, "export", 0, 0, 1), Activity(2, "install", 0, 2, 3)],
                       [Dependency(1, 2, "shuffle")])
    pag = build_pag([trace], 0, 3)
    assert all(e.role != COMM for e in pag.edges)
    assert critical_participation(pag).paths == 1


def test_an_empty_window_has_no_path_and_no_item():
    report = analyze([barrier_trace()], 20, 30)
    assert (report.paths, report.items, report.total(), report.by_kind()) == (0, (), 0, {})


@pytest.mark.parametrize("window", [(1, 1), (2, 1), (0, math.nan), (0, math.inf), ("0", 1)])
def test_a_bad_window_is_refused(window):
    with pytest.raises(ValueError, match=r"t_s|t_e|window"):
        build_pag([barrier_trace()], *window)


def test_epochs_twice_or_overlapping_on_a_timeline_are_refused():
    with pytest.raises(ValueError, match="epoch 3 is traced twice"):
        build_pag([barrier_trace(), barrier_trace()], 0, 10)
    other = EpochTrace(4, [Activity(0, "apply", 1, 7, 9)])  # worker 1 applies [2,8] in epoch 3
    with pytest.raises(ValueError, match=r"overlap on timeline \(1, 0\)"):
        build_pag([barrier_trace(), other], 0, 10)


def test_trace_span_covers_every_activity():
    assert trace_span([barrier_trace(), EpochTrace(4, [Activity(0, "apply", 1, 9, 12)])]) == (0, 12)
    with pytest.raises(ValueError, match="no activity"):
        trace_span([EpochTrace(0, [])])


def test_count_paths_refuses_a_cycle():
    with pytest.raises(ValueError, match="cycle"):
        count_paths(3, [(0, 1), (1, 2), (2, 1)], [0], [2])


# --- records and their serialized form ----------------------------------------------------


def rich_trace() -> EpochTrace:
    """Every field used: the driver, lanes, bins, zero-length and awkward float times."""
    return EpochTrace(12, [
        Activity(8, "commit", DRIVER, 500.0, 500.0 + 1e-9),
        Activity(0, "admit", DRIVER, 0.1, 0.1 + 0.2),
        Activity(1, "layout", DRIVER, 0.1 + 0.2, 0.5),
        Activity(2, "submit", DRIVER, 0.5, 0.5),
        Activity(3, "export", 0, 2 / 3, 1.0, bin=5),
        Activity(4, "flush", 0, 0.7, 0.9, lane=1),
        Activity(5, "install", 1, 1.25, 1.5, bin=5),
        Activity(6, "apply", 1, 1.5, 1e3 / 3),
        Activity(7, "output", 1, 1e3 / 3, 400),
        Activity(9, "other", 2, 5e-324, 1.7e9 + 0.123456789),
    ], [Dependency(2, 3, "schedule"), Dependency(2, 4, "schedule"), Dependency(3, 5, "shuffle"),
        Dependency(7, 8), Dependency(4, 8)])


def test_a_trace_round_trips_exactly_through_json():
    trace = rich_trace()
    assert all(a.epoch == 12 for a in trace.activities)  # filled in from the trace
    back = EpochTrace.from_json(trace.to_json())
    assert back == trace
    assert [a.start.hex() for a in back.activities] == [a.start.hex() for a in trace.activities]
    assert [a.end.hex() for a in back.activities] == [a.end.hex() for a in trace.activities]
    assert EpochTrace.from_dict(json.loads(json.dumps(trace.to_dict()))) == trace
    stored = trace.to_dict()  # columns: each field name once, the epoch once
    assert set(stored) == {"format", "epoch", "activities", "dependencies"}
    assert stored["activities"]["id"] == [8, 0, 1, 2, 3, 4, 5, 6, 7, 9]
    assert trace.to_json().count('"start"') == 1 and trace.to_json().count('"epoch"') == 1
    empty = EpochTrace(0, [])
    assert EpochTrace.from_json(empty.to_json()) == empty


def test_records_refuse_another_epoch_and_foreign_objects():
    with pytest.raises(ValueError, match="is of epoch 2, not 1"):
        EpochTrace(1, [Activity(0, "apply", 0, 0, 1, epoch=2)])
    with pytest.raises(ValueError, match="Activity records"):
        EpochTrace(1, [{"id": 0}])
    with pytest.raises(ValueError, match="Dependency records"):
        EpochTrace(1, [Activity(0, "apply", 0, 0, 1)], [(0, 1)])


def _good() -> dict:
    return EpochTrace(2, [Activity(0, "submit", DRIVER, 0, 1), Activity(1, "apply", 0, 1, 3),
                          Activity(2, "apply", 0, 3, 4)],
                      [Dependency(0, 1, "schedule")]).to_dict()


def _set(path: str, value):
    """A mutation of the good trace's dict: put ``value`` at ``path`` (``a/b/index``)."""
    def mutate(d):
        *parents, last = path.split("/")
        for p in parents:
            d = d[int(p)] if isinstance(d, list) else d[p]
        if isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value
    return mutate


def _drop(path: str):
    def mutate(d):
        *parents, last = path.split("/")
        for p in parents:
            d = d[p]
        del d[last]
    return mutate


MALFORMED = [
    (_set("format", "megaphone.snailtrail.trace/2"), "unknown trace format"),
    (_drop("epoch"), "trace keys must be"),
    (_set("extra", 1), "trace keys must be"),
    (_set("epoch", "2"), "epoch must be a non-negative int"),
    (_set("epoch", -1), "epoch must be a non-negative int"),
    (_set("activities", [[0, "submit"]]), "activities must be a dict of columns"),
    (_drop("activities/bin"), r"missing \['bin'\]"),
    (_set("activities/color", [1, 2, 3]), r"unknown \['color'\]"),
    (_set("activities/start", "0,1,3"), "activities.start must be a list"),
    (lambda d: d["activities"]["end"].append(5), "differ in length"),
    (_set("activities/kind/1", "nap"), r"activities\[1\]: kind must be one of"),
    (_set("activities/kind/1", "link"), r"activities\[1\]: kind must be one of"),
    (_set("activities/end/1", 0.5), r"activities\[1\]: activity 1 ends \(0.5\) before"),
    (_set("activities/start/0", "0"), r"activities\[0\]: start must be a number"),
    (_set("activities/start/0", math.nan), r"activities\[0\]: start must be finite"),
    (_set("activities/end/2", math.inf), r"activities\[2\]: end must be finite"),
    (_set("activities/start/0", 10**400), r"activities\[0\]: start is out of range"),
    (_set("activities/worker/1", True), r"activities\[1\]: worker must be"),
    (_set("activities/worker/1", -1), r"activities\[1\]: worker must be"),
    (_set("activities/bin/1", 1.5), r"activities\[1\]: bin must be"),
    (_set("activities/lane/0", None), r"activities\[0\]: lane must be"),
    (_set("activities/id/2", 1), "activity id 1 appears twice"),
    (_set("dependencies", None), "dependencies must be a dict of columns"),
    (_set("dependencies/src/0", 9), "names unknown activity 9"),
    (_set("dependencies/dst/0", 0), r"dependencies\[0\]: activity 0 cannot depend on itself"),
    (_set("dependencies/kind/0", "telepathy"), r"dependencies\[0\]: dependency kind"),
    (lambda d: d["dependencies"].update(src=[2], dst=[1], kind=["comm"]),
     r"activity 1 starts at 1.0, before activity 2 it depends on ends \(4.0\)"),
    (lambda d: d["dependencies"].update(src=[0, 0], dst=[1, 1], kind=["comm", "schedule"]),
     "dependency 0 -> 1 twice"),
    (_set("activities/start/2", 2.5), r"activities 1 and 2 overlap on timeline \(0, 0\)"),
]


@pytest.mark.parametrize(("mutate", "message"), MALFORMED)
def test_malformed_input_is_refused_with_a_clear_value_error(mutate, message):
    data = _good()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        EpochTrace.from_dict(data)


@pytest.mark.parametrize("text", ["", "{", "[]", '"trace"', "null"])
def test_bad_json_is_a_value_error(text):
    with pytest.raises(ValueError):
        EpochTrace.from_json(text)


def test_nan_in_json_text_is_refused():
    data = _good()
    data["activities"]["end"][0] = math.nan
    with pytest.raises(ValueError, match="finite"):
        EpochTrace.from_json(json.dumps(data))


def test_a_cycle_among_instants_is_refused():
    with pytest.raises(ValueError, match="cycle"):  # two instants, each waiting for the other
        EpochTrace(0, [Activity(0, "commit", DRIVER, 5, 5), Activity(1, "commit", 0, 5, 5)],
                   [Dependency(0, 1), Dependency(1, 0)])
    with pytest.raises(ValueError, match="cycle"):  # the driver's order 0 then 1 closes it
        EpochTrace(0, [Activity(0, "commit", DRIVER, 5, 5), Activity(1, "output", DRIVER, 5, 5),
                       Activity(2, "apply", 0, 5, 5)], [Dependency(1, 2), Dependency(2, 0)])


# --- properties -----------------------------------------------------------------------------


def enumerate_paths(edges, sources, sinks) -> list[tuple[int, ...]]:
    """Every path (as edge indices) from a source to a sink, by brute force: tests only."""
    out: dict[int, list[tuple[int, int]]] = {}
    for i, (u, v) in enumerate(edges):
        out.setdefault(u, []).append((i, v))
    paths: list[tuple[int, ...]] = []

    def walk(v: int, path: tuple[int, ...]) -> None:
        if v in sinks:
            paths.append(path)
        for i, w in out.get(v, ()):
            walk(w, (*path, i))

    for s in sources:
        walk(s, ())
    return paths


@st.composite
def dags(draw):
    n = draw(st.integers(1, 7))
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=12)) if pairs else []
    label = draw(st.permutations(range(n)))  # so that vertex numbers are not an order
    edges = [(label[u], label[v]) for u, v in edges]
    vertex = st.integers(0, n - 1)
    return n, edges, draw(st.sets(vertex)), draw(st.sets(vertex))


@given(dags())
def test_path_counts_equal_brute_force_enumeration(dag):
    n, edges, sources, sinks = dag
    counts = count_paths(n, edges, sources, sinks)
    paths = enumerate_paths(edges, sources, sinks)
    assert counts.total == len(paths)
    for i, (u, v) in enumerate(edges):
        assert counts.through(u, v) == sum(i in p for p in paths)
    for v in range(n):
        assert counts.forward[v] == len(enumerate_paths(edges, sources, {v}))
        assert counts.backward[v] == len(enumerate_paths(edges, {v}, sinks))


@st.composite
def traces(draw):
    timelines = draw(st.lists(st.sampled_from([(DRIVER, 0), (0, 0), (0, 1), (1, 0)]),
                              min_size=1, max_size=4, unique=True))
    acts = []
    for worker, lane in timelines:
        points = sorted(draw(st.lists(st.integers(0, 20), min_size=2, max_size=6)))
        for start, end in zip(points[::2], points[1::2], strict=False):
            acts.append(Activity(len(acts), draw(st.sampled_from(["apply", "export", "wait"])),
                                 worker, start, end, bin=draw(st.sampled_from([None, 1, 2])),
                                 lane=lane))
    candidates = [(a.id, b.id) for a in acts for b in acts if a.timeline != b.timeline
                  and a.end <= b.start and a.order_key() < b.order_key()]
    chosen = draw(st.sets(st.sampled_from(candidates), min_size=1)) if candidates else set()
    kinds = st.sampled_from(["comm", "shuffle", "schedule"])
    deps = [Dependency(s, d, draw(kinds)) for s, d in sorted(chosen)]
    t_s = draw(st.integers(-2, 8))  # windows that mostly cut into the activities
    return EpochTrace(draw(st.integers(0, 3)), acts, deps), t_s, draw(st.integers(t_s + 1, 23))


@given(traces())
def test_on_random_traces_every_path_spans_the_window_and_cp_sums_to_one(case):
    trace, t_s, t_e = case
    assert EpochTrace.from_json(trace.to_json()) == trace
    pag = build_pag([trace], t_s, t_e)
    report = critical_participation(pag)
    if not pag.timelines:
        assert report.paths == 0 and report.items == ()
        return
    pairs = [(e.src, e.dst) for e in pag.edges]
    paths = enumerate_paths(pairs, set(pag.sources), set(pag.sinks))
    assert report.paths == len(paths)
    for path in paths:
        assert sum(pag.edges[i].weight for i in path) == pytest.approx(t_e - t_s)
    through = {i: sum(i in p for p in paths) for i in range(len(pag.edges))}
    reported = [i for i, e in enumerate(pag.edges) if e.role != LINK]
    assert [item.paths for item in report.items] == [through[i] for i in reported]
    assert report.total() == pytest.approx(1.0)
    assert sum(report.by_kind().values()) == pytest.approx(1.0)
    assert all(t_s <= e.start <= e.end <= t_e for e in pag.edges)
