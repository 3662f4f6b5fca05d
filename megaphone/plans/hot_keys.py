"""Hot keys: a bounded heavy-hitter summary, and the per-epoch policy that splits hot keys.

Each worker reports, per epoch, its ``capacity`` most frequent keys with exact counts and a
``floor`` (no key it left out had more records): a bounded summary of the space-saving /
Misra-Gries family. The driver merges the workers' summaries (:meth:`HeavyHitters.merge`) and
smooths them over epochs (:meth:`HeavyHitters.smoothed`); the result is kept in the driver's
commit record, so the split of an epoch is derived from committed data alone and a re-run of
the epoch splits alike.

Before every epoch a :data:`SplitPolicy` sees a :class:`HotKeyView` and returns the
:class:`HotSplit` to run it with: which keys to split, into how many lessee tasks.
Engine-agnostic: nothing here knows Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: Counters a worker reports and the driver keeps, by default.
DEFAULT_CAPACITY = 16
#: Most keys one epoch may split (each is a literal in the epoch's filter expression).
MAX_SPLIT_KEYS = 64
#: Weight of the newest epoch in the smoothed summary.
SMOOTHING = 0.5

Key = int | str


@dataclass(frozen=True)
class HeavyHitters:
    """At most ``capacity`` counters ``(key, count, error)``, largest count first, over
    ``total`` records: a key's true count lies in ``[count - error, count]``, and a key left
    out had at most ``floor`` records. Counts are records per epoch (smoothed: floats)."""

    counters: tuple[tuple[Key, float, float], ...] = ()
    total: float = 0.0
    floor: float = 0.0
    capacity: int = DEFAULT_CAPACITY

    @classmethod
    def from_counts(cls, keys: Sequence[Key], counts: Sequence[float], total: float,
                    capacity: int = DEFAULT_CAPACITY) -> HeavyHitters:
        """The summary of exact per-key ``counts`` (one epoch at one worker): its top
        ``capacity`` keys, the next count as its ``floor``."""
        order = sorted(range(len(keys)), key=lambda i: (-counts[i], repr(keys[i])))
        top = tuple((keys[i], float(counts[i]), 0.0) for i in order[:capacity])
        floor = float(counts[order[capacity]]) if len(order) > capacity else 0.0
        return cls(top, float(total), floor, capacity)

    @classmethod
    def merge(cls, parts: Iterable[HeavyHitters], capacity: int | None = None
              ) -> HeavyHitters:
        """One epoch's summaries (one per worker) as one, of ``capacity`` counters (default:
        the parts' largest): counts add up; a part that does not list a key may have had up to
        its ``floor`` of it (added to the error)."""
        parts = list(parts)
        if capacity is None:
            capacity = max((p.capacity for p in parts), default=DEFAULT_CAPACITY)
        counts: dict[Key, list[float]] = {}
        for part in parts:
            for key, count, error in part.counters:
                slot = counts.setdefault(key, [0.0, 0.0, 0.0])  # count, error, floors seen
                slot[0] += count
                slot[1] += error
                slot[2] += part.floor
        floors = sum(p.floor for p in parts)
        merged = [(k, c + floors - f, e + floors - f) for k, (c, e, f) in counts.items()]
        return cls._top(merged, sum(p.total for p in parts), floors, capacity)

    def smoothed(self, newest: HeavyHitters, weight: float = SMOOTHING) -> HeavyHitters:
        """This summary (of the epochs before) moved toward ``newest`` (one epoch's) by
        ``weight``: a key missing from one side counts as its ``floor`` there, with that in its
        error."""
        mine = {k: (c, e) for k, c, e in self.counters}
        theirs = {k: (c, e) for k, c, e in newest.counters}
        rows = []
        for key in dict.fromkeys([*mine, *theirs]):
            c0, e0 = mine.get(key, (self.floor, self.floor))
            c1, e1 = theirs.get(key, (newest.floor, newest.floor))
            rows.append((key, (1 - weight) * c0 + weight * c1, (1 - weight) * e0 + weight * e1))
        return self._top(rows, (1 - weight) * self.total + weight * newest.total,
                         (1 - weight) * self.floor + weight * newest.floor, self.capacity)

    @classmethod
    def _top(cls, rows: list[tuple[Key, float, float]], total: float, floor: float,
             capacity: int) -> HeavyHitters:
        """The ``capacity`` largest of ``rows``; the largest left out raises the floor."""
        rows.sort(key=lambda r: (-r[1], repr(r[0])))
        if len(rows) > capacity:
            floor = max(floor, rows[capacity][1])
        return cls(tuple(rows[:capacity]), total, floor, capacity)

    def share(self, key: Key) -> float:
        """A lower bound of ``key``'s share of the records (0 if not listed)."""
        for k, count, error in self.counters:
            if k == key:
                return (count - error) / self.total if self.total else 0.0
        return 0.0

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON (commit record, metrics)."""
        return {"counters": [list(c) for c in self.counters], "total": self.total,
                "floor": self.floor, "capacity": self.capacity}

    @classmethod
    def from_json(cls, data: Any) -> HeavyHitters:
        """The summary :meth:`to_json` wrote; ``None`` or ``{}`` is the empty one."""
        if not data:
            return cls()
        return cls(tuple((k, float(c), float(e)) for k, c, e in data["counters"]),
                   float(data["total"]), float(data["floor"]), int(data["capacity"]))


@dataclass(frozen=True)
class HotKeyView:
    """What a split policy sees before epoch ``epoch``: the hot keys of the committed epochs
    (``hot``, smoothed), the workers owning bins, how many tasks run at once, and whether the
    update can be split at all (``splittable``: a built-in aggregation or a
    :class:`~megaphone.operators.combiner.Combiner`; otherwise keys stay at their owner)."""

    epoch: int
    hot: HeavyHitters
    workers: int
    parallelism: int = 1
    splittable: bool = True


@dataclass(frozen=True)
class HotSplit:
    """How to run one epoch: split ``keys`` (their records folded into partials by lessee
    tasks, consolidated at each key's owner); ``lessees``: into how many tasks (``None``: the
    input's own partitions, with no extra shuffle)."""

    keys: tuple[Key, ...] = ()
    lessees: int | None = None

    def checked(self, key_type: str | None) -> HotSplit:
        """This split, with its keys deduplicated and sorted; ``ValueError`` for keys of
        another type than the pipeline's (``"int64"``/``"str"``), the null key, too many
        keys or a bad ``lessees``."""
        want = int if key_type == "int64" else str
        for key in self.keys:
            if isinstance(key, bool) or not isinstance(key, want):
                raise ValueError(f"a hot key to split must be a {want.__name__} (the "
                                 f"pipeline's keys), got {key!r}; the null key is never split")
        keys = tuple(sorted(set(self.keys)))
        if len(keys) > MAX_SPLIT_KEYS:
            raise ValueError(f"at most {MAX_SPLIT_KEYS} keys may be split per epoch, "
                             f"got {len(keys)}")
        if self.lessees is not None and (isinstance(self.lessees, bool) or
                                         not isinstance(self.lessees, int) or self.lessees < 1):
            raise ValueError(f"lessees must be None or an integer >= 1, got {self.lessees!r}")
        return HotSplit(keys, self.lessees)


SplitPolicy = Callable[[HotKeyView], HotSplit]
"""A split policy: given the view before an epoch, the :class:`HotSplit` to run it with."""


@dataclass(frozen=True)
class ShareThreshold:
    """Split each key that carries at least ``share`` of the records (a lower bound, from
    the summary) and at least ``min_records`` per epoch, at most ``max_keys`` of them, into
    ``lessees`` tasks (``None``: the input's partitions). Splits nothing when the update
    cannot be split or only one worker owns bins (an owner with no peer gains nothing)."""

    share: float = 0.2
    min_records: float = 1000.0
    max_keys: int = 8
    lessees: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {self.share!r}")
        if not 1 <= self.max_keys <= MAX_SPLIT_KEYS:
            raise ValueError(f"max_keys must be in [1, {MAX_SPLIT_KEYS}], got {self.max_keys}")

    def __call__(self, view: HotKeyView) -> HotSplit:
        """The keys over the thresholds, largest first."""
        if not view.splittable or view.workers < 2 or not view.hot.total:
            return HotSplit()
        keys = [k for k, count, error in view.hot.counters
                if count - error >= self.min_records
                and (count - error) / view.hot.total >= self.share]
        return HotSplit(tuple(keys[: self.max_keys]), self.lessees)


def no_split(view: HotKeyView) -> HotSplit:
    """The policy that only detects hot keys: every key stays at its owner."""
    return HotSplit()


def epoch_summary(summaries: Iterable[Any]) -> HeavyHitters | None:
    """One epoch's heaviest keys: its workers' summaries (as :meth:`HeavyHitters.to_json` wrote
    them; empty where a worker sent none) merged, or ``None`` if none sent one (hot keys are
    not watched)."""
    parts = [HeavyHitters.from_json(s) for s in summaries if s]
    return HeavyHitters.merge(parts) if parts else None


def committed_summary(before: dict[str, Any], summaries: Iterable[Any]) -> dict[str, Any]:
    """The summary the commit record keeps after an epoch (JSON): ``before`` moved toward the
    epoch's (:func:`epoch_summary` of its workers' ``summaries``), or ``before`` unchanged if
    none sent one."""
    epoch = epoch_summary(summaries)
    if epoch is None:
        return before
    return (HeavyHitters.from_json(before).smoothed(epoch) if before else epoch).to_json()


__all__ = ["HeavyHitters", "HotKeyView", "HotSplit", "ShareThreshold", "SplitPolicy",
           "committed_summary", "epoch_summary", "no_split"]
