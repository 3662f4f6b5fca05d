"""The pipelines open in this process, by pipeline id, so ``megaphone.migrate(plan)`` finds them."""

from __future__ import annotations

import weakref
from typing import Protocol

from megaphone.migrator.statedir.directory import StateDir


class OpenPipeline(Protocol):
    """What the registry needs of an open pipeline: its state directory (where it is open)."""

    @property
    def state_dir(self) -> StateDir:
        """The pipeline's state directory."""
        ...


_PIPELINES: weakref.WeakValueDictionary[str, OpenPipeline] = weakref.WeakValueDictionary()


def running_pipeline(pipeline_id: str) -> OpenPipeline | None:
    """The pipeline with ``pipeline_id`` open in this process, if any."""
    return _PIPELINES.get(pipeline_id)


def register(pipeline_id: str, pipe: OpenPipeline) -> None:
    """Record ``pipe`` as open; refuse a second pipeline open with the same id."""
    other = _PIPELINES.get(pipeline_id)
    if other is not None and other is not pipe:
        raise ValueError(f"pipeline {pipeline_id} is already open in this process "
                         f"on {other.state_dir.path}")
    _PIPELINES[pipeline_id] = pipe


def unregister(pipeline_id: str, pipe: OpenPipeline) -> None:
    """Forget ``pipe`` (closed), unless another pipeline holds its id by now."""
    if _PIPELINES.get(pipeline_id) is pipe:
        del _PIPELINES[pipeline_id]


def check_not_open(pipeline_id: str, uri: str, owner: OpenPipeline | None) -> None:
    """Refuse a restore from the checkpoint location ``uri`` of a pipeline open in this
    process, unless it is ``owner`` (the pipeline being brought forward)."""
    other = _PIPELINES.get(pipeline_id)
    if other is not None and other is not owner:
        raise ValueError(f"pipeline {pipeline_id} of checkpoint location {uri} is open "
                         f"in this process on {other.state_dir.path}; close it first")
