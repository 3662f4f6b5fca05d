"""A pipeline's configuration (:class:`PipelineConfig`) and its checks: its arguments, and that a
state directory or a checkpoint location holds this configuration's state (the manifest keeps
its settings; another configuration is refused with every mismatch named).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from megaphone.migrator.statedir.registry import OpenPipeline, check_not_open
from megaphone.migrator.task.columns import RESULT_COLUMNS
from megaphone.migrator.task.updates import AGGREGATIONS, UpdateFn
from megaphone.operators.process import ProcessFunction
from megaphone.routing.bins import validate_num_bins
from megaphone.routing.fingerprint import Fingerprint
from megaphone.state_backends import BACKENDS, DEFAULT_CHUNK_BYTES
from megaphone.state_backends.durable import SNAPSHOT_EVERY

#: The group size that follows Drizzle's rule (:func:`~megaphone.migrator.epoch.groups.
#: drizzle_group_size`).
AUTO = "auto"


@dataclass(frozen=True)
class PipelineConfig:
    """Everything a :class:`~megaphone.migrator.pipeline.facade.Pipeline` is opened with but its
    session and state directory: its arguments, typed. Frozen: opening a state directory gives
    a new one (its ``key_type``, ``pipeline_id``, ``checkpoint`` and ``snapshot_every`` as the
    manifest fixes them: :func:`check_config`), and that one is what travels to a Spark
    Connect server, which opens the same pipeline there (``local_dir`` left to the server)."""

    key: str
    value: str | None = None
    update: Any = "count"
    workers: int = 2
    num_bins: int = 4096
    backend: str = "rocksdb"
    key_type: str | None = None
    pipeline_id: str | None = None
    event_time: str | None = None
    output_type: str = "string"
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    transfer: str = "auto"
    keep_outputs: int = 8
    local_dir: str | None = None
    checkpoint: str | None = None
    snapshot_every: int = SNAPSHOT_EVERY
    group_size: int | str = AUTO
    slots_per_host: int | None = None

    def check(self) -> None:
        """Raise ``ValueError`` for arguments that cannot work, before anything opens."""
        validate_num_bins(self.num_bins)
        if self.snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {self.snapshot_every}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")
        update = self.update
        if isinstance(update, str) and update not in AGGREGATIONS:
            raise ValueError(f"update must be one of {AGGREGATIONS} or a callable, got "
                             f"{update!r}")
        if update in ("sum", "min", "max") and self.value is None:
            raise ValueError(f"update {update!r} needs a value column")
        if not self.workers >= 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        check_group_size(self.group_size)
        if self.slots_per_host is not None:
            check_positive("slots_per_host", self.slots_per_host, " or None")
        update_setting(update, self.event_time)  # an event-time operator needs its column
        if self.key in RESULT_COLUMNS:
            raise ValueError(f"the key column may not be called {self.key!r} (megaphone's "
                             "column of reports in an epoch's results)")

    def manifest_settings(self) -> dict[str, Any]:
        """The settings a new state directory's manifest keeps (and later opens check)."""
        return {"backend": self.backend, "key": self.key, "value": self.value,
                "update": update_setting(self.update, self.event_time),
                "checkpoint": self.checkpoint, "snapshot_every": self.snapshot_every}


def check_positive(name: str, value: Any, alternative: str = "") -> int:
    """``value`` of the setting ``name`` if it is a positive ``int`` (not a bool); else a
    ``ValueError`` that names the setting (and its ``alternative``, as ``" or None"``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{alternative}, got {value!r}")
    return value


def check_group_size(group_size: Any) -> int | str:
    """``group_size`` if valid: a positive ``int`` or ``"auto"``; else a ``ValueError``."""
    return AUTO if group_size == AUTO else check_positive("group_size", group_size, " or 'auto'")


def update_setting(update: str | UpdateFn | ProcessFunction, event_time: str | None) -> str:
    """The manifest's name of ``update``: the aggregation, ``custom`` for a general ``f``, or
    ``process:<class>`` for an event-time operator (which needs an ``event_time`` column),
    with its parameters when it is a dataclass or says them (``setting``: a window of another
    size, or another Spark processor, is another pipeline's state)."""
    if isinstance(update, str):
        return update
    if isinstance(update, ProcessFunction):
        if event_time is None and getattr(update, "needs_event_time", True):
            raise ValueError(f"the operator {type(update).__name__} runs on event time: give "
                             "the pipeline an event_time column")
        setting = getattr(update, "setting", None)  # an operator that says what it is
        if isinstance(setting, str):
            return f"process:{setting}"
        return f"process:{update!r}" if dataclasses.is_dataclass(update) else \
            f"process:{type(update).__name__}"
    return "custom"


def check_config(config: PipelineConfig, m: dict[str, Any], fp: Fingerprint, where: str
                 ) -> PipelineConfig:
    """``config`` as the state directory with manifest ``m`` (at ``where``) fixes it, or a
    ``ValueError`` naming every mismatch unless ``m`` is this configuration's.

    The manifest fixes ``checkpoint`` and ``snapshot_every`` (at creation; a ``checkpoint`` of
    ``None`` means as created) and the fingerprint ``pipeline_id`` and ``key_type`` (``None``
    matches any).
    """
    mine, checkpoint = config.manifest_settings(), m.get("checkpoint")
    fixed = [("num_bins", config.num_bins, fp.num_bins),
             *((name, mine[name], m.get(name)) for name in ("backend", "key", "value", "update"))]
    given = [("checkpoint", config.checkpoint, checkpoint),  # None matches any
             ("pipeline_id", config.pipeline_id, fp.pipeline_id),
             ("key_type", config.key_type, fp.key_type)]
    mismatches = [f"{n} {ours!r} != {theirs!r}" for n, ours, theirs in fixed if ours != theirs]
    mismatches += [f"{n} {ours!r} != {theirs!r}" for n, ours, theirs in given
                   if ours not in (None, theirs)]
    if mismatches:
        raise ValueError(
            f"{where} holds state of another pipeline configuration: " + "; ".join(mismatches)
        )
    return dataclasses.replace(config, checkpoint=checkpoint,
                               snapshot_every=m.get("snapshot_every", SNAPSHOT_EVERY),
                               pipeline_id=fp.pipeline_id, key_type=fp.key_type)


def check_restore(config: PipelineConfig, m: dict[str, Any], uri: str,
                  owner: OpenPipeline | None = None) -> None:
    """Refuse to restore a state directory from the driver's copy at ``uri`` for another
    configuration (:func:`check_config`), or for a pipeline already open in this process (but
    ``owner``)."""
    fp = Fingerprint.from_dict(m.get("fingerprint"))
    check_config(config, m, fp, f"checkpoint location {uri}")
    check_not_open(fp.pipeline_id, uri, owner)
