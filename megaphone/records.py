"""Typed metrics records: what a worker reports for its part of an epoch, and the epoch's
record the driver keeps (``metrics.jsonl``, :meth:`Pipeline.metrics`).

Records cross module boundaries as these dataclasses; they become plain dicts only at the
edges (JSON on disk, the public ``metrics()`` list). ``from_dict`` keeps keys it does not
know in ``extra``, so a record written by a newer version round-trips unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

R = TypeVar("R", bound="_Record")


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
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        """The record stored as ``data``; keys this version does not know go to ``extra``."""
        if not isinstance(data, dict):
            raise TypeError(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        known = {k: v for k, v in data.items() if k in names and k != "extra"}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})


@dataclass
class WorkerMetrics(_Record):
    """One worker's part of one epoch: as a receiver (install, apply, commit) and as an
    exporter (the ``*_out`` fields and ``export_s``). Times are seconds of the task."""

    worker: int
    records_in: int = 0
    records_out: int = 0
    null_keys: int = 0
    bins_in: int = 0
    keys_in: int = 0
    bytes_in: int = 0
    bins_out: int = 0
    keys_out: int = 0
    bytes_out: int = 0
    replayed: bool = False
    max_event_time: int | None = None
    restored: dict[str, Any] | None = None
    install_method: str | None = None
    begin_s: float = 0.0
    install_s: float = 0.0
    apply_s: float = 0.0
    commit_s: float = 0.0
    store_commit_s: float = 0.0
    export_s: float = 0.0
    useful_s: float = 0.0
    stall_s: float = 0.0
    pending_compaction_bytes: int = 0
    l0_files: int = 0
    token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def merge(self, other: WorkerMetrics) -> None:
        """Fold ``other`` (the same worker's exporter row, or its receiver row) into this one:
        fields ``other`` set away from their defaults win."""
        for f in dataclasses.fields(self):
            if f.name == "extra":
                self.extra.update(other.extra)
                continue
            value = getattr(other, f.name)
            if value != f.default:
                setattr(self, f.name, value)


@dataclass
class EpochMetrics(_Record):
    """One committed epoch as the driver records it: timing, volumes, what moved, and each
    worker's :class:`WorkerMetrics` (keyed by worker number)."""

    epoch: int
    started: float
    finished: float
    duration_s: float
    batch_id: int | None = None
    latency_s: float | None = None
    records_in: int = 0
    records_out: int = 0
    null_keys: int = 0
    routing_version: int = 0
    workers: int = 0
    bins_moved: int = 0
    keys_moved: int = 0
    bytes_moved: int = 0
    per_worker: dict[int, WorkerMetrics] = field(default_factory=dict)
    job_attempts: int = 1
    phases_s: dict[str, float] = field(default_factory=dict)
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
