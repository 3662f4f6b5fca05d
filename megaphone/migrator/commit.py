"""The driver's commit record (``commit.json``): what the last committed epoch left behind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Commit:
    """What the last committed epoch left behind; rewritten atomically after every epoch.

    ``state_version`` is the routing version the workers' state reflects; ``pending_drops``
    are ``[bin, worker]`` pairs that moved away in that epoch, which the old owners delete in
    the next epoch (so a re-run of the epoch can still export them); ``stream`` remembers the
    last Structured Streaming batch id; ``plans`` are submitted plans not finished yet;
    ``tokens`` name, per worker, the attempt at the epoch whose results the driver took (a
    worker's copy of the epoch from any other attempt, on any host, is not this commit's state);
    the ``stream`` of a micro-batch run by groups (``start(..., epoch_column=)``) also has
    ``epochs``: the batch's epochs committed so far, as ``[first, last]`` ranges, one epoch per
    label in label order (:func:`stream_epochs`; records without it stay readable);
    ``seq`` counts the records written (the driver's durable copy names its files by it);
    ``max_event_time``: the largest event time (us) committed, whence the next watermark;
    ``hot``: the heaviest keys of the committed epochs, smoothed (a bounded
    :class:`~megaphone.plans.hot_keys.HeavyHitters` as JSON; empty unless hot keys are
    watched), whence the next epoch's split: a re-run of an epoch splits alike.
    ``label``: the epoch's label when it ran from a batch's epoch column (docs/groups.md): a
    later batch's labels must be larger.
    """

    epoch: int = -1
    state_version: int = 0
    pending_drops: list[list[int]] = field(default_factory=list)
    stream: dict[str, Any] = field(default_factory=dict)
    plans: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    seq: int = 0
    max_event_time: int | None = None
    hot: dict[str, Any] = field(default_factory=dict)
    label: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Commit:
        """Parse commit.json; unknown or mistyped fields are a clear ``ValueError``."""
        if not isinstance(data, dict) or not set(data) <= set(cls.__dataclass_fields__):
            raise ValueError(f"commit.json is malformed: {data!r:.200}")
        commit = cls(**data)
        if not all(isinstance(n, int) for n in (commit.epoch, commit.state_version, commit.seq,
                                                commit.max_event_time or 0, commit.label or 0)):
            raise ValueError("commit.json is malformed: epoch, state_version, seq, "
                             "max_event_time and label must be integers")
        if not isinstance(commit.tokens, dict) or not all(
                isinstance(w, str) and w.isdigit() and isinstance(t, str)
                for w, t in commit.tokens.items()):
            raise ValueError("commit.json is malformed: tokens must map workers to strings")
        if not isinstance(commit.hot, dict):
            raise ValueError("commit.json is malformed: hot must be an object")
        return commit

    def worker_tokens(self) -> dict[int, str]:
        """``tokens`` by worker number."""
        return {int(w): t for w, t in self.tokens.items()}


def stream_epochs(stream: dict[str, Any]) -> list[int]:
    """The epochs a stream's micro-batch run by groups committed so far, in label order (its
    ``epochs``: ``[first, last]`` ranges; empty for a record without them)."""
    return [e for first, last in stream.get("epochs", ()) for e in range(first, last + 1)]


def stream_with_epoch(stream: dict[str, Any], epoch: int) -> dict[str, Any]:
    """``stream`` with ``epoch`` added to its micro-batch's committed epochs (extending the last
    range when it is the next epoch: a batch's epochs are one range unless epochs without
    records ran between two runs of it)."""
    ranges = [list(r) for r in stream.get("epochs", ())]
    if ranges and ranges[-1][1] == epoch - 1:
        ranges[-1][1] = epoch
    else:
        ranges.append([epoch, epoch])
    return {**stream, "epochs": ranges}
