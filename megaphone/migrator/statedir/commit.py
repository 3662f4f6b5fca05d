"""The driver's commit record (``commit.json``): what the last committed epoch left behind."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StreamPosition:
    """Where a Structured Streaming query stands in a pipeline's commits: the query's
    checkpoint ``location`` and the last micro-batch id committed (``batch_id``; ``None``
    when no stream ran). ``epoch``: the epoch that ran that batch, kept when epochs without
    a batch (offline migration) ran since. ``epochs``: for a micro-batch run by its epoch
    column, its epochs committed so far as ``(first, last)`` ranges, one epoch per label in
    label order (``None`` for a batch run as one epoch)."""

    checkpoint: str | None = None
    batch_id: int | None = None
    epoch: int | None = None
    epochs: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def from_dict(cls, data: Any) -> StreamPosition:
        """Parse the commit record's ``stream`` object; a clear ``ValueError`` if malformed."""
        if isinstance(data, StreamPosition):
            return data
        if not isinstance(data, dict) or not set(data) <= {"checkpoint", "batch_id", "epoch",
                                                           "epochs"}:
            raise ValueError(f"commit.json is malformed: stream {data!r:.200}")
        epochs = data.get("epochs")
        return cls(data.get("checkpoint"), data.get("batch_id"), data.get("epoch"),
                   None if epochs is None else tuple((int(a), int(b)) for a, b in epochs))

    def to_dict(self) -> dict[str, Any]:
        """The commit record's ``stream`` object: the fields that are set."""
        out = {"checkpoint": self.checkpoint, "batch_id": self.batch_id, "epoch": self.epoch,
               "epochs": None if self.epochs is None else [list(r) for r in self.epochs]}
        return {k: v for k, v in out.items() if v is not None}

    def ran(self, location: str) -> int:
        """The last micro-batch id committed of the query at ``location`` (-1 if none)."""
        return self.batch_id if self.checkpoint == location and self.batch_id is not None \
            else -1

    def epoch_list(self) -> list[int]:
        """The epochs of a micro-batch run by groups committed so far, in label order (empty
        for a batch run as one epoch)."""
        return [e for first, last in self.epochs or () for e in range(first, last + 1)]

    def with_epoch(self, epoch: int) -> StreamPosition:
        """This position with ``epoch`` added to its micro-batch's committed epochs (extending
        the last range when it is the next epoch: a batch's epochs are one range unless epochs
        without records ran between two runs of it)."""
        ranges = [list(r) for r in self.epochs or ()]
        if ranges and ranges[-1][1] == epoch - 1:
            ranges[-1][1] = epoch
        else:
            ranges.append([epoch, epoch])
        return dataclasses.replace(self, epochs=tuple((a, b) for a, b in ranges))


@dataclass
class Commit:
    """What the last committed epoch left behind; rewritten atomically after every epoch.

    ``state_version``: the routing version the workers' state reflects; ``pending_drops``:
    ``[bin, worker]`` pairs that moved away at that epoch, deleted by their old owners at the
    next (a re-run can still export them); ``stream``: the last Structured Streaming batch;
    ``plans``: submitted plans not finished; ``tokens``: per worker, the attempt whose results
    the driver took (any other attempt's copy is not this commit's state); ``seq``: records
    written (the driver's copy names its files by it); ``max_event_time`` (us): whence the next
    watermark; ``hot``: the committed epochs' heaviest keys, smoothed
    (:class:`~megaphone.plans.hot_keys.HeavyHitters` JSON), whence the next split, alike on a
    re-run; ``label``: the epoch's label from a batch's epoch column (docs/groups.md).
    Placement (docs/placement.md): ``homes``, per worker with state its home host, and
    ``addresses``, the ``[host, port]`` of the service holding it there; ``hosts``, per host
    reported from, its services' ``[host, port]`` (``None`` where unknown); ``slots``, per known
    host, its task slots as the driver knew them (empty when unknown), so homes, DS2 and the
    deadline policy read one record and a re-run homes alike.
    """

    epoch: int = -1
    state_version: int = 0
    pending_drops: list[list[int]] = field(default_factory=list)
    stream: StreamPosition = field(default_factory=StreamPosition)
    plans: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    seq: int = 0
    max_event_time: int | None = None
    hot: dict[str, Any] = field(default_factory=dict)
    label: int | None = None
    homes: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, list[Any]] = field(default_factory=dict)
    hosts: dict[str, list[Any]] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any) -> Commit:
        """Parse commit.json; unknown or mistyped fields are a clear ``ValueError``."""
        if not isinstance(data, dict) or not set(data) <= set(cls.__dataclass_fields__):
            raise ValueError(f"commit.json is malformed: {data!r:.200}")
        commit = cls(**data)
        commit.stream = StreamPosition.from_dict(commit.stream)
        if not all(isinstance(n, int) for n in (commit.epoch, commit.state_version, commit.seq,
                                                commit.max_event_time or 0, commit.label or 0)):
            raise ValueError("commit.json is malformed: epoch, state_version, seq, "
                             "max_event_time and label must be integers")
        for name, ok, what in _MAPS:
            value = getattr(commit, name)
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and ok(k, v) for k, v in value.items()):
                raise ValueError(f"commit.json is malformed: {name} must map {what}")
        return commit

    def to_dict(self) -> dict[str, Any]:
        """The commit record as ``commit.json`` holds it: the fields themselves, not copies
        (it is written out at once; ``dataclasses.asdict`` deep-copied every plan's moves, 8-30
        ms a commit while a fluid plan of 200 bins was in flight)."""
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "stream": self.stream.to_dict()}

    def worker_tokens(self) -> dict[int, str]:
        """``tokens`` by worker number."""
        return {int(w): t for w, t in self.tokens.items()}

    def worker_homes(self) -> dict[int, str]:
        """``homes`` by worker number."""
        return {int(w): h for w, h in self.homes.items()}

    def host_slots(self) -> dict[str, int | None]:
        """Each known host (of ``hosts`` and ``homes``) and its task slots (``None`` where
        unknown): the capacity DS2 sets its target against."""
        return {h: self.slots.get(h) for h in sorted(set(self.hosts) | set(self.homes.values()))}

    def home_services(self) -> dict[int, tuple[str, tuple[str, int]]]:
        """Per worker whose home's service address is known: its home and that address."""
        return {int(w): (h, (self.addresses[w][0], self.addresses[w][1]))
                for w, h in self.homes.items() if w in self.addresses}


def _is_address(value: Any) -> bool:
    """Whether ``value`` is a service's ``[host, port]`` as JSON holds it."""
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
        and isinstance(value[1], int)


#: The commit record's maps: each one's check of an entry (its key a string) and what it maps.
_MAPS = (
    ("tokens", lambda w, t: w.isdigit() and isinstance(t, str), "workers to strings"),
    ("homes", lambda w, h: w.isdigit() and isinstance(h, str), "workers to strings"),
    ("addresses", lambda w, a: w.isdigit() and _is_address(a), "workers to [host, port]"),
    ("hosts", lambda h, s: isinstance(s, list) and bool(s)
     and all(a is None or _is_address(a) for a in s), "host ids to lists of [host, port] or null"),
    ("slots", lambda h, n: isinstance(n, int) and not isinstance(n, bool) and n > 0,
     "host ids to positive integers"),
    ("hot", lambda k, v: True, "strings to values (a JSON object)"),
)
