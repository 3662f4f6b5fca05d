"""Where workers' state is at home: the level above the routing table. The table decides bins
-> workers; a worker's *home* is the host whose store service keeps its working copy
(docs/placement.md). Engine-agnostic: hosts are opaque ids
(:func:`megaphone.state_backends.host.host_id`) and the runtime says where each task ran.

Homes change only by decision. A worker keeps its home while it has state. A worker that first
gets bins is homed before that epoch (:func:`plan_homes`) on the host with the most free task
slots (:func:`emptiest_host`; with slots unknown, the fewest homes) among those with a store
service some task reported (:func:`known_hosts`): its task, wherever
it runs, makes its first working copy there (asking a known service of that host for its
shard's service if that one was not reported), and its bins arrive there home to home. With no
host known (the first epochs) it is homed where its task ran, because its first copy was made
there (docs/placement.md).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple


def homes_enforced() -> bool:
    """Whether tasks away from a worker's home use its store there (the default), or, with
    ``MEGAPHONE_PLACEMENT=0`` on the driver, their own host's copy as before homes existed
    (the placement benchmark's baseline; homes are still recorded)."""
    return os.environ.get("MEGAPHONE_PLACEMENT", "1") != "0"


def assign_homes(homes: Mapping[int, str], workers: Iterable[int],
                 ran_on: Mapping[int, str], unreachable: Iterable[int] = ()
                 ) -> dict[int, str]:
    """The homes after an epoch: those of ``homes`` whose worker is among ``workers`` (the
    workers that hold state), and one for each of ``workers`` without a home. A worker whose
    task could not reach its home (``unreachable``), or had none, used the copy where it ran
    (``ran_on``): that is its home now. One that ran nowhere known is homed on the known host
    (homes' and ``ran_on``'s) with the fewest homes; with no host known at all, it stays
    without a home until one is."""
    holding = set(workers)
    out = {w: h for w, h in homes.items() if w in holding}
    out.update({w: ran_on[w] for w in set(unreachable) | (holding - set(out))
                if w in holding and w in ran_on})
    out.update(home_new(out, holding, sorted(set(out.values()) | set(ran_on.values()))))
    return dict(sorted(out.items()))


def home_addresses(addresses: Mapping[int, list], before: Mapping[int, str],
                   homes: Mapping[int, str], ran_on: Mapping[int, str],
                   reported: Mapping[int, list], remote: Iterable[int] = ()) -> dict[int, list]:
    """The address of each worker's service at its home after an epoch (``homes``; ``before``
    the epoch: ``addresses``): as a task that used the store at home reported it
    (``reported``: one that ran there, or one that reached it over the network, ``remote``),
    else as known before if the home did not change."""
    reached = set(remote)
    out = {w: a for w, a in addresses.items() if w in homes and before.get(w) == homes[w]}
    out.update({w: a for w, a in reported.items() if w in homes and (
        ran_on.get(w) == homes[w] or (w in reached and before.get(w) == homes[w]))})
    return dict(sorted(out.items()))


def known_hosts(hosts: Mapping[str, Sequence[Any]],
                reports: Iterable[tuple[int, str, Sequence[Any]]],
                unreachable: Iterable[str] = ()) -> dict[str, list[Any]]:
    """Each host's store services (per shard, ``[host, port]`` or ``None``) after an epoch:
    ``hosts`` before it, less the hosts a task could not reach (``unreachable``: every address
    there is suspect), updated by the epoch's ``reports``: ``(worker, host id, [shards, host,
    port])`` of the service for the worker's shard (``worker % shards``) on the host its task
    ran on. A host reporting another number of shards than known starts afresh."""
    lost = set(unreachable)
    out = {h: list(services) for h, services in hosts.items() if h not in lost}
    for worker, host, (shards, addr, port) in sorted(reports, key=lambda r: (r[1], r[0])):
        services = out.get(host)
        if services is None or len(services) != shards:
            services = out[host] = [None] * shards
        services[worker % shards] = [addr, port]
    return dict(sorted(out.items()))


class PlannedHome(NamedTuple):
    """A home chosen for a new worker before its first epoch: the ``host``, the ``address``
    (host, port) of a store service there, and ``shard``: ``None`` when that service is the
    one for the worker's shard, else the worker's shard on that host, whose service's address
    the task away from home asks that service for (docs/placement.md)."""

    host: str
    address: tuple[str, int]
    shard: int | None = None


def emptiest_host(known: Sequence[str], count: Mapping[str, int],
                  slots: Mapping[str, int] | None = None) -> str:
    """The host of ``known`` (non-empty) a new worker is homed on: the most free task slots
    (``slots`` less ``count``, the homes there), then the fewest homes, then the host id. With
    the slots of any of ``known`` unknown, free slots are not compared (homes then host id):
    a guess at capacity would be worse than none."""
    room = slots if slots is not None and all(h in slots for h in known) else {}
    return min(known, key=lambda h: (count.get(h, 0) - room.get(h, 0), count.get(h, 0), h))


def home_new(homes: Mapping[int, str], workers: Iterable[int], known: Sequence[str],
             slots: Mapping[str, int] | None = None) -> dict[int, str]:
    """A host for each of ``workers`` without one in ``homes``, in worker order, each on
    :func:`emptiest_host` of ``known`` counting the homes given so far; none with no host
    known."""
    count = Counter(homes.values())
    out: dict[int, str] = {}
    for w in sorted(set(workers) - set(homes)) if known else ():
        out[w] = emptiest_host(known, count, slots)
        count[out[w]] += 1
    return out


def hosts_needed(workers: int, slots: Mapping[str, int]) -> int | None:
    """The fewest hosts whose task slots run ``workers`` tasks at once, the known hosts with the
    most slots first and each further host counted with the most slots any has; ``None`` with
    no slots known."""
    sizes = sorted((n for n in slots.values() if n > 0), reverse=True)
    if not sizes:
        return None
    covered = 0
    for used, n in enumerate(sizes, 1):
        covered += n
        if covered >= workers:
            return used
    return len(sizes) + math.ceil((workers - covered) / sizes[0])


def plan_homes(homes: Mapping[int, str], new: Iterable[int],
               hosts: Mapping[str, Sequence[Any]],
               slots: Mapping[str, int] | None = None) -> dict[int, PlannedHome]:
    """Homes for the ``new`` workers (those without one in ``homes`` that get bins), chosen
    before their first epoch: each, in worker order, on :func:`emptiest_host` (most free of
    ``slots``, the task slots per host, then fewest homes, then host id) among the ``hosts``
    (:func:`known_hosts`) with any known service, with the address of its service for the
    worker's shard if known, else of its first known service and the shard to ask it for.
    With no host known, no home is planned (each worker is homed where its task runs,
    :func:`assign_homes`). Existing homes never change."""
    known = sorted(h for h, services in hosts.items() if any(s is not None for s in services))
    out: dict[int, PlannedHome] = {}
    for w, host in home_new(homes, new, known, slots).items():
        services = hosts[host]
        shard = w % len(services)
        own = services[shard]
        if own is not None:
            out[w] = PlannedHome(host, (own[0], own[1]))
        else:
            addr, port = next(s for s in services if s is not None)
            out[w] = PlannedHome(host, (addr, port), shard)
    return out


def away(homes: Mapping[int, str], ran_on: Mapping[int, str]) -> list[int]:
    """The workers whose task ran on a host other than their home."""
    return sorted(w for w, h in ran_on.items() if homes.get(w) not in (None, h))


__all__ = ["PlannedHome", "assign_homes", "away", "emptiest_host", "home_addresses", "home_new",
           "homes_enforced", "hosts_needed", "known_hosts", "plan_homes"]
