"""Plan a rescale: a balanced migration to N workers (or to a target map), written as JSON.

Reads the state directory (read-only), picks a target that moves as little state as possible
and orders the moves by a strategy (all-at-once, fluid or batched), then prints a summary --
bins, keys and bytes moved, steps, the largest step, load per worker before and after, an
estimated duration, and the steps in order with the relief each brings -- and writes the plan
for ``megaphone migrate`` or ``megaphone.migrate``.
With ``--ds2`` it first decides the worker count the way the DS2 autoscaler would from the
recorded metrics of the last policy window, and prints the numbers behind that decision.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from megaphone.plans.plan import MigrationPlan
from megaphone.plans.relief import ORDERS
from megaphone.plans.report import arrow, human_bytes, human_rate, human_seconds, table
from megaphone.plans.strategies import BATCHED, DEADLINE, STRATEGIES
from megaphone.plans.targets import BALANCE_MODES


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``plan``'s options."""
    parser.add_argument("--state-dir", required=True, metavar="DIR",
                        help="the pipeline's state directory (a checkpointed pipeline's too, while "
                        "stopped: its workers are read from this host's working copies or the "
                        "checkpoint; on a new host open the pipeline once first, see README)")
    goal = parser.add_mutually_exclusive_group(required=True)
    goal.add_argument("--workers", type=_positive, metavar="N",
                      help="scale to workers 0..N-1, balanced (see --balance)")
    goal.add_argument("--target", metavar="FILE",
                      help='JSON target: {"bin": worker, ...} or a list of every bin\'s owner')
    goal.add_argument("--ds2", action="store_true",
                      help="print the rescale DS2 would decide now from the recorded metrics "
                           "(the last --window seconds); with -o also write its plan")
    parser.add_argument("--strategy", choices=STRATEGIES, default=None,
                        help="all-at-once: one step; fluid: one bin per step; batched: each "
                             "step a matching, one bin per worker (see --per-worker); "
                             "deadline: each epoch moves what still meets --target-latency "
                             "(adaptive, decided live); required with --workers/--target, "
                             "default fluid with --ds2")
    parser.add_argument("--target-latency", type=float, default=None, metavar="S",
                        help="deadline only: the latency target L in seconds")
    parser.add_argument("--gap", type=_non_negative, default=0, metavar="E",
                        help="idle epochs between steps (default 0)")
    parser.add_argument("--per-worker", type=_positive, default=1, metavar="K",
                        help="batched only: bins a worker may send or receive per step "
                             "(default 1)")
    parser.add_argument("--balance", choices=BALANCE_MODES, default=None,
                        help="what --workers balances: keys or bytes per bin, or load "
                             "(records per epoch estimated from the metrics); default keys "
                             "(load with --ds2)")
    parser.add_argument("--order", choices=ORDERS, default=None,
                        help="which steps go first: relief (those that most lower the largest "
                             "worker's records/epoch; the default when load is known) or bins "
                             "(bin order)")
    parser.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="where to write the plan (default plan.json; with --ds2 a plan "
                             "is written only when -o is given)")
    parser.add_argument("--window", type=float, default=10.0, metavar="S",
                        help="--ds2: the policy window, the last S seconds of recorded epochs "
                             "(default 10)")
    parser.add_argument("--source-rate", type=float, default=None, metavar="R",
                        help="--ds2: the input rate in records/s (default: measured from the "
                             "window's event times, or its wall time)")
    parser.add_argument("--json", action="store_true",
                        help="print the plan (with its summary in 'meta') as JSON")


def summary(meta: dict[str, Any], pipeline_id: str) -> str:
    """The human-readable summary of a plan's ``meta`` (as :func:`rescale` fills it)."""
    before, after = meta["workers_before"], meta["workers_after"]
    goal = "explicit target" if meta["balance"] == "explicit" else f"balanced by {meta['balance']}"
    how = meta["strategy"]
    if meta["strategy"] == BATCHED:
        k = meta["per_worker"]
        how += f" ({k} bin{'s' if k > 1 else ''} per worker per step)"
    if meta["strategy"] == DEADLINE:
        how += f" (target latency {meta['target_latency_s']:g} s)"
    lines = [
        f"plan for pipeline {pipeline_id}: {len(before)} -> {len(after)} workers, {goal}, "
        f"{how}, gap {meta['gap']}",
    ]
    if not meta["bins_moved"]:
        lines.append("moves       nothing: the layout already matches")
        return "\n".join(lines)
    total_bins = sum(d["bins"] for d in meta["before"].values())
    lines += [
        f"moves       {meta['bins_moved']} of {total_bins} bins, {meta['keys_moved']} keys, "
        f"{human_bytes(meta['bytes_moved'])}",
        f"steps       {meta['steps']} over {meta['epochs']} epochs; largest step "
        f"{meta['largest_step_bins']} bins, {human_bytes(meta['largest_step_bytes'])}"
        if meta["strategy"] != DEADLINE else
        "steps       decided live: each epoch moves the bins whose predicted cost still "
        "meets the target",
    ]
    est = meta.get("estimate")
    if est:
        lines.append(
            f"estimate    {human_seconds(est['transfer_s'])} of state transfer at "
            f"{human_rate(est['rate_bytes_per_s'])} ({est['rate_source']})"
            + (f", spread over {meta['epochs']} epochs" if meta["strategy"] != DEADLINE else "")
        )
    with_records = any("records" in d for d in meta["before"].values())
    headers = ["worker", "bins", "keys", "bytes"] + (["records/epoch"] if with_records else [])
    rows = []
    for w in meta["before"]:
        b, a = meta["before"][w], meta["after"][w]
        row = [w, arrow(b["bins"], a["bins"]), arrow(b["keys"], a["keys"]),
               arrow(human_bytes(b["bytes"]), human_bytes(a["bytes"]))]
        if with_records:
            row.append(arrow(f"{b.get('records', 0):.0f}", f"{a.get('records', 0):.0f}"))
        rows.append(row)
    lines.append("")
    lines += table(headers, rows)
    lines.append(f"skew (max/mean {meta['skew_field']}): {meta['skew_before']:.2f} -> "
                 f"{meta['skew_after']:.2f}")
    return "\n".join(lines)


#: Steps ``megaphone plan`` lists before it summarizes the rest.
SHOWN_STEPS = 12


def order_lines(plan: MigrationPlan, shown: int = SHOWN_STEPS) -> list[str]:
    """The plan's order and, per step (the first ``shown``), its bins, moves, the records per
    epoch it moves, the relief it brings the worker most loaded before it (records per epoch
    taken off it, and its load after) and the largest worker load after it, from
    ``plan.meta`` (:func:`rescale`)."""
    meta = plan.meta
    if "order" not in meta or plan.empty:
        return []
    head = f"order       {meta['order']}" + (f" ({meta['order_reason']})"
                                              if meta.get("order_reason") else "")
    relief = meta.get("relief")
    if plan.adaptive:
        return [head + "; the policy tries the moves in this order: "
                + ", ".join(str(m.bin) for m in plan.moves[:shown])
                + (" ..." if len(plan.moves) > shown else "")]
    if relief is None:
        return [head]
    rows = []
    for i, (step, r) in enumerate(zip(plan.steps[:shown], relief["steps"], strict=False)):
        pairs = sorted({(m.src, m.dst) for m in step.moves})
        rows.append([i, step.epoch, _listed([m.bin for m in step.moves]),
                     _listed([f"{a}->{b}" for a, b in pairs]), f"{r['records']:.1f}",
                     r["busiest"], f"{r['relief']:.1f}", f"{r['busiest_after']:.1f}",
                     f"{r['max_load']:.1f}"])
    lines = ["", f"{head}; largest worker load before: {relief['max_load_before']:.1f} "
             "records/epoch",
             "            relief: the records/epoch a step takes off the busiest worker "
             "before it",
             *table(["step", "epoch", "bins", "from->to", "moved", "busiest", "relief",
                     "its load after", "max load after"], rows)]
    if len(plan.steps) > shown:
        lines.append(f"... {len(plan.steps) - shown} more steps; max load after the last: "
                     f"{relief['steps'][-1]['max_load']:.1f}")
    return lines


def _listed(items: list[Any], most: int = 4) -> str:
    """``items`` joined by commas, the first ``most`` and a count of the rest."""
    text = ",".join(str(x) for x in items[:most])
    return text + (f",+{len(items) - most}" if len(items) > most else "")


def run(args: argparse.Namespace) -> int:
    """Plan, print the summary (or the plan as JSON) and write the plan; exit 0."""
    from megaphone.migrator.pipeline.api import rescale
    from megaphone.plans.plan import PlanError

    if args.ds2:
        return run_ds2(args)
    if args.strategy is None:
        raise PlanError("--strategy is required with --workers or --target")
    if args.per_worker != 1 and args.strategy != BATCHED:
        raise PlanError("--per-worker applies only to --strategy batched")
    if (args.target_latency is not None) != (args.strategy == DEADLINE):
        raise PlanError("--target-latency is needed by, and only used by, --strategy deadline")
    args.output = args.output or "plan.json"
    plan = rescale(args.state_dir, workers=args.workers, strategy=args.strategy, gap=args.gap,
                   balance=args.balance or "keys", per_worker=args.per_worker,
                   target=args.target, target_latency=args.target_latency, order=args.order)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=1))
    else:
        print("\n".join([summary(plan.meta, plan.fingerprint.pipeline_id),
                         *order_lines(plan)]))
    plan.save(args.output)  # an empty one too: `plan && migrate` then moves nothing, exit 0
    if not args.json and plan.empty:
        print(f"nothing to move: wrote {args.output}, an empty plan (migrate accepts it and "
              "does nothing)")
    elif not args.json:
        print(f"wrote {args.output} (routing version {plan.base_version} -> "
              f"{plan.end_version}); apply it with: megaphone migrate {args.output} "
              f"--state-dir {args.state_dir}")
    return 0


def run_ds2(args: argparse.Namespace) -> int:
    """``plan --ds2``: print DS2's decision on the last window; with ``-o`` write its plan."""
    from megaphone.migrator.control.plan_inputs import state_dir_source
    from megaphone.plans.autoscale import Policy
    from megaphone.plans.plan import PlanError
    from megaphone.plans.planner import plan_from
    from megaphone.plans.scale_decision import decide_once, explain

    if args.window <= 0:
        raise PlanError(f"--window must be > 0 seconds, got {args.window}")
    policy = Policy(interval_s=args.window, strategy=args.strategy or "fluid", gap=args.gap,
                    per_worker=args.per_worker, balance=args.balance or "load")
    if args.per_worker != 1 and policy.strategy != BATCHED:
        raise PlanError("--per-worker applies only to --strategy batched")
    source = state_dir_source(args.state_dir)
    table = source.table
    decision = decide_once(source.metrics, len(table.workers()), policy,
                           source_rate=args.source_rate, num_bins=table.num_bins,
                           in_flight=source.in_flight, traces=source.traces,
                           hosts=source.hosts)
    if args.json:
        print(json.dumps(decision.to_dict(), indent=1))
    else:
        print(f"DS2 for pipeline {table.fingerprint.pipeline_id}")
        print(explain(decision))
    if args.output is None or decision.action != "scale":
        if args.output is not None and not args.json:
            print("no plan written: DS2 does not rescale now")
        return 0
    plan = plan_from(source, workers=decision.target, **policy.plan_options(), order=args.order)
    plan.save(args.output)
    if plan.empty:
        if not args.json:
            print(f"nothing to move: wrote {args.output}, an empty plan")
        return 0
    if not args.json:
        print()
        print("\n".join([summary(plan.meta, plan.fingerprint.pipeline_id),
                         *order_lines(plan)]))
        print(f"wrote {args.output} (routing version {plan.base_version} -> "
              f"{plan.end_version}); apply it with: megaphone migrate {args.output} "
              f"--state-dir {args.state_dir}")
    return 0
