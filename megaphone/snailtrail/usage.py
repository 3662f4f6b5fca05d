"""What an epoch's trace says about the time each worker worked: the inputs DS2 (useful
time) and the deadline policy's cost model (export, install and processing time) read.

A worker's useful time is the length of its work on its apply timeline (``begin``,
``install``, ``apply``, ``commit``, ``flush``, ``output``; ``schedule`` and ``wait`` are not
work), its export time the length of its ``export`` activities. The trace is the one record of
where an epoch's time went: ``megaphone explain`` ranks the same activities these sums are made
of, so a decision and its explanation never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from megaphone.snailtrail.activity import EpochTrace

#: A worker's activity kinds that are work (its useful time); the rest of its apply timeline
#: (``schedule``, ``wait``) is not.
WORK_KINDS = frozenset({"begin", "install", "apply", "commit", "flush", "output"})
#: The work a worker does for a migration rather than for its records.
EXPORT, INSTALL = "export", "install"


@dataclass(frozen=True)
class WorkerUsage:
    """One worker's seconds in one epoch, from its trace: ``useful_s`` (its work on its apply
    timeline, installing included), ``install_s`` (installing received bins), ``export_s``
    (exporting moving bins, on its export timeline) and ``waited_s`` (recorded waits)."""

    useful_s: float = 0.0
    install_s: float = 0.0
    export_s: float = 0.0
    waited_s: float = 0.0

    @property
    def processing_s(self) -> float:
        """Useful time apart from installing state: what the worker's records cost."""
        return max(0.0, self.useful_s - self.install_s)


def epoch_usage(trace: EpochTrace) -> dict[int, WorkerUsage]:
    """Every worker's :class:`WorkerUsage` in one epoch's trace, by worker."""
    totals: dict[int, dict[str, float]] = {}
    for a in trace.activities:
        if a.worker is None:
            continue
        row = totals.setdefault(a.worker, {"useful": 0.0, INSTALL: 0.0, EXPORT: 0.0, "wait": 0.0})
        if a.kind in WORK_KINDS:
            row["useful"] += a.duration
        if a.kind in (INSTALL, EXPORT, "wait"):
            row[a.kind] += a.duration
    return {w: WorkerUsage(r["useful"], r[INSTALL], r[EXPORT], r["wait"])
            for w, r in sorted(totals.items())}


def usage_by_epoch(traces: Iterable[EpochTrace]) -> dict[int, dict[int, WorkerUsage]]:
    """:func:`epoch_usage` of every trace, by epoch (of an epoch traced twice, the last)."""
    return {trace.epoch: epoch_usage(trace) for trace in traces}


__all__ = ["EXPORT", "INSTALL", "WORK_KINDS", "WorkerUsage", "epoch_usage", "usage_by_epoch"]
