"""The versioned routing table: which worker owns each bin at each epoch."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from megaphone._io import atomic_write_json, read_json
from megaphone.routing.fingerprint import Fingerprint

#: Worker ids are partition ids of an epoch's Spark job, so they are kept small.
MAX_WORKERS = 4096

ROUTING_FORMAT = "megaphone.routing/2"
#: Tables written before the layout was recorded: version 0 was always ``"modulo"``.
_MODULO_FORMAT = "megaphone.routing/1"

#: How version 0 lays the bins over the workers. ``"ranges"``: worker ``w`` of ``W`` owns the
#: contiguous bins ``[w*B/W, (w+1)*B/W)``, as Flink's key groups; a bin that moves then lies
#: outside its receiver's key span, so its file goes straight to RocksDB's last level (no
#: compaction; docs/transfer.md). ``"modulo"``: bin ``i`` on worker ``i mod W``, the layout of
#: routing tables written before format 2.
LAYOUTS: tuple[str, ...] = ("ranges", "modulo")


def initial_owners(num_bins: int, workers: int, layout: str = "ranges") -> np.ndarray:
    """The owner of every bin under version 0 of a table over ``workers`` (:data:`LAYOUTS`).

    >>> initial_owners(8, 3).tolist(), initial_owners(8, 3, "modulo").tolist()
    ([0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 2, 0, 1, 2, 0, 1])
    """
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) \
            or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be in 1..{MAX_WORKERS}, got {workers!r}")
    bins = np.arange(num_bins, dtype=np.int64)
    if layout == "ranges":
        return (bins * workers // num_bins).astype(np.int32)
    if layout == "modulo":
        return (bins % workers).astype(np.int32)
    raise ValueError(f"unknown routing layout {layout!r} (one of {', '.join(LAYOUTS)})")


class Move(NamedTuple):
    """One bin changing owner: ``bin`` leaves worker ``src`` for worker ``dst``."""

    bin: int
    src: int
    dst: int


@dataclass(frozen=True)
class Version:
    """A routing version: the moves that made it, in force from ``epoch`` on."""

    version: int
    epoch: int
    moves: tuple[Move, ...]


class RoutingTable:
    """Versioned map ``(epoch, bin) -> worker``.

    Version 0 is the initial map (contiguous ranges of bins, :data:`LAYOUTS`) in force from
    epoch 0; each applied step adds a version in force from its epoch. Versions are stored as
    their moves, so a long fluid migration of many bins costs memory per move, not per bin
    per version.

    >>> from megaphone.routing.fingerprint import Fingerprint
    >>> table = RoutingTable.initial(Fingerprint("p", 8, "int64"), workers=2)
    >>> table.owner(5)
    1
    >>> table.apply_step([Move(5, 1, 2)], epoch=5)
    1
    >>> table.owner(5, epoch=4), table.owner(5, epoch=5)
    (1, 2)
    """

    def __init__(self, fingerprint: Fingerprint, initial_workers: int,
                 layout: str = "ranges") -> None:
        self.fingerprint = fingerprint
        self.initial_workers = initial_workers
        self.layout = layout
        self._initial = initial_owners(fingerprint.num_bins, initial_workers, layout)
        self._latest = self._initial.copy()
        self._latest.setflags(write=False)
        self._versions: list[Version] = [Version(0, 0, ())]
        # bin -> ([epochs...], [owners...]) for bins that ever moved: owner() at any epoch.
        self._history: dict[int, tuple[list[int], list[int]]] = {}

    @classmethod
    def initial(cls, fingerprint: Fingerprint, workers: int) -> RoutingTable:
        """The starting table: contiguous ranges of bins over ``workers``, version 0 at epoch 0."""
        return cls(fingerprint, workers)

    # -- queries -------------------------------------------------------------------------

    @property
    def num_bins(self) -> int:
        """How many bins the table routes."""
        return self.fingerprint.num_bins

    @property
    def version(self) -> int:
        """The newest version number."""
        return self._versions[-1].version

    @property
    def versions(self) -> tuple[Version, ...]:
        """Every version, oldest first."""
        return tuple(self._versions)

    @property
    def latest_epoch(self) -> int:
        """The epoch from which the newest version is in force."""
        return self._versions[-1].epoch

    def owners(self, epoch: int | None = None) -> np.ndarray:
        """The owner of every bin at ``epoch`` (default: newest version), as a read-only array."""
        if epoch is None or epoch >= self.latest_epoch:
            return self._latest
        owners = self._initial.copy()
        for version in self._versions[1:]:
            if version.epoch > epoch:
                break
            for move in version.moves:
                owners[move.bin] = move.dst
        owners.setflags(write=False)
        return owners

    def owner(self, bin: int, epoch: int | None = None) -> int:
        """The worker that owns ``bin`` at ``epoch`` (default: under the newest version)."""
        self._check_bin(bin)
        if epoch is None:
            return int(self._latest[bin])
        hist = self._history.get(bin)
        if hist is None:
            return int(self._initial[bin])
        i = bisect.bisect_right(hist[0], epoch)
        return int(hist[1][i - 1]) if i else int(self._initial[bin])

    def version_at(self, epoch: int) -> int:
        """The version in force at ``epoch`` (the newest one whose epoch is <= ``epoch``)."""
        epochs = [v.epoch for v in self._versions]
        return self._versions[bisect.bisect_right(epochs, epoch) - 1].version

    def workers(self, epoch: int | None = None) -> list[int]:
        """Live workers at ``epoch``: those that own at least one bin."""
        return sorted(int(w) for w in np.unique(self.owners(epoch)))

    def all_workers(self) -> list[int]:
        """Every worker that owns a bin under some version."""
        found = {int(w) for w in np.unique(self._initial)}
        found.update(int(m.dst) for v in self._versions for m in v.moves)
        return sorted(found)

    def bins_of(self, worker: int, epoch: int | None = None) -> np.ndarray:
        """The bins ``worker`` owns at ``epoch``."""
        return np.flatnonzero(self.owners(epoch) == worker)

    def moves_between(self, old: int, new: int) -> list[Move]:
        """The moves that turn version ``old`` into version ``new`` (bins whose owner differs)."""
        for v in (old, new):
            if not 0 <= v <= self.version:
                raise ValueError(f"unknown routing version {v} (versions 0..{self.version})")
        before = self._owners_of_version(old)
        after = self._owners_of_version(new)
        changed = np.flatnonzero(before != after)
        return [Move(int(b), int(before[b]), int(after[b])) for b in changed]

    def moves_at(self, epoch: int) -> list[Move]:
        """The moves that take effect exactly at ``epoch`` (relative to ``epoch - 1``)."""
        if epoch <= 0:
            return []
        return self.moves_between(self.version_at(epoch - 1), self.version_at(epoch))

    # -- changes -------------------------------------------------------------------------

    def check_step(self, moves: Iterable[Move], epoch: int) -> list[Move]:
        """Validate a step against the newest version without changing anything."""
        moves = [Move(*m) for m in moves]
        if epoch < self.latest_epoch:
            raise ValueError(
                f"step epoch {epoch} is before the newest version's epoch {self.latest_epoch}"
            )
        if not moves:
            raise ValueError("a step must move at least one bin")
        live = set(self.workers())
        seen: set[int] = set()
        for move in moves:
            self._check_bin(move.bin)
            if move.bin in seen:
                raise ValueError(f"bin {move.bin} is moved twice in one step")
            seen.add(move.bin)
            if move.src < 0 or move.src not in live:
                raise ValueError(f"bin {move.bin}: unknown source worker {move.src}")
            if int(self._latest[move.bin]) != move.src:
                raise ValueError(
                    f"bin {move.bin}: source worker {move.src} is not its owner "
                    f"(owner is {int(self._latest[move.bin])})"
                )
            if not 0 <= move.dst < MAX_WORKERS:
                raise ValueError(f"bin {move.bin}: destination worker {move.dst} out of range")
            if move.dst == move.src:
                raise ValueError(f"bin {move.bin}: moves from worker {move.src} to itself")
        return moves

    def apply_step(self, moves: Iterable[Move], epoch: int) -> int:
        """Add a version in force from ``epoch`` with ``moves`` applied; return its number."""
        moves = self.check_step(moves, epoch)
        latest = self._latest.copy()
        for move in moves:
            latest[move.bin] = move.dst
            epochs, owners = self._history.setdefault(move.bin, ([], []))
            if epochs and epochs[-1] == epoch:
                owners[-1] = move.dst
            else:
                epochs.append(epoch)
                owners.append(move.dst)
        latest.setflags(write=False)
        self._latest = latest
        self._versions.append(Version(self.version + 1, epoch, tuple(moves)))
        return self.version

    def truncated(self, version: int) -> RoutingTable:
        """A copy holding only versions ``0..version`` (drops versions never committed)."""
        if not 0 <= version <= self.version:
            raise ValueError(f"unknown routing version {version} (versions 0..{self.version})")
        data = self.to_dict()
        data["versions"] = data["versions"][:version]
        return RoutingTable.from_dict(data)

    def _owners_of_version(self, version: int) -> np.ndarray:
        if version == self.version:
            return self._latest
        owners = self._initial.copy()
        for v in self._versions[1 : version + 1]:
            for move in v.moves:
                owners[move.bin] = move.dst
        return owners

    def _check_bin(self, bin: int) -> None:
        if isinstance(bin, bool) or not isinstance(bin, (int, np.integer)):
            raise ValueError(f"bin must be an integer, got {bin!r}")
        if not 0 <= bin < self.num_bins:
            raise ValueError(f"unknown bin {bin} (bins are 0..{self.num_bins - 1})")

    # -- persistence ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: fingerprint, initial workers and layout, and each version's moves."""
        return {
            "format": ROUTING_FORMAT,
            "fingerprint": self.fingerprint.to_dict(),
            "initial_workers": self.initial_workers,
            "layout": self.layout,
            "versions": [
                {"version": v.version, "epoch": v.epoch, "moves": [list(m) for m in v.moves]}
                for v in self._versions[1:]
            ],
        }

    @classmethod
    def from_dict(cls, data: Any, expect: Fingerprint | None = None) -> RoutingTable:
        """Rebuild a table from :meth:`to_dict` output, replaying and re-checking every step."""
        if not isinstance(data, dict) or data.get("format") not in (ROUTING_FORMAT,
                                                                     _MODULO_FORMAT):
            raise ValueError(f"not a megaphone routing table (expected format {ROUTING_FORMAT})")
        layout = data.get("layout") if data["format"] == ROUTING_FORMAT else "modulo"
        fingerprint = Fingerprint.from_dict(data.get("fingerprint"))
        if expect is not None:
            expect.check(fingerprint, "routing table")
        workers = data.get("initial_workers")
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise ValueError(f"routing table initial_workers must be an integer, got {workers!r}")
        table = cls(fingerprint, workers, layout)
        for i, v in enumerate(data.get("versions", []), start=1):
            if not isinstance(v, dict) or v.get("version") != i:
                raise ValueError(f"routing table version {i} is missing or out of order")
            try:
                moves = [Move(*(int(x) for x in m)) for m in v["moves"]]
                table.apply_step(moves, int(v["epoch"]))
            except (KeyError, TypeError) as exc:
                raise ValueError(f"routing table version {i} is malformed: {exc}") from None
        return table

    def save(self, path: str | os.PathLike[str]) -> None:
        """Persist atomically (temp file + rename): readers see the old or the new table."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str], expect: Fingerprint | None = None) -> RoutingTable:
        """Load a saved table; with ``expect``, refuse one of another pipeline."""
        return cls.from_dict(read_json(path, "routing table"), expect)

    def __repr__(self) -> str:
        return (
            f"RoutingTable({self.fingerprint.pipeline_id!r}, bins={self.num_bins}, "
            f"version={self.version}, workers={self.workers()})"
        )
