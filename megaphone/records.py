"""Typed metrics records: what a worker reports for its part of an epoch, and the epoch's
record the driver keeps (``metrics.jsonl``, :meth:`Pipeline.metrics`).

Records cross module boundaries as these dataclasses; they become plain dicts only at the
edges (JSON on disk, the public ``metrics()`` list). ``from_dict`` keeps keys it does not
know in ``extra``, so a record written by a newer version round-trips unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

_R = TypeVar("_R", bound="_Record")


class _Record:
    """``to_dict``/``from_dict`` shared by the records (fields by name, unknown keys kept)."""

    extra: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The record as a plain JSON-ready dict (nested records too)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {str(k): v.to_dict() if isinstance(v, _Record) else v
                         for k, v in value.items()}
            out[f.name] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls: type[_R], data: dict[str, Any]) -> _R:
        """The record stored as ``data``; keys this version does not know go to ``extra``."""
        if not isinstance(data, dict):
            raise TypeError(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        known = {k: v for k, v in data.items() if k in names and k != "extra"}
        return cls(**known, extra={k: v for k, v in data.items() if k not in known})


@dataclass
class WorkerMetrics(_Record):
    """One worker's part of one epoch: as a receiver (install, apply, commit) and as an
    exporter (the ``*_out`` fields and ``export_s``). Times are seconds of the task.

    A field the worker did not report is ``None`` and left out of :meth:`to_dict`, as records
    have always had it: an exporter reports only its ``*_out`` fields and ``export_s``; a
    receiver reports ``max_event_time`` even when it is ``None``.
    """

    records_in: int | None = None
    records_out: int | None = None
    bins_in: int | None = None
    keys_in: int | None = None
    bytes_in: int | None = None
    replayed: bool | None = None
    max_event_time: int | None = None
    begin_s: float | None = None
    restored: dict[str, Any] | None = None
    install_method: str | None = None
    #: Bins that arrived as whole files (the rest of ``bins_in`` came as rows).
    files_in: int | None = None
    install_s: float | None = None
    #: Records with a null key the worker applied (a key of its own; part of ``records_in``).
    null_keys: int | None = None
    #: Records (or window contributions) an event-time operator dropped as late.
    late_records: int | None = None
    #: Timers of an event-time operator that fired (windows closed, join rows expired).
    timers_fired: int | None = None
    apply_s: float | None = None
    commit_s: float | None = None
    store_commit_s: float | None = None
    stall_s: float | None = None
    pending_compaction_bytes: int | None = None
    l0_files: int | None = None
    #: Whether the worker's store was running or owed a compaction at its commit (``None``
    #: for stores without compactions): the deadline policy learns such epochs apart.
    compacting: bool | None = None
    token: str | None = None
    useful_s: float | None = None
    bins_out: int | None = None
    keys_out: int | None = None
    bytes_out: int | None = None
    #: Bins that left as whole files (the rest of ``bins_out`` went as rows).
    files_out: int | None = None
    #: Of those, the bins whose file was written ahead while the store was idle (with a patch
    #: of what changed since), and their bytes: the export wrote only the patches in the epoch.
    ahead_out: int | None = None
    ahead_bytes_out: int | None = None
    #: The bins the worker's store held written ahead at its commit (docs/transfer.md).
    ahead_bins: list[int] | None = None
    #: Of the bins named to write ahead, those large enough and not written yet at its commit;
    #: ``None`` where the store writes none ahead (no bin files, or rows only).
    ahead_pending: int | None = None
    #: Bytes (keys and values) of the bins that arrived as files pulled by the worker's home
    #: from their sender's home (docs/placement.md, home to home: across hosts at most once).
    h2h_bytes: int | None = None
    #: Bytes of the bins that arrived as files, each times the host boundaries it crossed on
    #: its way (sender's home, export task, receiving task, receiver's home; or home to home).
    across_bytes: int | None = None
    export_s: float | None = None
    #: The apply task's wall-clock marks (``time.time()``, one per phase, see
    #: :data:`~megaphone.migrator.task.state_operator.MARKS`) and its seconds waiting for the
    #: shuffle during install (``install_wait``): the driver's trace is built from them, and they
    #: are taken out of the record before it is stored.
    marks: dict[str, float] | None = None
    #: An exporter's ``[bin, start, end]`` per bin it shipped (wall clock), for the trace.
    export_spans: list[list[float]] | None = None
    #: The worker's heaviest keys of the epoch (a bounded summary:
    #: :class:`~megaphone.plans.hot_keys.HeavyHitters` as JSON), when hot keys are watched.
    hot: dict[str, Any] | None = None
    #: Records of split hot keys that lessees folded into partials for this worker (part of
    #: ``records_in``), and the keys they were of.
    split_records: int | None = None
    split_keys: int | None = None
    #: The id of the host the worker's apply task ran on
    #: (:func:`~megaphone.state_backends.host.host_id`).
    host: str | None = None
    #: The task ran away from the worker's home and reached its store there over the network
    #: (docs/placement.md); ``home_unreachable``: it could not, and used its host's copy.
    remote: bool | None = None
    home_unreachable: bool | None = None
    #: ``[host, port]`` of the service holding the worker's store, when the task ran at home
    #: or reached it over the network (the driver keeps it for the tasks that run elsewhere).
    address: list[Any] | None = None
    #: ``[shards, host, port]`` of the task's host's service for the worker's shard (one of
    #: ``shards``), wherever the store was: the driver homes new workers on known hosts.
    service: list[Any] | None = None
    #: Workers at home elsewhere whose copies on the task's host it had deleted first.
    pruned: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields the worker reported, as a plain JSON-ready dict."""
        receiver = self.records_in is not None
        return {k: v for k, v in super().to_dict().items()
                if v is not None or (k == "max_event_time" and receiver)}

    def merge(self, other: WorkerMetrics) -> None:
        """Fold ``other`` (the same worker's exporter row, or its receiver row) into this one:
        the fields ``other`` reported win, but an exporter's are added up (receivers that pull
        each report the part of a sender's export they read: docs/transfer.md)."""
        for f in dataclasses.fields(self):
            if f.name == "extra":
                self.extra.update(other.extra)
                continue
            value, mine = getattr(other, f.name), getattr(self, f.name)
            if value is not None and mine is not None and f.name in _EXPORT_SUMS:
                setattr(self, f.name, mine + value)
            elif value is not None:
                setattr(self, f.name, value)


#: The exporter's fields that :meth:`WorkerMetrics.merge` adds up.
_EXPORT_SUMS = frozenset({"bins_out", "keys_out", "bytes_out", "files_out", "ahead_out",
                          "ahead_bytes_out", "export_s", "export_spans"})


@dataclass
class WorkerReport:
    """What one task reports to the driver about ``worker``: its metrics, and beside them the
    bytes it shipped per moved bin (an exporter's; the driver's plan progress, not recorded)."""

    worker: int
    metrics: WorkerMetrics
    bytes_by_bin: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> str:
        """The report as one JSON text (a row of the task's results)."""
        return json.dumps({"worker": self.worker, "metrics": self.metrics.to_dict(),
                           "bytes_by_bin": sorted(self.bytes_by_bin.items())})

    @classmethod
    def from_json(cls, text: str) -> WorkerReport:
        """The report :meth:`to_json` wrote."""
        data = json.loads(text)
        return cls(int(data["worker"]), WorkerMetrics.from_dict(data["metrics"]),
                   {int(b): int(n) for b, n in data["bytes_by_bin"]})


@dataclass
class EpochMetrics(_Record):
    """One committed epoch as the driver records it: timing, volumes, what moved, and each
    worker's :class:`WorkerMetrics` (keyed by worker number; by its text in :meth:`to_dict`).
    Fields keep the order of the record on disk."""

    epoch: int
    batch_id: int | None = None
    started: float = 0.0
    finished: float = 0.0
    duration_s: float = 0.0
    latency_s: float | None = None
    records_in: int = 0
    records_out: int = 0
    #: Records with a null key the epoch applied (a key of its own; part of ``records_in``).
    null_keys: int = 0
    routing_version: int = 0
    workers: int = 0
    bins_moved: int = 0
    keys_moved: int = 0
    bytes_moved: int = 0
    per_worker: dict[int, WorkerMetrics] = field(default_factory=dict)
    job_attempts: int = 1
    phases_s: dict[str, float] = field(default_factory=dict)
    #: Records (or window contributions) event-time operators dropped as late.
    late_records: int = 0
    #: Records of split hot keys, folded by lessees and consolidated at their owners.
    split_records: int = 0
    #: The epoch's heaviest keys, ``[key, count, error]`` (workers' summaries merged), when
    #: hot keys are watched; the keys split in it are those with ``split_records``.
    hot_keys: list[list[Any]] = field(default_factory=list)
    #: The first epoch of the group of epochs whose one job ran this epoch (docs/groups.md);
    #: ``None`` for an epoch run as a job of its own.
    group: int | None = None
    #: Epochs in that group (1 alone). ``duration_s`` and ``phases_s`` are then this epoch's
    #: share of the group's (the group's time over its size: the job's floor amortized).
    group_size: int = 1
    #: The epoch's label (the value of the batch's epoch column), in a group.
    label: int | None = None
    #: Workers whose apply task ran on a host other than their home (docs/placement.md).
    away: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpochMetrics:
        """The record stored as ``data`` (its ``per_worker`` entries become records too)."""
        record = super().from_dict(data)
        record.per_worker = {int(w): m if isinstance(m, WorkerMetrics)
                             else WorkerMetrics.from_dict(m)
                             for w, m in (record.per_worker or {}).items()}
        return record

    def total(self, name: str) -> float:
        """The sum of one :class:`WorkerMetrics` field over the epoch's workers."""
        return sum(getattr(m, name) or 0 for m in self.per_worker.values())


def epoch_records(metrics: Iterable[Mapping[str, Any] | EpochMetrics]) -> tuple[EpochMetrics, ...]:
    """Stored per-epoch metrics (plain dicts, or records already) as records, for planning
    and policies."""
    return tuple(m if isinstance(m, EpochMetrics) else EpochMetrics.from_dict(dict(m))
                 for m in metrics)
