"""Apply a migration plan: offline to a stopped pipeline's state, or live to a running one.

Offline, the plan is checked first (pipeline, routing version, every move) and then applied
step by step, each step committed before the next starts, with a progress bar. If a pipeline
holds the state directory (in this process, or another one: the plan then goes through the
directory's inbox), the plan is submitted to it and its progress followed while the pipeline
runs the steps at its epochs. A plan that moves nothing (``megaphone plan`` at the current
layout) is checked alike, then reported as such (exit 0): no epoch runs, the state is untouched.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import TYPE_CHECKING

from megaphone.plans.report import human_bytes, table

if TYPE_CHECKING:
    import numpy as np

    from megaphone.migrator.pipeline.facade import Pipeline
    from megaphone.migrator.statedir.directory import StateDir
    from megaphone.plans.handle import MigrationHandle
    from megaphone.plans.plan import MigrationPlan
    from megaphone.routing.table import Move


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``migrate``'s arguments."""
    parser.add_argument("plan", help="plan file written by 'megaphone plan' (JSON)")
    parser.add_argument("--state-dir", required=True, metavar="DIR",
                        help="the pipeline's state directory (a checkpointed pipeline's too, while "
                        "stopped: its workers are read from this host's working copies or the "
                        "checkpoint; on a new host open the pipeline once first, see README)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-wait", action="store_true",
                        help="for a running pipeline: submit the plan and return at once")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="for a pipeline in another process: seconds to wait for it to "
                             "take the plan (default 120)")


def run(args: argparse.Namespace) -> int:
    """Apply the plan and print what moved; user errors raise ``ValueError`` (exit 2)."""
    from megaphone.migrator.statedir.directory import StateDir, StateDirLocked
    from megaphone.migrator.statedir.registry import running_pipeline
    from megaphone.plans.plan import MigrationPlan
    from megaphone.plans.policy import plan_policy

    plan = MigrationPlan.load(args.plan)
    plan_policy(plan)  # an adaptive plan's policy spec is checked before anything else
    state = StateDir.open(args.state_dir)
    state.fingerprint.check(plan.fingerprint, f"plan {args.plan}")
    running = running_pipeline(plan.fingerprint.pipeline_id)
    if running is not None and running.state_dir.path.resolve() == state.path.resolve():
        return _live(running, plan, args)
    try:
        state.lock()
    except StateDirLocked:
        return _remote(state, plan, args)
    state.unlock()
    return _offline(state, plan, args)


def _offline(state: StateDir, plan: MigrationPlan, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from megaphone.migrator.control.offline import check_offline_plan, migrate_offline
    from megaphone.migrator.epoch.state_reader import bin_sizes

    commit = state.read_commit()
    # The checks migrate_offline makes (after discarding what a crash left past the commit),
    # made first and read-only, so an error prints alone and nothing changes.
    table_before = state.routing_as_of(commit.state_version)
    check_offline_plan(state, commit, table_before, plan)
    if plan.empty:
        return _nothing_to_move(plan)
    owners_before = table_before.owners()
    sizes = bin_sizes(state, owners_before)
    moves = plan.moves
    keys = sum(int(sizes.keys[m.bin]) for m in moves)
    started = time.perf_counter()
    moved_bytes = 0
    # delay: a bar appears only once work is under way, never in front of an error line
    with tqdm(total=len(plan.steps), unit="step", desc="migrating", disable=args.no_progress,
              dynamic_ncols=True, delay=0.3) as bar:

        def on_step(index: int, nbytes: int) -> None:
            nonlocal moved_bytes
            moved_bytes += nbytes
            bar.set_postfix_str(f"{human_bytes(moved_bytes)} moved", refresh=False)
            bar.update(1)

        migrate_offline(str(state.path), plan, on_step=on_step)
    elapsed = time.perf_counter() - started
    table_after = state.load_routing()
    print(f"migrated {len(moves)} bins ({keys} keys, {human_bytes(moved_bytes)}) in "
          f"{len(plan.steps)} steps, {elapsed:.1f} s; routing version {table_before.version} -> "
          f"{table_after.version}")
    _print_layout(moves, owners_before, table_after.owners())
    return 0


def _live(pipeline: Pipeline, plan: MigrationPlan, args: argparse.Namespace) -> int:
    handle = pipeline.migrate(plan)  # validates now; a bad plan raises and changes nothing
    if plan.empty:
        return _nothing_to_move(plan)
    print(f"submitted {len(plan.moves)} bins in {len(plan.steps)} steps to pipeline "
          f"{plan.fingerprint.pipeline_id}, running in this process")
    if args.no_wait or not pipeline.streaming:
        print("the pipeline applies the steps at its next epochs")
        return 0
    return _follow(handle, args)


def _remote(state: StateDir, plan: MigrationPlan, args: argparse.Namespace) -> int:
    from megaphone.migrator.statedir.inbox import PlanInbox, PostedHandle, dir_committed

    # checked against the pipeline's last commit first: a bad plan is not posted
    handle = PlanInbox.of_state_dir(state).post(plan, lambda: dir_committed(state))
    if not isinstance(handle, PostedHandle):  # an empty plan: done at once, not posted
        return _nothing_to_move(plan)
    handle.answered(args.timeout)
    print(f"submitted {len(plan.moves)} bins in {len(plan.steps)} steps to the pipeline running "
          f"on {state.path} (another process)")
    return 0 if args.no_wait else _follow(handle, args)


def _follow(handle: MigrationHandle, args: argparse.Namespace) -> int:
    """Show a submitted plan's progress until it is done; exit 0."""
    from tqdm import tqdm

    plan = handle.plan
    with tqdm(total=len(plan.steps), unit="step", desc="migrating", disable=args.no_progress,
              dynamic_ncols=True) as bar:
        while not handle.wait(0.2):
            p = handle.progress
            bar.set_postfix_str(f"{human_bytes(p.bytes_moved)} moved", refresh=False)
            bar.update(p.steps_done - bar.n)
        p = handle.progress
        bar.update(p.steps_done - bar.n)
    moved = f" ({human_bytes(p.bytes_moved)})" if p.bytes_moved else ""
    print(f"migrated {p.bins_done} bins{moved} in {p.steps_done} steps at epochs "
          f"{p.epochs[0]}..{p.epochs[-1]}; routing version {plan.base_version} -> "
          f"{plan.end_version}")
    return 0


def _nothing_to_move(plan: MigrationPlan) -> int:
    """Report an empty plan, accepted and done at once; exit 0."""
    print(f"nothing to move: the plan moves no bin; routing version {plan.base_version} "
          "unchanged")
    return 0


def _print_layout(moves: list[Move], before: np.ndarray, after: np.ndarray) -> None:
    pairs = Counter((m.src, m.dst) for m in moves)
    for (src, dst), n in sorted(pairs.items()):
        print(f"  worker {src} -> {dst}: {n} bin{'s' if n != 1 else ''}")
    workers = sorted({int(w) for w in before} | {int(w) for w in after})
    rows = [[w, int((before == w).sum()), int((after == w).sum())] for w in workers]
    print("\n".join(table(["worker", "bins before", "bins after"], rows)))
