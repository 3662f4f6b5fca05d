"""Each epoch's SnailTrail trace (:class:`~megaphone.snailtrail.activity.EpochTrace`), built on
the driver from timings the epoch takes anyway, and kept in the state directory
(:meth:`~megaphone.migrator.statedir.directory.StateDir.append_trace`; README, "Explaining slow
epochs").

Nothing is timed per record: the driver notes the wall clock at each of its phases, every
apply task at its phase boundaries (:data:`~megaphone.migrator.task.state_operator.MARKS`) and
every exporter around each bin it ships. Clocks of different hosts may disagree: a worker's
activities are clamped to follow each other and a dependency that would run backwards is left
out, so a trace is always valid.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from megaphone.records import EpochMetrics, WorkerMetrics
from megaphone.snailtrail import Activity, Dependency, EpochTrace

#: The driver's phases and the activity kind each becomes.
DRIVER_KINDS = {"admit": "admit", "layout": "layout", "submit": "submit", "collect": "wait",
                "commit": "commit", "cleanup": "cleanup"}


def trace_enabled() -> bool:
    """Whether epochs are traced: unless the environment sets ``MEGAPHONE_TRACE=0``."""
    return os.environ.get("MEGAPHONE_TRACE", "1") != "0"


def take_marks(record: EpochMetrics) -> dict[int, WorkerMetrics]:
    """The workers' timing marks, taken out of ``record`` (they are not stored as metrics):
    per worker, a :class:`~megaphone.records.WorkerMetrics` holding only ``marks``,
    ``export_spans`` and ``store_commit_s``."""
    out = {}
    for worker, m in record.per_worker.items():
        if m.marks is not None or m.export_spans is not None:
            out[worker] = WorkerMetrics(marks=m.marks, export_spans=m.export_spans,
                                        store_commit_s=m.store_commit_s)
            m.marks = m.export_spans = None
    return out


class _Builder:
    """Activities and dependencies of one epoch, numbered as they are added; each timeline's
    activities are clamped to follow one another."""

    def __init__(self) -> None:
        self.activities: list[Activity] = []
        self.dependencies: list[Dependency] = []
        self._last_end: dict[tuple[int | None, int], float] = {}

    def add(self, kind: str, worker: int | None, start: float, end: float, *, lane: int = 0,
            bin_: int | None = None) -> Activity:
        """Append an activity; it starts no earlier than its timeline's last one ended."""
        start = max(start, self._last_end.get((worker, lane), start))
        end = max(end, start)
        self._last_end[(worker, lane)] = end
        a = Activity(len(self.activities), kind, worker, start, end, bin=bin_, lane=lane)
        self.activities.append(a)
        return a

    def depend(self, src: Activity | None, dst: Activity | None, kind: str) -> None:
        """Add ``src`` -> ``dst`` if both exist and ``dst`` starts after ``src`` ends."""
        if src is not None and dst is not None and dst.start >= src.end:
            self.dependencies.append(Dependency(src.id, dst.id, kind))


def _worker_activities(b: _Builder, worker: int, marks: Mapping[str, float],
                       store_commit_s: float | None, submitted: float,
                       install_bin: int | None) -> tuple[Activity, Activity | None, Activity]:
    """One apply task's activities: ``(schedule, install or None, last)``."""
    task = marks["task"]
    schedule = b.add("schedule", worker, min(submitted, task), task)
    b.add("begin", worker, task, marks.get("begun", task))
    install = None
    if "installed" in marks:
        begun, installed = marks.get("begun", task), marks["installed"]
        waited = min(max(marks.get("install_wait", 0.0), 0.0), max(installed - begun, 0.0))
        if waited > 0:
            b.add("wait", worker, begun, begun + waited)
        install = b.add("install", worker, begun + waited, installed, bin_=install_bin)
        applied = marks.get("applied", installed)
        b.add("apply", worker, installed, applied)
        committed = marks.get("committed", applied)
        flush = min(max(store_commit_s or 0.0, 0.0), max(committed - applied, 0.0))
        b.add("commit", worker, applied, committed - flush)
        if flush > 0:
            b.add("flush", worker, committed - flush, committed)
        last = b.add("output", worker, committed, marks.get("end", committed))
    else:  # replayed: the stored outputs re-emitted
        last = b.add("output", worker, marks.get("begun", task), marks.get("end", task))
    return schedule, install, last


def epoch_trace(epoch: int, driver: Mapping[str, tuple[float, float]],
                workers: Mapping[int, WorkerMetrics],
                outgoing: Mapping[int, Iterable[tuple[int, int]]],
                incoming: Mapping[int, Iterable[int]]) -> EpochTrace:
    """The trace of ``epoch`` from the driver's phases (``driver``: phase -> wall-clock
    ``(start, end)``), the workers' marks (:func:`take_marks`) and the layout's moves
    (``outgoing``: sender -> ``(bin, receiver)`` pairs; ``incoming``: receiver -> bins)."""
    b = _Builder()
    phases: dict[str, Activity] = {}
    for phase, kind in DRIVER_KINDS.items():
        if phase in driver:
            start, end = driver[phase]
            phases[phase] = b.add(kind, None, start, end)
    submit = phases.get("submit")
    submitted = submit.end if submit is not None else min(
        (m.marks["task"] for m in workers.values() if m.marks), default=0.0)
    installs: dict[int, Activity | None] = {}
    for worker, m in sorted(workers.items()):
        if not m.marks or "task" not in m.marks:
            continue
        bins = tuple(incoming.get(worker, ()))
        schedule, installs[worker], last = _worker_activities(
            b, worker, m.marks, m.store_commit_s, submitted, bins[0] if len(bins) == 1 else None)
        b.depend(submit, schedule, "schedule")
        b.depend(last, phases.get("commit"), "comm")
    for sender, m in sorted(workers.items()):
        receiver = dict(outgoing.get(sender, ()))
        for i, (bin_, start, end) in enumerate(m.export_spans or ()):
            export = b.add("export", sender, start, end, lane=1, bin_=int(bin_))
            if i == 0:
                b.depend(submit, export, "schedule")
            b.depend(export, installs.get(receiver.get(int(bin_), -1)), "shuffle")
    return EpochTrace(epoch, tuple(b.activities), tuple(b.dependencies))

