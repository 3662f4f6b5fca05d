"""Configuration checks: a pipeline's arguments, and that a state directory or a checkpoint
location holds this configuration's state.

A pipeline's settings (``backend``, ``key``, ``value``, ``update``, ``checkpoint``,
``snapshot_every``) are written into the manifest when its state directory is created; opening
or restoring one under other settings is refused with every mismatch named.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from megaphone.migrator.columns import RESULT_COLUMNS
from megaphone.migrator.registry import OpenPipeline, check_not_open
from megaphone.migrator.updates import AGGREGATIONS, UpdateFn
from megaphone.operators.process import ProcessFunction
from megaphone.routing.bins import validate_num_bins
from megaphone.routing.fingerprint import Fingerprint
from megaphone.state_backends import BACKENDS
from megaphone.state_backends.durable import SNAPSHOT_EVERY


def check_arguments(*, key: str, value: str | None, update: str | UpdateFn, workers: int,
                    num_bins: int, backend: str, snapshot_every: int) -> None:
    """Raise ``ValueError`` for a pipeline's arguments that cannot work, before anything opens."""
    validate_num_bins(num_bins)
    if snapshot_every < 1:
        raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if isinstance(update, str) and update not in AGGREGATIONS:
        raise ValueError(f"update must be one of {AGGREGATIONS} or a callable, got {update!r}")
    if update in ("sum", "min", "max") and value is None:
        raise ValueError(f"update {update!r} needs a value column")
    if not workers >= 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if key in RESULT_COLUMNS:
        raise ValueError(f"the key column may not be called {key!r} (megaphone's column of "
                         "reports in an epoch's results)")


def update_setting(update: str | UpdateFn | ProcessFunction, event_time: str | None) -> str:
    """The manifest's name of ``update``: the aggregation, ``custom`` for a general ``f``, or
    ``process:<class>`` for an event-time operator (which needs an ``event_time`` column),
    with its parameters when it is a dataclass (a window of another size is another
    pipeline's state)."""
    if isinstance(update, str):
        return update
    if isinstance(update, ProcessFunction):
        if event_time is None:
            raise ValueError(f"the operator {type(update).__name__} runs on event time: give "
                             "the pipeline an event_time column")
        return f"process:{update!r}" if dataclasses.is_dataclass(update) else \
            f"process:{type(update).__name__}"
    return "custom"


def check_config(settings: dict[str, Any], m: dict[str, Any], fp: Fingerprint, where: str, *,
                 num_bins: int, pipeline_id: str | None, key_type: str | None) -> None:
    """Raise ``ValueError`` unless manifest ``m`` (at ``where``) is this configuration's.

    ``settings`` take the manifest's ``checkpoint`` and ``snapshot_every`` (fixed at creation;
    a ``checkpoint`` of ``None`` means as created). ``pipeline_id`` and ``key_type`` of ``None``
    match any.
    """
    mismatches = [
        f"{name} {mine!r} != {theirs!r}"
        for name, mine, theirs in [
            ("num_bins", num_bins, fp.num_bins),
            *((name, settings[name], m.get(name))
              for name in ("backend", "key", "value", "update")),
        ]
        if mine != theirs
    ]
    for name in ("checkpoint", "snapshot_every"):
        theirs = m.get(name, None if name == "checkpoint" else SNAPSHOT_EVERY)
        if name == "checkpoint" and settings[name] not in (None, theirs):
            mismatches.append(f"checkpoint {settings[name]!r} != {theirs!r}")
        settings[name] = theirs
    if pipeline_id not in (None, fp.pipeline_id):
        mismatches.append(f"pipeline_id {pipeline_id!r} != {fp.pipeline_id!r}")
    if key_type not in (None, fp.key_type):
        mismatches.append(f"key_type {key_type!r} != {fp.key_type!r}")
    if mismatches:
        raise ValueError(
            f"{where} holds state of another pipeline configuration: " + "; ".join(mismatches)
        )


def check_restore(settings: dict[str, Any], m: dict[str, Any], uri: str, *, num_bins: int,
                  pipeline_id: str | None, key_type: str | None,
                  owner: OpenPipeline | None = None) -> None:
    """Refuse to restore a state directory from the driver's copy at ``uri`` for another
    configuration (:func:`check_config`), or for a pipeline already open in this process (but
    ``owner``)."""
    fp = Fingerprint.from_dict(m.get("fingerprint"))
    check_config(settings, m, fp, f"checkpoint location {uri}", num_bins=num_bins,
                 pipeline_id=pipeline_id, key_type=key_type)
    check_not_open(fp.pipeline_id, uri, owner)
