"""What a :class:`~megaphone.migrator.pipeline.Pipeline`'s policies see of it: the per-bin load
(records per bin, smoothed over epochs) and the inputs of adaptive plans' policies, both
metadata the driver keeps between epochs."""

from __future__ import annotations

import numpy as np
from pyspark.sql import SparkSession

from megaphone.migrator.plan_queue import PolicyInputs
from megaphone.spark import task_slots

#: Weight of the newest epoch in the per-bin load (records per bin, exponentially smoothed).
LOAD_SMOOTHING = 0.3
#: Newest epochs' metrics an adaptive plan's policy sees.
POLICY_HISTORY = 50


class PipelineInputs:
    """The load tracking and policy inputs of a pipeline: a base of
    :class:`~megaphone.migrator.pipeline.Pipeline`, which holds ``_bin_load`` and
    ``_task_slots`` and provides ``spark``, ``bin_sizes`` and ``metric_records``."""

    spark: SparkSession
    _bin_load: np.ndarray
    _task_slots: int | None

    def bin_load(self) -> np.ndarray:
        """Records per bin per epoch, exponentially smoothed over this process's epochs."""
        return self._bin_load.copy()

    def _policy_inputs(self, lag_s: float) -> PolicyInputs:
        """What adaptive plans' policies see before the next epoch (metadata only)."""
        def sizes() -> dict[int, int]:
            return dict(enumerate(self.bin_sizes().bytes.tolist()))

        def load() -> dict[int, float]:
            hot = np.flatnonzero(self._bin_load)
            return dict(zip(hot.tolist(), self._bin_load[hot].tolist(), strict=True))

        if self._task_slots is None:  # asked once
            self._task_slots = task_slots(self.spark)
        return PolicyInputs(
            history=lambda: self.metric_records(last=POLICY_HISTORY), bin_bytes=sizes,
            bin_records=load, lag_s=lag_s, parallelism=self._task_slots)

    def _track_load(self, bins: np.ndarray, records: np.ndarray) -> None:
        counts = np.bincount(bins, weights=records, minlength=len(self._bin_load))
        self._bin_load *= 1.0 - LOAD_SMOOTHING
        self._bin_load += LOAD_SMOOTHING * counts
