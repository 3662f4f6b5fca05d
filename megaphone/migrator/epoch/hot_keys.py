"""Hot keys of a pipeline: watching them (a bounded summary per worker and epoch, merged into
the commit record) and splitting them (dual mode: lessees fold a hot key's records, its owner
consolidates). An epoch's split is decided on the driver from the committed summary alone, so a
re-run splits alike (docs/hot-keys.md).
"""

from __future__ import annotations

from typing import Any

from megaphone.migrator.epoch.config import check_positive
from megaphone.migrator.epoch.routing_operator import EpochLayout
from megaphone.migrator.epoch.schemas import PipelineSchema
from megaphone.migrator.epoch.state_holder import StateHolder
from megaphone.migrator.task.hot_split import splittable
from megaphone.migrator.task.updates import AGGREGATIONS, Update
from megaphone.operators.combiner import Combiner
from megaphone.plans.hot_keys import (
    DEFAULT_CAPACITY,
    HeavyHitters,
    HotKeyView,
    ShareThreshold,
    SplitPolicy,
    no_split,
)


class HotKeys:
    """The hot-key side of a pipeline's epochs: off until :meth:`watch_hot_keys` or
    :meth:`split_hot_keys` turns it on for this process (like a policy callable, the setting
    is not stored: a reopened pipeline starts unwatched, its committed summary kept).
    ``schema`` is the pipeline's, ``holder`` its state directory (the committed summary)."""

    def __init__(self, schema: PipelineSchema, holder: StateHolder) -> None:
        self._schema = schema
        self._holder = holder
        self._hot_setting: tuple[SplitPolicy, int] | None = None

    def watch_hot_keys(self, capacity: int = DEFAULT_CAPACITY) -> None:
        """As :meth:`Pipeline.watch_hot_keys <megaphone.Pipeline.watch_hot_keys>`."""
        self._hot_setting = (no_split, check_positive("capacity", capacity))

    def split_hot_keys(self, policy: SplitPolicy | None = None,
                       capacity: int = DEFAULT_CAPACITY) -> None:
        """As :meth:`Pipeline.split_hot_keys <megaphone.Pipeline.split_hot_keys>`."""
        update = self._schema.update_arg
        if not (update in AGGREGATIONS or isinstance(update, Combiner)):
            name = getattr(update, "__name__", type(update).__name__)
            raise ValueError(
                f"cannot split the hot keys of update {name}: it may depend on the "
                "order of its records (sequential mode keeps a key at its owner). Give a "
                "megaphone.Combiner (fold, combine, outputs) to split, or use "
                "watch_hot_keys() to only detect them")
        self._hot_setting = (policy or ShareThreshold(), check_positive("capacity", capacity))

    @property
    def may_split(self) -> bool:
        """Whether :meth:`split_hot_keys` is on: an epoch may split keys, and its job may then
        read its input twice (the lessees' share apart from the rest)."""
        return self._hot_setting is not None and self._hot_setting[0] is not no_split

    def hot_keys(self) -> HeavyHitters:
        """As :meth:`Pipeline.hot_keys <megaphone.Pipeline.hot_keys>`."""
        return HeavyHitters.from_json(self._holder.commit.hot)

    def spec_fields(self, update: Update, layout: EpochLayout, parallelism: int
                    ) -> dict[str, Any]:
        """The epoch spec's hot-key fields: the policy's split, checked (a ``ValueError``
        before the epoch runs for keys the split cannot take). Only a splittable update gets a
        split policy (:meth:`split_hot_keys`)."""
        if self._hot_setting is None:
            return {}
        policy, capacity = self._hot_setting
        view = HotKeyView(layout.epoch, self.hot_keys(), len(layout.live), parallelism,
                          splittable(update))
        split = policy(view).checked(self._holder.key_type)
        return {"split_keys": split.keys, "lessees": split.lessees,
                "sketch_capacity": capacity}


__all__ = ["HotKeys"]
