"""The deadline (Cameo) policy and the policy interface, with synthetic costs (no Spark)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.plans import MigrationPlan, PlanError, PlanStep, make_plan, schedule
from megaphone.plans.cost_model import (
    APPLY,
    EXPORT,
    CostModel,
    Slots,
    fixed_and_per_byte,
    stages_s,
)
from megaphone.plans.deadline import DeadlinePolicy
from megaphone.plans.plan_queue import PlanQueue, PolicyInputs
from megaphone.plans.policy import (
    _FACTORIES,
    AllAtOnce,
    Batched,
    EpochView,
    Fluid,
    drive,
    plan_policy,
    policy_from_spec,
    register_policy,
)
from megaphone.records import EpochMetrics
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move, RoutingTable

PROC_S = 0.5  # processing per worker per epoch
RECORDS = 1000
OVERHEAD_S = 0.2
XFER = 1e-7  # seconds per byte, at the sender and again at the receiver
MB = 1_000_000


def epoch(workers=(0, 1, 2, 3), moved: dict[int, tuple[int, int]] | None = None,
          parallelism: int = 8) -> EpochMetrics:
    """A metrics record of the synthetic model: ``moved[w] = (bytes out, bytes in)``."""
    per_worker = {}
    for w in workers:
        out_b, in_b = (moved or {}).get(w, (0, 0))
        pw = {"records_in": RECORDS, "useful_s": PROC_S + in_b * XFER, "install_s": in_b * XFER,
              "bytes_in": in_b}
        if out_b:
            pw.update(bytes_out=out_b, export_s=out_b * XFER)
        per_worker[str(w)] = pw
    work = {}
    for w, pw in per_worker.items():
        work[EXPORT, int(w)] = pw.get("export_s", 0.0)
        work[APPLY, int(w)] = pw["useful_s"]
    duration = OVERHEAD_S + stages_s(work, parallelism)
    total = sum(o for o, _ in (moved or {}).values())
    return EpochMetrics.from_dict({
        "epoch": 0, "started": 0.0, "finished": duration, "duration_s": duration,
        "per_worker": dict(per_worker),
        "bytes_moved": total})


HISTORY = (epoch(), epoch(), epoch(moved={0: (MB, 0), 1: (0, MB)}), epoch())


def view(remaining, sizes, history=HISTORY, lag=0.0, parallelism=8, records=None):
    return EpochView(10, tuple(remaining), sizes, records or {}, tuple(history), lag, 0,
                     parallelism)


def test_cost_model_recovers_the_synthetic_costs():
    model = CostModel.fit(HISTORY, parallelism=8)
    assert model.overhead_s == pytest.approx(OVERHEAD_S)
    assert model.per_record_s[0] == pytest.approx(PROC_S / RECORDS)
    assert model.export_s_per_byte[0] == pytest.approx(XFER)
    assert model.install_s_per_byte[1] == pytest.approx(XFER)
    assert model.ship_s_per_byte == pytest.approx(0.0, abs=1e-12)
    assert model.processing_s(7) == pytest.approx(0.0)  # a worker with no records yet
    assert model.epochs_seen == 4 and model.transfers_seen == 1


def test_moves_that_fit_and_stop_where_the_budget_ends():
    # L = 2: 2 - 0.2 overhead - 0.5 processing leaves 1.3 s; a 1 MB bin costs 0.1 s of export
    # at its sender (first stage) and 0.1 s of install at its receiver (second stage), so 6
    # bins from worker 0 to 1 fit (0.7 + 0.2 n <= 2), the 7th not.
    moves = [Move(b, 0, 1) for b in range(20)]
    policy = DeadlinePolicy(2.0, margin=1.0)
    chosen = policy(view(moves, dict.fromkeys(range(20), MB)))
    assert len(chosen) == 6
    d = policy.decisions[-1]
    assert d.action == "fit" and d.bins == 6 and d.predicted_s <= 2.0 + 1e-9


def test_bins_written_ahead_go_first_and_cost_their_sender_no_export():
    """Bins whose files the sender's store wrote ahead (docs/transfer.md; reported at the last
    commit) are tried first and cost only their install; the cost model learns the export's
    rate from the other bytes."""
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = dict.fromkeys(range(20), MB)
    last = epoch()
    last.per_worker[0].ahead_bins = list(range(8, 20))
    policy = DeadlinePolicy(2.0, margin=1.0)
    chosen = policy(view(moves, sizes, (*HISTORY, last)))
    # 0.7 s + 0.1 s of install a bin: the 12 written ahead fit (1.9 s); a bin written at its
    # move would add 0.1 s of export too, so none does.
    assert [m.bin for m in chosen] == list(range(8, 20))
    # An export whose bins were all written ahead teaches the model nothing about the rate.
    cheap = epoch(moved={0: (MB, 0), 1: (0, MB)})
    cheap.per_worker[0].ahead_bytes_out = MB
    cheap.per_worker[0].export_s = 0.001
    model = CostModel.fit((*HISTORY, cheap), parallelism=8)
    assert model.export_s_per_byte[0] == pytest.approx(XFER)


def test_a_receiver_gets_no_more_bins_than_its_level0_room():
    """Each ingested bin may add a level-0 file at its receiver: one at 6 of 8 gets 2 bins
    this epoch, one at 8 none (the "compaction" decision when that is every move)."""
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = dict.fromkeys(range(20), MB)
    last = epoch()
    last.per_worker[1].l0_files = 6
    policy = DeadlinePolicy(2.0, margin=1.0, max_l0_files=8)
    assert len(policy(view(moves, sizes, (*HISTORY, last)))) == 2
    last.per_worker[1].l0_files = 8
    assert policy(view(moves, sizes, (*HISTORY, last))) == []
    assert policy.decisions[-1].action == "compaction"
    assert len(DeadlinePolicy(2.0, margin=1.0, max_l0_files=None)(
        view(moves, sizes, (*HISTORY, last)))) == 6


def moving(extra_s: float = 0.0, nbytes: int = MB, bins: int = 0) -> EpochMetrics:
    """A synthetic epoch moving ``nbytes`` from worker 0 to 1 that took ``extra_s`` more than
    its stages and the job's overhead (the export stage, the files' round trips)."""
    m = epoch(moved={0: (nbytes, 0), 1: (0, nbytes)})
    m.duration_s += extra_s
    m.bins_moved = bins
    return m


def test_predictions_are_calibrated_by_the_measured_error():
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = dict.fromkeys(range(20), MB)
    policy = DeadlinePolicy(2.0, margin=1.0)
    assert len(policy(view(moves, sizes))) == 6  # the model replays HISTORY exactly
    assert policy.calibration == 1.0
    # Moving epochs the model cannot replay (the median of their extra time is 0, one took
    # 0.6 s more): predictions grow by the 75th percentile of measured over replayed.
    erratic = (*HISTORY, moving(), moving(), moving(0.6))
    assert 1 <= len(policy(view(moves, sizes, erratic))) < 6
    assert policy.calibration > 1.2 and policy.decisions[-1].calibration > 1.2
    # Faster ones never make the policy bolder than its model.
    fast = epoch(moved={0: (MB, 0), 1: (0, MB)})
    fast.duration_s /= 2
    assert len(policy(view(moves, sizes, (*HISTORY, fast)))) == 6
    assert policy.calibration == 1.0


def test_a_slow_moving_epoch_scales_only_what_moves_add():
    """The calibration scales what moves add, not the epoch without them: after moving epochs
    that took more than the model replays, a pipeline whose own epoch fits its target is not
    "behind" (the old factor on the whole prediction held the billion-key move there)."""
    moves = [Move(b, 0, 1) for b in range(20)]
    slow = (*HISTORY, moving(), moving(), moving(0.9))
    policy = DeadlinePolicy(1.0, margin=1.0)
    assert policy(view(moves, dict.fromkeys(range(20), MB), slow)) == []
    assert policy.calibration > 1.5  # what moving added, over what the model replays
    assert policy.decisions[-1].action == "wait"  # not "behind": 0.7 s of its own fits 1 s


def compacted(m: EpochMetrics, worker: int = 0) -> EpochMetrics:
    """``m`` with ``worker``'s store reporting a compaction at its commit."""
    m.per_worker[worker].compacting = True
    return m


def test_a_compaction_starting_halves_the_moves_until_measured():
    """A store that starts compacting slows the moves of every epoch beside it (two to three
    times at the billion-key move): the next epoch moves at most half the bins of the last
    moving one; once two moving epochs were measured while compacting, they alone calibrate."""
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = dict.fromkeys(range(20), MB)
    steady = (*HISTORY, moving(bins=4), moving(bins=4))
    policy = DeadlinePolicy(2.0, margin=1.0)
    assert len(policy(view(moves, sizes, steady))) == 6
    assert len(policy(view(moves, sizes, (*steady[:-1], compacted(moving(bins=4)))))) == 2
    assert "compacting" in policy.decisions[-1].note
    # Two slow epochs measured while compacting: their ratio rules, not the quiet ones'.
    slow = (*steady, compacted(moving(0.4, bins=2)), compacted(moving(0.4, bins=2)))
    assert 1 <= len(policy(view(moves, sizes, slow))) < 6
    assert policy.calibration > 2
    # The compaction over: the quiet epochs of the window calibrate again.
    assert len(policy(view(moves, sizes, (*slow, moving(bins=2))))) == 6
    assert policy.calibration == 1.0
    # Without a moving epoch to halve, the usual rules hold.
    assert len(DeadlinePolicy(2.0, margin=1.0)(
        view(moves, sizes, (*HISTORY[:-1], compacted(epoch()))))) == 6


def test_a_moving_jobs_fixed_cost_is_told_from_its_cost_per_byte():
    """What moving epochs take beyond their stages is a fixed cost per moving job plus a cost
    per byte (Theil-Sen over pairs of epochs that moved clearly different bytes); epochs of
    one size cannot tell them apart, and all of it is then fixed."""
    truth = [(0.1 + 2e-8 * b, b) for b in (MB, 2 * MB, 4 * MB, 4 * MB + 1000)]
    fixed, per_byte = fixed_and_per_byte([*truth, (5.0, 2 * MB)])  # one epoch far off
    assert fixed == pytest.approx(0.1) and per_byte == pytest.approx(2e-8)
    assert fixed_and_per_byte([(0.1, MB), (0.3, MB + 1000)]) == (pytest.approx(0.2), 0.0)
    assert fixed_and_per_byte([]) == (0.0, 0.0)
    model = CostModel.fit((*HISTORY, moving(0.1), moving(0.1)), parallelism=8)
    assert model.move_overhead_s == pytest.approx(0.1) and model.ship_s_per_byte == 0.0
    work = {(APPLY, 0): PROC_S}
    assert model.epoch_s({**work, (EXPORT, 0): 0.0}) == pytest.approx(model.epoch_s(work) + 0.1)


def test_the_first_probe_is_not_learned_from():
    """A plan's first moving epoch also pays the transfer path's one-off costs (1.2 s where the
    next took 0.6 s at a billion keys): the model leaves it out and probes once more."""
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = dict.fromkeys(range(20), MB)
    quiet = (epoch(), epoch(), epoch())
    policy = DeadlinePolicy(2.0, margin=1.0)
    assert len(policy(view(moves, sizes, quiet))) == 1  # the probe, at epoch 10
    first = moving(1.0, bins=1)
    first.epoch = 10
    assert len(policy(view(moves, sizes, (*quiet, first)))) == 1
    assert policy.decisions[-1].action == "probe"
    second = moving(bins=1)
    second.epoch = 11
    assert len(policy(view(moves, sizes, (*quiet, first, second)))) == 2
    assert policy.decisions[-1].action == "fit" and policy.model.move_overhead_s == 0.0


def test_moves_grow_at_most_twice_the_most_bins_an_epoch_moved():
    """A fixed cost learned from one-bin epochs would let every bin fit at once: the policy
    moves at most twice the most bins of a recent epoch, so the model sees a larger move
    (and its cost per byte) before it relies on it."""
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = dict.fromkeys(range(20), MB)
    policy = DeadlinePolicy(2.0, margin=1.0)
    assert len(policy(view(moves, sizes, (*HISTORY, moving(0.1, bins=1))))) == 2
    assert len(policy(view(moves, sizes, (*HISTORY, moving(0.1, bins=2))))) == 4
    assert len(policy(view(moves, sizes, (*HISTORY, moving(0.1, bins=9))))) == 5


def test_the_margin_shrinks_what_fits():
    moves = [Move(b, 0, 1) for b in range(20)]
    chosen = DeadlinePolicy(2.0, margin=1.25)(view(moves, dict.fromkeys(range(20), MB)))
    assert len(chosen) == 4  # 1.25 * (0.7 + 0.2 n) <= 2  ->  n <= 4.5


def test_every_worker_involved_is_checked():
    # Two disjoint pairs fill their own budgets; a third pair's receiver is the busy worker 1.
    moves = [Move(b, 0, 1) for b in range(10)] + [Move(b, 2, 3) for b in range(10, 20)]
    moves += [Move(20, 2, 1)]
    chosen = DeadlinePolicy(1.5, margin=1.0)(view(moves, dict.fromkeys(range(21), MB)))
    per_pair = {(m.src, m.dst): 0 for m in chosen}
    for m in chosen:
        per_pair[m.src, m.dst] += 1
    # 0.8 s left: 4 bins of (0, 1) take 0.4 s per stage; (2, 3) runs beside them in both
    # stages (another sender, another receiver), 4 more; (2, 1) would lengthen both stages.
    assert per_pair == {(0, 1): 4, (2, 3): 4}


def test_the_whole_machine_is_checked_too():
    # With 2 task slots the summed work of 4 workers bounds the epoch before any single one.
    history = [epoch(parallelism=2), epoch(parallelism=2),
               epoch(moved={0: (MB, 0), 1: (0, MB)}, parallelism=2)]
    moves = [Move(b, 0, 1) for b in range(20)]
    policy = DeadlinePolicy(2.0, margin=1.0)
    chosen = policy(view(moves, dict.fromkeys(range(20), MB), history, parallelism=2))
    # 0.2 + 0.1 n (exports) + (4 * 0.5 + 0.1 n) / 2 (the 2 slots) <= 2  ->  n <= 5
    assert len(chosen) == 5


def test_a_move_onto_a_busy_host_is_predicted_slower_than_onto_an_idle_one():
    """Workers 0, 1 and 3 at home on host a, 2 on b, 2 slots each: a's three workers share
    its 2 slots, so a bin received by worker 1 (on a) is predicted slower than by worker 2
    (on b); over all 4 slots, as without homes, the two cost the same."""
    homes, host_slots = {0: "a", 1: "a", 3: "a", 2: "b"}, {"a": 2, "b": 2}
    slots = Slots(4, homes, host_slots)
    history = (epoch(parallelism=slots), epoch(parallelism=slots),
               epoch(moved={0: (MB, 0), 3: (0, MB)}, parallelism=slots), epoch(parallelism=slots))

    def predicted(dst: int, **hosts) -> float:
        policy = DeadlinePolicy(100.0, margin=1.0)
        assert policy(EpochView(10, (Move(5, 0, dst),), {5: MB}, {}, history, 0.0, 0, 4,
                                **hosts)) == [Move(5, 0, dst)]
        return policy.decisions[-1].predicted_s

    known = {"homes": homes, "host_slots": host_slots}
    # overhead + export (0.1) + a's stage: (0.5 + 0.6 + 0.5) / 2, or b's 0.6 next to a's 0.75
    assert predicted(1, **known) == pytest.approx(OVERHEAD_S + 0.1 + 1.6 / 2)
    assert predicted(2, **known) == pytest.approx(OVERHEAD_S + 0.1 + 1.5 / 2)
    # A new worker (no home) counts where it would be homed: b, the most free slots.
    assert predicted(7, **known) == pytest.approx(predicted(2, **known))
    assert predicted(1) == pytest.approx(predicted(2))  # homes unknown: today's formula
    assert predicted(1, homes=homes, host_slots={"a": 2}) == pytest.approx(predicted(2))


def test_zero_slack_moves_nothing():
    moves = [Move(0, 0, 1)]
    policy = DeadlinePolicy(2.0, margin=1.0, max_behind=None)
    for _ in range(50):
        assert policy(view(moves, {0: 1}, lag=1.5)) == []
    assert {d.action for d in policy.decisions} == {"behind"}


def test_a_pipeline_behind_for_long_still_makes_progress_and_says_so(caplog):
    moves = [Move(0, 0, 1), Move(1, 0, 1)]
    policy = DeadlinePolicy(2.0, margin=1.0, max_behind=4)
    with caplog.at_level(logging.WARNING, logger="megaphone.deadline"):
        chosen = [policy(view(moves, {0: 9, 1: 5}, lag=1.5)) for _ in range(4)]
    assert chosen == [[], [], [], [Move(1, 0, 1)]]
    assert policy.decisions[-1].action == "stalled" and "behind for 4 epochs" in caplog.text
    assert policy(view(moves, {0: 9, 1: 5}, lag=0.0))  # slack again: back to fitting
    assert policy.decisions[-1].action == "fit"


def test_relief_is_bought_per_second_of_transfer_so_bins_written_ahead_go_first():
    """Under ``priority="relief"``, equal loads: the bin written ahead costs its sender no
    export (0.1 s of transfer, not 0.2 s), so it goes first; a bin with ten times the load
    still goes before it. L = 0.95 s leaves room for one bin either way."""
    moves = [Move(b, 0, 1) for b in range(4)]
    sizes = dict.fromkeys(range(4), MB)
    last = epoch()
    last.per_worker[0].ahead_bins = [3]
    policy = DeadlinePolicy(0.95, margin=1.0, priority="relief")
    even = dict.fromkeys(range(4), 10.0)
    assert policy(view(moves, sizes, (*HISTORY, last), records=even)) == [Move(3, 0, 1)]
    hot = {**even, 0: 100.0}
    assert policy(view(moves, sizes, (*HISTORY, last), records=hot)) == [Move(0, 0, 1)]
    assert DeadlinePolicy(0.95, margin=1.0, priority="relief")(
        view(moves, sizes, records=even)) == [Move(0, 0, 1)]  # nothing ahead: plan order


def test_the_export_rate_is_kept_while_every_bin_goes_written_ahead():
    """Epochs whose bins all went written ahead measure no export rate; the policy keeps the
    last one, or bins written at their move would look free once the window forgot it (in a
    billion-key run every 21st epoch exported 12 bins at their move, 1.04 s against 0.55 s)."""
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = dict.fromkeys(range(20), MB)
    policy = DeadlinePolicy(2.0, margin=1.0, window=3)
    policy(view(moves, sizes))
    learned = policy.model.export_s_per_byte
    cheap = epoch(moved={0: (MB, 0), 1: (0, MB)})
    cheap.per_worker[0].ahead_bytes_out = MB
    policy(view(moves, sizes, (epoch(), epoch(), cheap)))
    assert learned and policy.model.export_s_per_byte == learned
    assert not CostModel.fit((epoch(), epoch(), cheap), 8, window=3).export_s_per_byte


def test_until_an_export_is_measured_only_bins_written_ahead_move():
    """A plan whose probes moved bins written ahead knows no export rate: a bin that is not
    written ahead would look free (in a billion-key run two such bins took 0.67 s of export
    and the epoch 1.83 s against 1.03 predicted). Only bins written ahead move, until none
    is left; then the smallest other bin moves alone, and after it the rate, if it is still
    unknown, no longer holds the others back."""
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = {b: MB + b for b in range(20)}
    cheap = epoch(moved={0: (MB, 0), 1: (0, MB)})
    cheap.per_worker[0].ahead_bytes_out = MB
    history = (epoch(), epoch(), cheap, epoch())
    ahead = epoch()
    ahead.per_worker[0].ahead_bins = [5, 9]
    policy = DeadlinePolicy(2.0, margin=1.0)
    assert sorted(m.bin for m in policy(view(moves, sizes, (*history, ahead)))) == [5, 9]
    assert not policy.model.export_s_per_byte and policy.decisions[-1].action == "fit"
    assert policy(view(moves, sizes, history)) == [Move(0, 0, 1)]  # none ahead: alone
    d = policy.decisions[-1]
    assert (d.action, d.note) == ("probe", "no export measured yet: the smallest bin alone")
    assert len(policy(view(moves, sizes, history))) == 6  # priced by their installs alone


def test_a_pipeline_behind_with_known_load_moves_the_most_records_per_byte(caplog):
    moves = [Move(0, 0, 1), Move(1, 0, 1), Move(2, 0, 1)]
    sizes, records = {0: 9, 1: 5, 2: 100}, {0: 90.0, 1: 10.0, 2: 50.0}  # per byte: 10, 2, .5
    policy = DeadlinePolicy(2.0, margin=1.0, max_behind=3)
    with caplog.at_level(logging.WARNING, logger="megaphone.deadline"):
        chosen = [policy(view(moves, sizes, lag=1.5, records=records)) for _ in range(3)]
    assert chosen == [[], [], [Move(0, 0, 1)]]  # not the smallest, bin 1
    assert "moving the most relief per second bin 0 alone" in caplog.text


def test_a_bin_larger_than_the_budget_moves_alone_eventually_and_says_so(caplog):
    moves = [Move(0, 0, 1), Move(1, 0, 1)]
    sizes = {0: 50 * MB, 1: 80 * MB}  # 5 s and 8 s at each end: never within L = 2
    policy = DeadlinePolicy(2.0, margin=1.0, patience=3)
    with caplog.at_level(logging.WARNING, logger="megaphone.deadline"):
        assert policy(view(moves, sizes)) == []
        assert policy(view(moves, sizes)) == []
        assert policy(view(moves, sizes)) == [Move(0, 0, 1)]  # the smaller one first
    assert [d.action for d in policy.decisions] == ["wait", "wait", "oversized"]
    assert "bin 0" in policy.decisions[-1].note and "over the" in policy.decisions[-1].note
    assert "moving it alone" in caplog.text


def test_no_transfer_measured_yet_probes_with_the_smallest_bin():
    history = [epoch(), epoch()]  # stores that write nothing ahead (ahead_pending None)
    moves = [Move(b, 0, 1) for b in range(3)]
    policy = DeadlinePolicy(2.0)
    assert policy(view(moves, {0: 3 * MB, 1: MB, 2: 2 * MB}, history)) == [Move(1, 0, 1)]
    assert policy.decisions[-1].action == "probe"


def _ahead(pending: int, written: tuple[int, ...] = ()) -> EpochMetrics:
    """An epoch whose sender (worker 0) had ``pending`` bins still to write ahead at its
    commit and held ``written``."""
    m = epoch()
    m.per_worker[0].ahead_pending, m.per_worker[0].ahead_bins = pending, list(written) or None
    return m


def test_the_probe_takes_a_bin_written_ahead_as_soon_as_one_is_reported():
    """A plan's first epoch names the bins to write ahead, its idle time writes them and the
    next commit reports them (docs/transfer.md): the probe waits for one, and moves it, not a
    bin its sender would write in the epoch (at a billion keys the first two moves took
    0.89-0.92 s against 0.49 s for a bin written ahead)."""
    moves = [Move(b, 0, 1) for b in range(3)]
    sizes = {0: 3 * MB, 1: MB, 2: 2 * MB}
    policy = DeadlinePolicy(2.0)
    assert policy(view(moves, sizes, (epoch(), _ahead(0)))) == []  # nothing named yet
    assert policy(view(moves, sizes, (epoch(), _ahead(3)))) == []  # named, not written yet
    assert policy(view(moves, sizes, (epoch(), _ahead(0, (2, 7))))) == [Move(2, 0, 1)]
    assert [d.action for d in policy.decisions] == ["prepare", "prepare", "probe"]
    assert "waiting 2/2" in policy.decisions[1].note


def test_the_probe_waits_at_most_ahead_wait_epochs_and_not_for_bins_too_small_to_write():
    moves = [Move(b, 0, 1) for b in range(3)]
    sizes = {0: 3 * MB, 1: MB, 2: 2 * MB}
    slow = DeadlinePolicy(2.0, ahead_wait=2)
    assert [slow(view(moves, sizes, (epoch(), _ahead(3)))) for _ in range(3)] == \
        [[], [], [Move(1, 0, 1)]]  # the smallest once the wait is over
    small = DeadlinePolicy(2.0)  # the first commit after naming them: none to write
    assert [small(view(moves, sizes, (epoch(), _ahead(0)))) for _ in range(2)] == \
        [[], [Move(1, 0, 1)]]
    assert [d.action for d in small.decisions] == ["prepare", "probe"]
    assert DeadlinePolicy(2.0, ahead_wait=0)(view(moves, sizes, (epoch(), _ahead(3)))) == \
        [Move(1, 0, 1)]
    with pytest.raises(PlanError, match="ahead_wait"):
        DeadlinePolicy(1.0, ahead_wait=-1)


def test_warm_up_waits_for_metrics():
    policy = DeadlinePolicy(2.0)
    assert policy(view([Move(0, 0, 1)], {0: 1}, history=())) == []
    assert policy.decisions[-1].action == "warm-up"


def test_priority_auto_takes_the_largest_with_slack_and_small_ones_in_little_slack():
    moves = [Move(0, 0, 1), Move(1, 0, 1), Move(2, 0, 1), Move(3, 0, 1)]
    sizes = {0: 5 * MB // 2, 1: MB // 2, 2: MB // 2, 3: 6 * MB}
    # 1.3 s left: the largest (6 MB = 1.2 s) first, then what still fits (one 0.5 MB bin).
    assert DeadlinePolicy(2.0, margin=1.0)(view(moves, sizes)) == [Move(3, 0, 1), Move(1, 0, 1)]
    # 0.3 s left (lag 1.0): the largest does not fit: smallest first, two 0.5 MB bins.
    assert sorted(DeadlinePolicy(2.0, margin=1.0)(view(moves, sizes, lag=1.0))) == \
        [Move(1, 0, 1), Move(2, 0, 1)]


def test_priority_hottest_and_custom():
    moves = [Move(0, 0, 1), Move(1, 0, 1), Move(2, 0, 1)]
    sizes = dict.fromkeys(range(3), 3 * MB)  # 0.6 s each: two fit in 1.3 s
    hot = DeadlinePolicy(2.0, margin=1.0, priority="hottest")
    assert sorted(hot(view(moves, sizes, records={2: 50, 1: 10}))) == [Move(1, 0, 1),
                                                                        Move(2, 0, 1)]
    by_bin_desc = DeadlinePolicy(2.0, margin=1.0, priority=lambda m, v: -m.bin)
    assert sorted(by_bin_desc(view(moves, sizes))) == [Move(1, 0, 1), Move(2, 0, 1)]


@given(sizes=st.lists(st.integers(0, 30 * MB), min_size=1, max_size=30),
       dsts=st.lists(st.integers(1, 5), min_size=30, max_size=30),
       target=st.floats(0.5, 5.0), lag=st.floats(0.0, 3.0), margin=st.floats(1.0, 2.0),
       parallelism=st.integers(1, 8))
def test_chosen_moves_never_push_the_epoch_past_its_deadline_by_prediction(
        sizes, dsts, target, lag, margin, parallelism):
    moves = [Move(b, 0, dsts[b]) for b in range(len(sizes))]
    policy = DeadlinePolicy(target, margin=margin, patience=10**6)
    history = [epoch(parallelism=parallelism), epoch(parallelism=parallelism),
               epoch(moved={0: (MB, 0), 1: (0, MB)}, parallelism=parallelism)]
    chosen = policy(view(moves, dict(enumerate(sizes)), history, lag, parallelism))
    d = policy.decisions[-1]
    assert set(chosen) <= set(moves)
    if chosen:
        # the decision keeps its prediction rounded to 0.1 ms (StepDecision): half of that
        assert d.action == "fit" and lag + margin * d.predicted_s <= target + margin * 5e-5
    else:
        assert d.action in ("behind", "wait")  # max_behind=20: the first call is never stalled


def test_policy_specs_are_checked():
    assert isinstance(policy_from_spec({"name": "fluid"}), Fluid)
    assert isinstance(policy_from_spec({"name": "batched", "per_worker": 2}), Batched)
    assert isinstance(policy_from_spec({"name": "all-at-once"}), AllAtOnce)
    assert policy_from_spec({"name": "deadline", "target_latency_s": 1.5}).target_latency_s == 1.5
    for bad, message in [
        ({"name": "eager"}, "unknown policy"),
        ({"name": "deadline"}, "needs target_latency_s"),
        ({"name": "deadline", "target_latency_s": 0}, "must be > 0"),
        ({"name": "deadline", "target_latency_s": 1, "margin": 0.5}, "margin"),
        ({"name": "deadline", "target_latency_s": 1, "speed": 3}, "unknown fields"),
        ({"name": "deadline", "target_latency_s": 1, "priority": "random"}, "unknown priority"),
        ({"name": "batched", "per_worker": 0}, "per_worker"),
        ("deadline", "must be an object"),
    ]:
        with pytest.raises(PlanError, match=message):
            policy_from_spec(bad)


def test_registered_policies_are_built_from_their_spec():
    register_policy("every-other", lambda params: Batched(params.get("per_worker", 2)))
    try:
        policy = policy_from_spec({"name": "every-other"})
        assert isinstance(policy, Batched) and policy.per_worker == 2
    finally:
        _FACTORIES.pop("every-other")


def test_fixed_strategies_are_policies_driven_ahead_of_time():
    moves = [Move(b, b % 3, 3 + b % 2) for b in range(12)]
    assert drive(Fluid(), moves) == schedule(moves, "fluid")
    assert drive(Batched(2), moves) == schedule(moves, "batched", 2)
    assert drive(AllAtOnce(), moves) == [sorted(moves)]
    # Moves removed behind a policy's back: it starts its rounds again from what is left.
    for policy in (Fluid(), Batched(2)):
        first = policy(EpochView(0, tuple(moves)))
        left = [m for m in moves if m not in first][3:]
        again = policy(EpochView(1, tuple(left)))
        assert again and set(again) <= set(left)
    with pytest.raises(PlanError, match="started no move"):
        drive(lambda v: [], moves)
    with pytest.raises(PlanError, match="not among the plan's remaining moves"):
        drive(lambda v: [Move(99, 0, 1)], moves)


def table(workers: int = 2, bins: int = 8) -> RoutingTable:
    return RoutingTable.initial(Fingerprint("p", bins, "int64"), workers)


def test_deadline_plans_are_adaptive_json_and_validated():
    t = table()
    plan = make_plan(t, [Move(0, 0, 1), Move(7, 1, 0)], "deadline", target_latency=2.0)
    assert plan.adaptive and plan.policy["target_latency_s"] == 2.0
    assert MigrationPlan.from_json(plan.to_json()) == plan
    with pytest.raises(PlanError, match="needs a target latency"):
        make_plan(t, [Move(0, 0, 1)], "deadline")
    with pytest.raises(PlanError, match="are for strategy 'deadline'"):
        make_plan(t, [Move(0, 0, 1)], "fluid", target_latency=2.0)
    twice = MigrationPlan(t.fingerprint, 0, (*plan.steps, PlanStep(1, (Move(0, 1, 0),))),
                          policy={"name": "fluid"})
    with pytest.raises(PlanError, match="moves bin 0 more than once"):
        twice.validate(t)
    data = plan.to_dict()
    data["policy"] = {"name": "deadline", "target_latency_s": "soon"}
    with pytest.raises(PlanError, match="target_latency_s"):
        plan_policy(MigrationPlan.from_dict(data))
    data["policy"] = "deadline"
    with pytest.raises(PlanError, match="string 'name'"):
        MigrationPlan.from_dict(data)


def test_queue_asks_the_policy_each_epoch_and_survives_a_restart():
    t = table(2, 8)
    moves = [Move(b, b // 4, 2) for b in range(6)]
    plan = make_plan(t, moves, "deadline", target_latency=2.0)
    calls: list[EpochView] = []

    def two_per_epoch_after_a_pause(v: EpochView) -> list[Move]:
        calls.append(v)
        return [] if v.epoch == 0 else list(v.remaining[:2])

    queue = PlanQueue(t)
    handle = queue.submit(plan, 0, two_per_epoch_after_a_pause)
    assert queue.steps_due(0, PolicyInputs(bin_bytes=lambda: {0: 7})) == []
    queue.committed(0, {})
    assert calls[0].idle_epochs == 0 and calls[0].bin_bytes == {0: 7}
    assert queue.steps_due(1) == moves[:2]
    queue.committed(1, {0: 10, 1: 20})
    assert calls[1].idle_epochs == 1 and len(calls[1].remaining) == 6
    assert handle.progress.bins_done == 2 and handle.progress.bytes_moved == 30
    assert not handle.done
    # A restart: the routing and the queue come back from their JSON; the in-process policy
    # is gone, so the remaining moves continue as fluid (one per epoch).
    saved, routing = queue.to_list(), t.to_dict()
    queue2 = PlanQueue(RoutingTable.from_dict(routing))
    (handle2,) = queue2.restore(saved)
    assert handle2.progress.bins_done == 2
    for e in range(2, 6):
        assert len(queue2.steps_due(e)) == 1
        queue2.committed(e, {})
    assert handle2.done and queue2.in_flight == []
    assert queue2.table.owners().tolist() == [2] * 6 + [1, 1]


def test_queue_fails_a_plan_whose_policy_misbehaves_and_keeps_going():
    t = table(2, 8)
    plan = make_plan(t, [Move(0, 0, 1)], "deadline", target_latency=2.0)
    queue = PlanQueue(t)
    handle = queue.submit(plan, 0, lambda v: [Move(5, 1, 0)])
    assert queue.steps_due(0) == []
    assert handle.done and "not among the plan's remaining moves" in str(handle.error)
    assert queue.in_flight == [] and t.version == 0
    with pytest.raises(PlanError, match="not among"):
        handle.wait(0)


def test_nothing_queues_behind_an_adaptive_plan():
    t = table(2, 8)
    queue = PlanQueue(t)
    queue.submit(make_plan(t, [Move(0, 0, 1)], "deadline", target_latency=2.0), 0)
    with pytest.raises(PlanError, match="adaptive plan is in flight"):
        queue.submit(make_plan(t, [Move(1, 1, 0)], "fluid"), 0)


def test_no_bins_go_to_a_worker_that_owes_compaction():
    # Worker 1's store owes 2 GiB of compaction at the newest epoch: the bins bound for it
    # wait, the ones for worker 2 still move; once only worker 1's are left, nothing moves.
    last = epoch()
    last.per_worker[1].pending_compaction_bytes = 2 << 30
    history = (*HISTORY, last)
    moves = [Move(0, 0, 1), Move(1, 0, 2), Move(2, 0, 1)]
    sizes = dict.fromkeys(range(3), MB)
    policy = DeadlinePolicy(10.0, margin=1.0)
    assert policy(view(moves, sizes, history)) == [Move(1, 0, 2)]
    only_to_1 = [Move(0, 0, 1), Move(2, 0, 1)]
    assert policy(view(only_to_1, sizes, history)) == []
    assert policy.decisions[-1].action == "compaction"
    # Without a limit, or once the debt is paid, they move.
    assert len(DeadlinePolicy(10.0, margin=1.0, max_compaction_debt=None)(
        view(only_to_1, sizes, history))) == 2
    assert len(policy(view(only_to_1, sizes))) == 2
    with pytest.raises(PlanError, match="max_compaction_debt"):
        DeadlinePolicy(1.0, max_compaction_debt=-1)


def test_the_cost_model_charges_a_groups_job_overhead_once():
    """Epochs of a group share one job: its overhead is learned from the group as a whole
    (each epoch's ``duration_s`` is a share of the group's time) and charged per job."""
    size = 4
    alone = epoch()
    group = []
    for i in range(size):
        m = epoch()
        work = m.duration_s - OVERHEAD_S  # the epoch's stages
        m.epoch, m.group, m.group_size = 10 + i, 10, size
        m.duration_s = work + OVERHEAD_S / size  # the group's time over its size
        group.append(m)
    for history in ((alone, alone), tuple(group), (alone, *group)):
        model = CostModel.fit(history, parallelism=8)
        assert model.overhead_s == pytest.approx(OVERHEAD_S)
        work = alone.duration_s - OVERHEAD_S
        assert model.replay_s(group[1], 8) == pytest.approx(work + OVERHEAD_S / size)
        assert model.replay_s(alone, 8) == pytest.approx(alone.duration_s)


def test_a_group_runs_past_an_adaptive_plans_epoch_only_when_its_policy_moved_nothing():
    t = table(2, 8)
    moves = [Move(b, b // 4, 2) for b in range(4)]
    chosen: dict[int, list[Move]] = {3: moves[:1]}  # the policy moves one bin at epoch 3 only
    queue = PlanQueue(t)
    queue.submit(make_plan(t, moves, "deadline", target_latency=2.0), 0,
                 lambda v: chosen.get(v.epoch, []))
    asked: list = []

    def five(policy) -> int:
        asked.append(policy)
        return 5

    assert queue.steps_due(0) == []
    assert queue.group_end(0, 9) == 0  # by default the policy decides before every epoch
    assert queue.group_end(0, 9, five) == 4 and len(asked) == 1  # nothing moved: 5 epochs
    assert queue.group_end(0, 2, five) == 2  # at most ``end``
    for e in range(3):
        queue.committed(e, {})
    assert queue.steps_due(3) == moves[:1]
    assert queue.group_end(3, 9, five) == 3  # it moved: the policy predicted that epoch alone
    # A fixed plan ahead of an adaptive one: when its last step applies, the adaptive plan was
    # not asked yet (it starts at the next epoch), so the group is the epoch alone.
    t2 = table(2, 8)
    queue2 = PlanQueue(t2)
    queue2.submit(make_plan(t2, [Move(0, 0, 1)], "all-at-once"), 0)
    after = RoutingTable.from_dict(t2.to_dict())  # the version the first plan ends at
    after.apply_step([Move(0, 0, 1)], 0)
    queue2.submit(make_plan(after, [Move(5, 1, 0)], "deadline", target_latency=2.0), 1,
                  lambda v: [])
    assert queue2.steps_due(0) == [Move(0, 0, 1)]
    assert queue2.group_end(0, 9, five) == 0


def test_a_deadline_bounds_a_group_by_its_latency_target():
    from megaphone.migrator.epoch.groups import deadline_group_size

    # A 2 s budget, a 0.4 s job floor and 0.1 s of work per epoch: 16 epochs fit.
    assert deadline_group_size(2.0, 0.4, 0.1) == 16
    assert deadline_group_size(2.0, 0.4, 0.1, most=8) == 8
    assert deadline_group_size(0.3, 0.4, 0.1) == 1  # not even one epoch fits: alone
    assert deadline_group_size(2.0, 0.4, 0.0) == 64 and deadline_group_size(0.2, 0.4, 0.0) == 1


def test_an_oversized_move_takes_the_bins_the_slack_would_hold(caplog):
    """A moving job's fixed cost over the whole budget makes every bin oversized; the forced
    epoch pays it once and takes as many more bins as the slack holds (a billion-key run whose
    target was tighter than a one-bin epoch moved one bin every third epoch)."""
    moves = [Move(b, 0, 1) for b in range(20)]
    sizes = dict.fromkeys(range(20), MB)
    # Every moving epoch took 1.5 s more than its stages, whatever it moved: a fixed cost.
    history = (epoch(), epoch(), *(moving(1.5, nbytes=MB * n, bins=n) for n in (1, 4, 8)))
    policy = DeadlinePolicy(2.0, margin=1.0, patience=1)
    with caplog.at_level(logging.WARNING, logger="megaphone.deadline"):
        chosen = policy(view(moves, sizes, history))
    d = policy.decisions[-1]
    # One bin: 0.7 s idle + 1.5 s fixed + 0.2 s = 2.4 s, over L = 2. The 1.3 s of slack an
    # idle epoch leaves hold 6 more bins at 0.2 s each (2.4 + 1.2 <= 2.4 + 1.3), not a 7th.
    assert policy.model.move_overhead_s == pytest.approx(1.5)
    assert d.action == "oversized" and len(chosen) == 7
    assert d.predicted_s == pytest.approx(3.6)
    assert "moving it with 6 more bins (slack 1.30 s) after 1 epochs" in caplog.text
    # No slack left (lag 1.3 s): the oversized bin goes alone, as before.
    policy = DeadlinePolicy(2.0, margin=1.0, patience=1)
    assert len(policy(view(moves, sizes, history, lag=1.3))) == 1
