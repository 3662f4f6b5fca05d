"""Where workers' state is at home: the level above the routing table. The table decides bins
-> workers; a worker's *home* is the host whose store service keeps its working copy
(docs/placement.md). Engine-agnostic: hosts are opaque ids
(:func:`megaphone.state_backends.host.host_id`) and the runtime says where each task ran.

Homes change only by decision. A worker keeps its home while it has state; a worker that first
gets bins is homed where its task ran, because its first working copy was made there (homing
it elsewhere would move its bytes a second time, as a restore at the new home); only a worker
whose task's host is unknown is homed on the known host with the fewest homes. The spread of
new homes over hosts is therefore that of Spark's first tasks for them (docs/placement.md).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping


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
    hosts = sorted(set(out.values()) | set(ran_on.values()))
    count = Counter(out.values())
    for w in sorted(holding - set(out)):
        if not hosts:
            continue
        home = min(hosts, key=lambda h: (count[h], h))
        out[w] = home
        count[home] += 1
    return dict(sorted(out.items()))


def home_addresses(addresses: Mapping[int, list], before: Mapping[int, str],
                   homes: Mapping[int, str], ran_on: Mapping[int, str],
                   reported: Mapping[int, list]) -> dict[int, list]:
    """The address of each worker's service at its home after an epoch (``homes``; ``before``
    the epoch: ``addresses``): as a task that ran at home reported it (``reported``), else as
    known before if the home did not change."""
    out = {w: a for w, a in addresses.items() if w in homes and before.get(w) == homes[w]}
    out.update({w: a for w, a in reported.items() if w in homes and ran_on.get(w) == homes[w]})
    return dict(sorted(out.items()))


def away(homes: Mapping[int, str], ran_on: Mapping[int, str]) -> list[int]:
    """The workers whose task ran on a host other than their home."""
    return sorted(w for w, h in ran_on.items() if homes.get(w) not in (None, h))


__all__ = ["assign_homes", "away", "home_addresses", "homes_enforced"]
