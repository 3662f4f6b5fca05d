"""The deadline policy's cost model: an epoch's duration predicted from per-worker costs
learned online from recent epoch metrics (:class:`CostModel`).

An epoch is one Spark job of two stages, the senders' exports and then every worker's install
and processing; a stage takes its busiest worker's time or its total over the task slots,
whichever is longer (:func:`stages_s`), per host when the workers' homes and the hosts' slots
are known (:class:`Slots`). Epochs run as a group (docs/groups.md) share one job:
the job's overhead is learned from the group as a whole and charged once per group, each
epoch paying its share (``group_size``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median

from megaphone.records import EpochMetrics, WorkerMetrics
from megaphone.routing.placement import home_new
from megaphone.snailtrail import EpochTrace
from megaphone.snailtrail.usage import WorkerUsage, usage_by_epoch

EXPORT, APPLY = 0, 1
"""The two stages of an epoch's job: the senders' exports, then installs and processing."""
Work = Mapping[tuple[int, int], float]
"""Seconds of work per ``(stage, worker)``."""


@dataclass(frozen=True)
class Slots:
    """Where an epoch's tasks run at once: ``parallelism`` task slots in all and, when known,
    each worker's home (``homes``) and each host's slots (``host_slots``), so that workers at
    home on one host share that host's slots (docs/placement.md)."""

    parallelism: int = 1
    homes: Mapping[int, str] = field(default_factory=dict)
    host_slots: Mapping[str, int] = field(default_factory=dict)

    def placed(self, workers: Iterable[int]) -> dict[int, str] | None:
        """The host of each of ``workers``: its home, or for one without a home where it would
        be homed (:func:`~megaphone.routing.placement.emptiest_host`); ``None`` when the slots
        of a host are unknown (then the stage is counted over ``parallelism``)."""
        workers = list(workers)
        if not self.host_slots or any(w in self.homes and self.homes[w] not in self.host_slots
                                      for w in workers):
            return None
        return {**{w: self.homes[w] for w in workers if w in self.homes},
                **home_new(self.homes, workers, sorted(self.host_slots), self.host_slots)}

    def stage_s(self, times: Mapping[int, float]) -> float:
        """A stage of ``times`` (seconds per worker): per host, its busiest worker's time or its
        total over the host's slots, whichever is longer, and the busiest host; without hosts,
        the same over all workers and ``parallelism``."""
        hosts = self.placed(times)
        if hosts is None:
            return max(max(times.values(), default=0.0),
                       sum(times.values()) / max(1, self.parallelism))
        per_host: dict[str, list[float]] = defaultdict(list)
        for w, t in times.items():
            per_host[hosts[w]].append(t)
        return max((max(max(ts), sum(ts) / self.host_slots[h]) for h, ts in per_host.items()),
                   default=0.0)


def stages_s(work: Work, parallelism: int | Slots = 1) -> float:
    """Time of the stages one after the other; a stage takes its busiest worker's time or its
    total over the task slots, whichever is longer (:meth:`Slots.stage_s`)."""
    slots = parallelism if isinstance(parallelism, Slots) else Slots(parallelism)
    return sum(slots.stage_s({w: t for (s, w), t in work.items() if s == stage})
               for stage in (EXPORT, APPLY))


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return median(values) if values else None


@dataclass(frozen=True)
class _WorkerTimes:
    """What the model reads of one worker in one epoch: its counts (from the metrics) and its
    times (from the trace, or the metrics); a time is None when not measured."""

    records_in: int
    bytes_in: int
    bytes_out: int
    useful_s: float | None
    install_s: float | None
    export_s: float | None

    @property
    def processing_s(self) -> float:
        """Busy time apart from installing state."""
        return max(0.0, (self.useful_s or 0.0) - (self.install_s or 0.0))


@dataclass(frozen=True)
class _Timed:
    """One epoch as the model reads it."""

    duration_s: float
    bytes_moved: int
    per_worker: Mapping[int, _WorkerTimes]


def _timed(m: EpochMetrics, usage: Mapping[int, WorkerUsage] | None) -> _Timed:
    """The epoch's counts from its metrics and its times from ``usage`` (its trace) if given.
    A worker the trace shows nothing of did no work it timed (an exporter-only row keeps
    its unmeasured useful time as None)."""
    rows = {}
    for w, wm in m.per_worker.items():
        times: tuple[float | None, float | None, float | None]
        if usage is None:
            times = (wm.useful_s, wm.install_s, wm.export_s)
        else:
            u = usage.get(int(w), WorkerUsage())
            times = (None if wm.useful_s is None else u.useful_s,
                     u.install_s if wm.install_s is not None else None,
                     u.export_s if wm.export_s is not None else None)
        rows[int(w)] = _WorkerTimes(int(wm.records_in or 0), int(wm.bytes_in or 0),
                                    scanned_out(wm), *times)
    return _Timed(float(m.duration_s), int(m.bytes_moved or 0), rows)


@dataclass(frozen=True)
class CostModel:
    """Costs in seconds learned from recent epochs (medians, so one slow epoch does not rule).

    ``overhead_s``: a job's time outside the workers' stages (scheduling, the records'
    shuffle), per job: an epoch alone pays it all, an epoch of a group of ``G`` a ``G``-th.
    Per worker:
    ``per_record_s`` processing per record, ``records`` records per epoch, and per byte of
    state ``export_s_per_byte`` at the sender and ``install_s_per_byte`` at the receiver.
    What moving epochs took beyond that is split (:func:`fixed_and_per_byte`) into
    ``move_overhead_s``, paid once by a job that moves anything (its export stage, the files'
    round trips), and ``ship_s_per_byte`` (the shuffle): charged all per byte, a 0.1 s fixed
    cost held a billion-key move at one bin an epoch. Workers never
    measured get the median of the others. ``epochs_traced``: how many of the epochs seen
    gave their times from a trace.
    """

    overhead_s: float
    per_record_s: Mapping[int, float]
    records: Mapping[int, float]
    export_s_per_byte: Mapping[int, float]
    install_s_per_byte: Mapping[int, float]
    ship_s_per_byte: float
    epochs_seen: int
    transfers_seen: int
    epochs_traced: int = 0
    move_overhead_s: float = 0.0

    @classmethod
    def fit(cls, history: Iterable[EpochMetrics], parallelism: int | Slots = 1,
            window: int = 20, traces: Iterable[EpochTrace] = ()) -> CostModel:
        """Fit the model to the newest ``window`` epochs of ``history`` (metrics records).

        Per worker only rows with useful time count (a worker that only exported state has
        none): its records, its time per record and its export and install times per byte.
        Records and bytes come from the metrics; the times from the epoch's SnailTrail trace
        when ``traces`` holds it (:func:`~megaphone.snailtrail.usage.epoch_usage`), else from
        the metrics too.
        """
        usage = usage_by_epoch(traces)
        rows = [(m, usage.get(m.epoch)) for m in history if m.per_worker][-window:]
        recent = [_timed(m, u) for m, u in rows]
        per_record: dict[int, list[float]] = defaultdict(list)
        records: dict[int, list[float]] = defaultdict(list)
        export: dict[int, list[float]] = defaultdict(list)
        install: dict[int, list[float]] = defaultdict(list)
        for m in recent:
            for w, wm in m.per_worker.items():
                if wm.useful_s is None:  # an exporter-only row: no processing measured
                    continue
                n = int(wm.records_in or 0)
                records[w].append(n)
                if n:
                    per_record[w].append(wm.processing_s / n)
                if wm.bytes_out and wm.export_s is not None:
                    export[w].append(wm.export_s / wm.bytes_out)
                if wm.bytes_in and wm.install_s is not None:
                    install[w].append(wm.install_s / wm.bytes_in)

        def outside(m: _Timed) -> float:
            work = {}
            for w, wm in m.per_worker.items():
                work[EXPORT, w] = wm.export_s or 0.0
                work[APPLY, w] = wm.processing_s + (wm.install_s or 0.0)
            return m.duration_s - stages_s(work, parallelism)

        jobs = _jobs([m for m, _ in rows])
        outsides = [(sum(outside(recent[i]) for i in job),
                     sum(recent[i].bytes_moved for i in job)) for job in jobs]
        quiet = [o for o, moved in outsides if not moved]
        overhead = max(0.0, _median(quiet) or _median(o for o, _ in outsides) or 0.0)
        moving = [(o, moved) for o, moved in outsides if moved]
        fixed, ship = fixed_and_per_byte([(max(0.0, o - overhead), moved) for o, moved in moving])
        return cls(
            overhead_s=overhead,
            per_record_s={w: median(v) for w, v in per_record.items()},
            records={w: median(v) for w, v in records.items()},
            export_s_per_byte={w: median(v) for w, v in export.items()},
            install_s_per_byte={w: median(v) for w, v in install.items()},
            ship_s_per_byte=ship,
            epochs_seen=len(recent),
            transfers_seen=len(moving),
            epochs_traced=sum(u is not None for _, u in rows),
            move_overhead_s=fixed,
        )

    @staticmethod
    def _of(costs: Mapping[int, float], worker: int) -> float:
        if worker in costs:
            return costs[worker]
        return median(costs.values()) if costs else 0.0

    def record_s(self, worker: int) -> float:
        """Predicted processing time of one record at ``worker``."""
        return self._of(self.per_record_s, worker)

    def processing_s(self, worker: int) -> float:
        """Predicted processing time of ``worker``'s records next epoch."""
        return self.record_s(worker) * self.records.get(worker, 0.0)

    def export_s(self, worker: int, nbytes: float) -> float:
        """Predicted time for ``worker`` to export ``nbytes`` of state."""
        return self._of(self.export_s_per_byte, worker) * nbytes

    def install_s(self, worker: int, nbytes: float) -> float:
        """Predicted time to ship ``nbytes`` of state to ``worker`` and install it there."""
        return (self._of(self.install_s_per_byte, worker) + self.ship_s_per_byte) * nbytes

    def epoch_s(self, work: Work, parallelism: int | Slots = 1, group_size: int = 1) -> float:
        """Predicted epoch duration for ``work`` (seconds per stage and worker), in a job of its
        own or as one of ``group_size`` epochs of a group (its share of the job's overhead);
        ``work`` with an export stage moves state and pays :attr:`move_overhead_s` too."""
        moving = any(stage == EXPORT for stage, _ in work)
        return (self.overhead_s + self.move_overhead_s * moving) / max(1, group_size) \
            + stages_s(work, parallelism)

    def replay_s(self, record: EpochMetrics, parallelism: int | Slots = 1,
                 moved: bool = True) -> float:
        """The duration this model predicts for a recorded epoch, from its records and the
        bytes each worker sent and received (none if not ``moved``: the epoch without its
        transfers)."""
        work: dict[tuple[int, int], float] = {}
        moved = moved and bool(record.bytes_moved)
        for w, wm in record.per_worker.items():
            w = int(w)
            if moved:
                work[EXPORT, w] = self.export_s(w, scanned_out(wm))
            work[APPLY, w] = (self.record_s(w) * (wm.records_in or 0)
                              + (self.install_s(w, wm.bytes_in or 0) if moved else 0.0))
        return self.epoch_s(work, parallelism, record.group_size or 1)


#: Two moving epochs tell a per-byte cost from a fixed one only if one moved this many times
#: the other's bytes (bins of one size differ by a few percent: noise, not a slope).
DISTINCT = 1.5


def fixed_and_per_byte(extra: list[tuple[float, int]]) -> tuple[float, float]:
    """``(fixed seconds, seconds per byte)`` of moving epochs' ``(extra seconds, bytes moved)``:
    the slope is the median of the pairwise slopes (Theil-Sen: one slow epoch does not rule),
    the fixed part the median of what the slope leaves; both at least 0. Epochs that all moved
    about the same bytes cannot tell the two apart: all is fixed until an epoch moves
    :data:`DISTINCT` times more (the deadline policy grows its moves by at most twice the most
    bins moved recently, so it learns the slope before it relies on it)."""
    slopes = [(e2 - e1) / (b2 - b1) for i, (e1, b1) in enumerate(extra)
              for e2, b2 in extra[i + 1:] if max(b1, b2) >= DISTINCT * min(b1, b2)]
    per_byte = max(0.0, _median(slopes) or 0.0)
    fixed = _median(e - per_byte * b for e, b in extra)
    return max(0.0, fixed or 0.0), per_byte


def written_ahead(history: Sequence[EpochMetrics]) -> frozenset[int]:
    """The bins whose senders held their files written ahead at the newest epoch's commit
    (docs/transfer.md, "Bins written ahead"); empty without one."""
    if not history:
        return frozenset()
    return frozenset(int(b) for wm in history[-1].per_worker.values()
                     for b in (wm.ahead_bins or ()))


def ahead_pending(history: Sequence[EpochMetrics]) -> int | None:
    """Bins named to write ahead that no sender had written yet at the newest epoch's commit;
    ``None`` where no store of it writes bins ahead (or without an epoch)."""
    counts = [wm.ahead_pending for wm in history[-1].per_worker.values()
              if wm.ahead_pending is not None] if history else []
    return sum(counts) if counts else None


def compacting(m: EpochMetrics) -> bool:
    """Whether some worker's store was compacting (a compaction running or due) at the commit
    of epoch ``m``. Such an epoch's moves took longer: at the billion-key move, 10 bins added
    0.3-0.6 s to an epoch while a sender compacted against 0.1-0.2 s before, with epochs
    without moves unchanged (docs/transfer.md, "The senders' compaction")."""
    return any(wm.compacting for wm in m.per_worker.values())


#: The percentile of measured over replayed time that calibrates predictions: a latency target
#: holds for every epoch, and at the 75th a billion-key move's epochs beside a compaction
#: reached 1.23x their prediction (bench/RESULTS.md).
CALIBRATION_PERCENTILE = 90
#: Moving epochs measured in the next epoch's regime (a store compacting or none) before the
#: calibration learns from them alone (:func:`calibration`).
REGIME_EPOCHS = 2


def calibration(model: CostModel, history: Sequence[EpochMetrics], parallelism: Slots,
                window: int, compacting_now: bool) -> tuple[float, int]:
    """How much longer than ``model`` replays it moving made an epoch, and how many epochs that
    tells from the next epoch's regime.

    Over the moving epochs of the newest ``window``, each epoch's measured time beyond the
    model's epoch without moves, over the time the model replays for its moves: their
    :data:`CALIBRATION_PERCENTILE` (never below 1; 1 without any). Only the epochs whose
    commit found a store compacting as the newest one did (``compacting_now``) count, once there are
    :data:`REGIME_EPOCHS` of them; before that, all. A slow moving epoch only scales what
    moves add: scaling the whole prediction kept a pipeline idling at half its target
    "behind" for 20 epochs (bench/RESULTS.md, "The billion-key move, bins written ahead")."""
    ratios: dict[bool, list[float]] = {False: [], True: []}
    for m in history[-window:]:
        if m.bytes_moved and m.per_worker:
            idle = model.replay_s(m, parallelism, moved=False)
            added = model.replay_s(m, parallelism) - idle
            if added > 0:
                ratios[compacting(m)].append((m.duration_s - idle) / added)
    same = ratios[compacting_now]
    pool = sorted(same if len(same) >= REGIME_EPOCHS else same + ratios[not compacting_now])
    if not pool:
        return 1.0, 0
    rank = min(len(pool) - 1, CALIBRATION_PERCENTILE * len(pool) // 100)
    return max(1.0, pool[rank]), len(same)


def indebted(history: Sequence[EpochMetrics], max_debt: int | None,
             max_l0_files: int | None) -> set[int]:
    """Workers whose store owed more than ``max_debt`` bytes of compaction at the newest
    epoch's commit, or held ``max_l0_files`` level-0 files or more (``None``: no limit)."""
    if not history:
        return set()
    return {int(w) for w, wm in history[-1].per_worker.items()
            if (max_debt is not None and (wm.pending_compaction_bytes or 0) > max_debt)
            or (max_l0_files is not None and (wm.l0_files or 0) >= max_l0_files)}


def l0_room(history: Sequence[EpochMetrics], max_l0_files: int | None) -> dict[int, int]:
    """Per worker with a known level-0 count, the bins it may still receive this epoch (an
    ingested bin may add a level-0 file; a burst made receivers compact in the epochs)."""
    if max_l0_files is None or not history:
        return {}
    return {int(w): max_l0_files - int(wm.l0_files)
            for w, wm in history[-1].per_worker.items() if wm.l0_files is not None}


def scanned_out(wm: WorkerMetrics) -> int:
    """The bytes a worker's export read and wrote in the epoch: its bins' bytes, less those of
    bins whose files were written ahead (docs/transfer.md), which cost it only their patches."""
    return max(0, int(wm.bytes_out or 0) - int(wm.ahead_bytes_out or 0))


def _jobs(records: list[EpochMetrics]) -> list[list[int]]:
    """The indexes of ``records`` by the Spark job that ran them: alone, or the epochs of a
    group together (a group's ``duration_s`` are its time's shares, so their sum is the
    group's time)."""
    jobs: list[list[int]] = []
    for i, m in enumerate(records):
        grouped = m.group is not None and (m.group_size or 1) > 1
        if grouped and jobs and records[jobs[-1][0]].group == m.group and m.epoch != m.group:
            jobs[-1].append(i)
        else:
            jobs.append([i])
    return jobs


__all__ = ["APPLY", "CALIBRATION_PERCENTILE", "DISTINCT", "EXPORT", "REGIME_EPOCHS", "CostModel",
           "Slots", "Work", "ahead_pending", "calibration", "compacting", "fixed_and_per_byte",
           "indebted", "l0_room", "scanned_out", "stages_s", "written_ahead"]
