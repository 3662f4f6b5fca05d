"""Show a pipeline's state directory: workers, bins, keys, bytes and home host per worker, skew,
plans, and its hot keys (the committed heavy-hitter summary, when hot keys are watched).

Read-only: the state backends are opened read-only and no file under the directory changes,
so it is safe to run next to a running pipeline.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from megaphone.plans.report import human_bytes, skew, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``inspect``'s options."""
    parser.add_argument("--state-dir", required=True, metavar="DIR",
                        help="the pipeline's state directory (a checkpointed pipeline's too, while "
                        "stopped: its workers are read from this host's working copies or the "
                        "checkpoint; on a new host open the pipeline once first, see README)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def describe(state_dir: str) -> dict[str, Any]:
    """Everything ``inspect`` shows, as a JSON-ready dict (the ``--json`` output)."""
    from megaphone.migrator.epoch.state_reader import bin_sizes
    from megaphone.migrator.statedir.directory import StateDir
    from megaphone.plans.planner import per_worker_table

    state = StateDir.open(state_dir)
    fp = state.fingerprint
    routing = state.load_routing()
    commit = state.read_commit()
    metrics = state.read_metrics(last=GROUP_HISTORY)
    owners = routing.owners()
    sizes = bin_sizes(state, owners)
    workers = routing.workers()
    per_worker = per_worker_table(owners, sizes, None, workers)
    in_flight = []
    for item in commit.plans:
        plan = item.get("plan", {})
        steps = plan.get("steps", [])
        decided = item.get("decided")  # adaptive plans: the steps its policy chose so far
        in_flight.append({
            "strategy": plan.get("strategy"),
            "base_version": plan.get("base_version"),
            "steps": len(steps) if decided is None else len(decided),
            "bins": sum(len(s.get("moves", [])) for s in steps),
            "applied": item.get("applied", 0),
            "committed": item.get("committed", 0),
            **({"policy": plan.get("policy"),
                "bins_started": sum(len(s) for s in decided)} if decided is not None else {}),
        })
    return {
        "state_dir": str(state.path),
        "pipeline_id": fp.pipeline_id,
        "num_bins": fp.num_bins,
        "key_type": fp.key_type,
        "key": state.manifest.get("key"),
        "value": state.manifest.get("value"),
        "update": state.manifest.get("update"),
        "backend": state.manifest.get("backend"),
        "workers": workers,
        "per_worker": per_worker,
        "keys": int(sizes.keys.sum()),
        "bytes": int(sizes.bytes.sum()),
        "skew": {
            field: round(skew([float(r[field]) for r in per_worker.values()]), 4)
            for field in ("bins", "keys", "bytes")
        },
        "routing": {
            "version": routing.version,
            "versions": len(routing.versions),
            "latest_epoch": routing.latest_epoch,
            "initial_workers": routing.initial_workers,
        },
        "last_committed_epoch": commit.epoch,
        "state_version": commit.state_version,
        "pending_drops": len(commit.pending_drops),
        "plans_in_flight": in_flight,
        "hot_keys": hot_keys(commit.hot),
        "label": commit.label,
        "groups": groups(metrics),
        "homes": commit.homes,
        "hosts": {h: sum(home == h for home in commit.homes.values())
                  for h in sorted(set(commit.hosts) | set(commit.homes.values()))},
        "away": metrics[-1].get("away", []) if metrics else [],
    }


def hot_keys(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The committed hot-key summary as rows: key, records per epoch (smoothed), its error
    bound and its share of the records (a lower bound)."""
    from megaphone.plans.hot_keys import HeavyHitters

    hot = HeavyHitters.from_json(summary)
    return [{"key": k, "records": round(c, 1), "error": round(e, 1),
             "share": round(hot.share(k), 4)} for k, c, e in hot.counters]


#: Newest epochs whose groups ``inspect`` summarizes.
GROUP_HISTORY = 1000


def groups(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """How the newest epochs ran (docs/groups.md): ``epochs``, those run in groups of several
    (``grouped``), the groups' count and sizes, and the newest group (first epoch, size)."""
    firsts = [m for m in metrics if m.get("group") is not None and m["group"] == m["epoch"]]
    sizes = [int(m.get("group_size", 1)) for m in firsts]
    return {"epochs": len(metrics),
            "grouped": sum(1 for m in metrics if int(m.get("group_size", 1)) > 1),
            "groups": len(firsts), "mean_size": round(sum(sizes) / len(sizes), 2) if sizes
            else None, "max_size": max(sizes, default=None),
            "last": [firsts[-1]["epoch"], sizes[-1]] if firsts else None}


def render(info: dict[str, Any]) -> str:
    """The human-readable report of :func:`describe`'s output."""
    r = info["routing"]
    epoch = info["last_committed_epoch"]
    lines = [
        f"pipeline    {info['pipeline_id']}  ({info['state_dir']})",
        f"bins        {info['num_bins']}  key {info['key']!r} ({info['key_type']}), "
        f"update {info['update']}, backend {info['backend']}",
        f"workers     {len(info['workers'])}: {', '.join(map(str, info['workers']))}",
        f"routing     version {r['version']} ({r['versions']} version"
        f"{'s' if r['versions'] != 1 else ''}; newest in force from "
        f"epoch {r['latest_epoch']}; started on {r['initial_workers']} workers)",
        f"committed   {'no epoch yet' if epoch < 0 else f'epoch {epoch}'} "
        f"(state at routing version {info['state_version']}"
        + (f", {info['pending_drops']} bins to drop" if info["pending_drops"] else "") + ")",
    ]
    ahead = r["version"] - info["state_version"]
    if ahead > 0 and not info["plans_in_flight"]:
        lines.append(f"{'':<11} {ahead} routing version{'s' if ahead > 1 else ''} past the last "
                     "commit (left by a crash): discarded when the pipeline next opens")
    if info["plans_in_flight"]:
        for i, p in enumerate(info["plans_in_flight"]):
            steps = f"in {p['steps']} steps" if "policy" not in p else \
                f"({p['bins_started']} started in {p['steps']} steps its policy chose so far)"
            lines.append(
                f"{'in flight' if i == 0 else '':<11} {p['strategy']} plan from version "
                f"{p['base_version']}: {p['bins']} bins {steps}, "
                f"{p['applied']} applied, {p['committed']} committed"
            )
    else:
        lines.append("in flight   no plan")
    g = info["groups"]
    if g["groups"]:
        lines.append(f"groups      {g['groups']} of the last {g['epochs']} epochs' jobs ran "
                     f"groups (mean {g['mean_size']} epochs, largest {g['max_size']}; newest "
                     f"from epoch {g['last'][0]}, {g['last'][1]} epochs); last label "
                     f"{info['label']}")
    homes = info["homes"]
    rows = [[w, d["bins"], d["keys"], human_bytes(d["bytes"]), homes.get(str(w), "-")]
            for w, d in info["per_worker"].items()]
    rows.append(["total", info["num_bins"], info["keys"], human_bytes(info["bytes"]), ""])
    lines.append("")
    lines += table(["worker", "bins", "keys", "bytes", "home"], rows)
    if info["hosts"]:
        known = ", ".join(f"{h} ({n} homes)" for h, n in info["hosts"].items())
        lines.append(f"hosts       {known}; a new worker is homed on one with fewest homes")
    if info["away"]:
        lines.append(f"away        worker{'s' if len(info['away']) > 1 else ''} "
                     f"{', '.join(map(str, info['away']))} ran on another host than "
                     "its home in the last epoch")
    s = info["skew"]
    lines.append(f"skew (max/mean): bins {s['bins']:.2f}, keys {s['keys']:.2f}, "
                 f"bytes {s['bytes']:.2f}")
    if info["hot_keys"]:
        lines.append("")
        lines += table(["hot key", "records/epoch", "error", "share >="],
                       [[repr(h["key"]), h["records"], h["error"], f"{h['share']:.1%}"]
                        for h in info["hot_keys"][:8]])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the report (or JSON with ``--json``); exit 0."""
    info = describe(args.state_dir)
    print(json.dumps(info, indent=1) if args.json else render(info))
    return 0
