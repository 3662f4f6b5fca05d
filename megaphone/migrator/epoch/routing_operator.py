"""The routing operator F of an epoch: who owns what, and which state moves where.

Engine-agnostic: from the routing table and the last commit it derives, for epoch ``e``, the
bins each worker installs, the bins each old owner ships and to whom, the bins left behind
by the previous epoch's moves that their old owners now delete, and the workers that run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megaphone.migrator.statedir.commit import Commit, StreamPosition
from megaphone.migrator.statedir.directory import StateDir
from megaphone.migrator.task.spec import EpochSpec
from megaphone.plans.hot_keys import committed_summary
from megaphone.records import WorkerMetrics
from megaphone.routing.placement import (
    PlannedHome,
    assign_homes,
    home_addresses,
    homes_enforced,
    known_hosts,
    plan_homes,
)
from megaphone.routing.table import Move, RoutingTable
from megaphone.state_backends.durable import SNAPSHOT_EVERY


@dataclass(frozen=True)
class EpochLayout:
    """Where state is and goes at one epoch (see the module docstring)."""

    epoch: int
    version: int
    moves: tuple[Move, ...]
    live: frozenset[int]
    incoming: dict[int, tuple[int, ...]]
    outgoing: dict[int, tuple[tuple[int, int], ...]]
    drops: dict[int, tuple[int, ...]]
    partitions: int


def epoch_layout(table: RoutingTable, commit: Commit, epoch: int, state: StateDir
                 ) -> EpochLayout:
    """The layout of ``epoch``: moves from the committed state version to the one in force.

    The workers that may hold state get a partition too, so a worker left without bins can
    release its storage: those with a folder in ``state``, or with a checkpoint location
    (working copies on the hosts) every worker that ever owned a bin.
    """
    version = table.version_at(epoch)
    moves = tuple(table.moves_between(commit.state_version, version))
    live = frozenset(int(w) for w in set(table.owners(epoch).tolist()))
    incoming: dict[int, list[int]] = {}
    outgoing: dict[int, list[tuple[int, int]]] = {}
    for m in moves:
        incoming.setdefault(m.dst, []).append(m.bin)
        outgoing.setdefault(m.src, []).append((m.bin, m.dst))
    drops: dict[int, list[int]] = {}
    for b, w in commit.pending_drops:
        drops.setdefault(w, []).append(b)
    existing = table.all_workers() if state.manifest.get("checkpoint") is not None \
        else state.worker_ids()
    involved = set(live) | set(incoming) | set(outgoing) | set(drops) | set(existing)
    return EpochLayout(
        epoch=epoch,
        version=version,
        moves=moves,
        live=live,
        incoming={w: tuple(b) for w, b in incoming.items()},
        outgoing={w: tuple(p) for w, p in outgoing.items()},
        drops={w: tuple(b) for w, b in drops.items()},
        partitions=max(involved) + 1,
    )


def epoch_spec(state: StateDir, layout: EpochLayout, commit: Commit, table: RoutingTable,
               **fields: Any) -> EpochSpec:
    """The one builder of an epoch's task spec, live and offline: what the layout and the
    last commit decide (what each worker installs, ships and drops, what the commit left
    behind), the state directory's identity and checkpoint location (its manifest's), with one
    what its tasks need to reach each worker's home (docs/placement.md: the pipeline's secret
    and the homes with their services' addresses), and the caller's ``fields`` (the update, the
    shuffle, a group's labels...)."""
    fp = state.fingerprint
    placed: dict[str, Any] = {}
    if state.manifest.get("checkpoint"):
        new = new_homes(layout, commit)  # the homes new in this epoch too
        placed = {"secret": state.secret(),
                  "homes": {**commit.home_services(),
                            **{w: (p.host, p.address) for w, p in new.items()}}
                  if homes_enforced() else {},
                  "siblings": {w: p.shard for w, p in new.items() if p.shard is not None}}
    return EpochSpec(
        epoch=layout.epoch, incoming=layout.incoming, outgoing=layout.outgoing,
        drops=layout.drops, live=layout.live, committed_tokens=commit.worker_tokens(),
        committed_owners=frozenset(table.workers(commit.epoch)) if commit.epoch >= 0
        else frozenset(),
        state_dir=str(state.path.absolute()), backend=state.manifest["backend"],
        key_type=fp.key_type, num_bins=fp.num_bins, pipeline_id=fp.pipeline_id,
        checkpoint=state.manifest.get("checkpoint"),
        snapshot_every=state.manifest.get("snapshot_every", SNAPSHOT_EVERY),
        **fields, **placed)


def new_homes(layout: EpochLayout, commit: Commit) -> dict[int, PlannedHome]:
    """The homes chosen before ``layout``'s epoch for the workers that get bins in it and have
    no home yet (:func:`~megaphone.routing.placement.plan_homes` on the hosts ``commit``
    knows), with a service's address there; a function of the last commit and the layout, so
    the task spec and the epoch's commit record agree, and a re-run chooses alike."""
    if not homes_enforced():
        return {}
    return plan_homes(commit.worker_homes(), layout.live | set(layout.incoming), commit.hosts,
                      commit.slots)


def commit_record(layout: EpochLayout, stream: StreamPosition, plans: list[dict[str, Any]],
                  per_worker: Mapping[int, WorkerMetrics], before: Commit,
                  slots: Callable[[Sequence[str]], dict[str, int]] | None = None) -> Commit:
    """The driver's commit record of the epoch (its fields: :class:`Commit`), carried on from
    ``before`` with what the workers reported. A new worker's home is the one chosen before
    the epoch (:func:`new_homes`) unless its task could not reach it; a chosen address is kept
    only if it is the worker's shard's, else the one the worker's task reported. The task
    slots of the known hosts are ``slots(hosts)`` (without it, ``before``'s for the hosts still
    known)."""
    chosen = new_homes(layout, before)
    hosts, homes_before = ran_on(per_worker), {**before.worker_homes(),
                                               **{w: p.host for w, p in chosen.items()}}
    unreachable = [w for w, m in per_worker.items() if m.home_unreachable]
    homes = assign_homes(homes_before, layout.live | {m.src for m in layout.moves}, hosts,
                         unreachable)
    addresses = home_addresses({**{int(w): a for w, a in before.addresses.items()},
                                **{w: list(p.address) for w, p in chosen.items()
                                   if p.shard is None}}, homes_before,
                               homes, hosts, {w: m.address for w, m in per_worker.items()
                                              if m.address is not None},
                               [w for w, m in per_worker.items() if m.remote])
    services = known_hosts(
        before.hosts, [(w, hosts[w], m.service) for w, m in per_worker.items()
                       if w in hosts and m.service],
        [homes_before[w] for w in unreachable if w in homes_before])
    known = sorted(set(services) | set(homes.values()))
    times = [m.max_event_time for m in per_worker.values() if m.max_event_time is not None]
    if before.max_event_time is not None:
        times.append(before.max_event_time)
    return Commit(epoch=layout.epoch, state_version=layout.version,
                  pending_drops=[[m.bin, m.src] for m in layout.moves], stream=stream,
                  plans=plans, tokens={str(w): m.token for w, m in per_worker.items()
                                       if m.token},
                  max_event_time=max(times) if times else None, label=before.label,
                  hot=committed_summary(before.hot, (m.hot for m in per_worker.values())),
                  homes={str(w): h for w, h in homes.items()},
                  addresses={str(w): list(a) for w, a in addresses.items()}, hosts=services,
                  slots=slots(known) if slots is not None else
                  {h: n for h, n in before.slots.items() if h in known})


def ran_on(per_worker: Mapping[int, WorkerMetrics]) -> dict[int, str]:
    """The host each worker's apply task ran on, for the workers that reported one."""
    return {w: m.host for w, m in per_worker.items() if m.host}

