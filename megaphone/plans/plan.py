"""The migration plan: the JSON document users, the CLI and the operator exchange."""

from __future__ import annotations

import json
import operator
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from megaphone._io import atomic_write_bytes
from megaphone.errors import MegaphoneError
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import MAX_WORKERS, Move, RoutingTable

PLAN_FORMAT = "megaphone.plan/1"
EPOCH_MODES = ("relative", "absolute")


class PlanError(MegaphoneError, ValueError):
    """A plan that cannot be applied; the message names the offending step and bin."""


@dataclass(frozen=True)
class PlanStep:
    """A set of moves that take effect together at ``epoch`` (absolute or relative)."""

    epoch: int
    moves: tuple[Move, ...]


@dataclass(frozen=True)
class MigrationPlan:
    """Ordered steps that move bins between workers, made for one pipeline and routing version.

    ``epochs="relative"`` counts each step's epoch from the first epoch after the plan is
    submitted (0 = that epoch); ``"absolute"`` names epochs outright. A plan with a ``policy``
    (e.g. ``{"name": "deadline", "target_latency_s": 2.0}``) is *adaptive*: its steps only
    list the moves, each bin once, and the policy decides at every epoch which of them start
    (:mod:`megaphone.plans.policy`, whose ``plan_policy`` builds it: the plan keeps only its
    spec, checked when the policy is built). Plans are plain data:
    :meth:`to_json` and :meth:`from_json` are the only ways in and out; nothing is unpickled.

    >>> from megaphone.routing.fingerprint import Fingerprint
    >>> plan = MigrationPlan(Fingerprint("p", 8, "int64"), 0, (PlanStep(0, (Move(1, 1, 2),)),))
    >>> MigrationPlan.from_json(plan.to_json()) == plan
    True
    """

    fingerprint: Fingerprint
    base_version: int
    steps: tuple[PlanStep, ...]
    epochs: str = "relative"
    strategy: str = "custom"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    policy: dict[str, Any] | None = None

    @property
    def adaptive(self) -> bool:
        """True if a policy chooses the steps while the plan runs (see ``policy``)."""
        return self.policy is not None

    @property
    def empty(self) -> bool:
        """True if the plan moves no bin (no steps, or only steps without moves), as
        :func:`~megaphone.rescale` plans a layout already in place: it is accepted (once
        checked against the pipeline and its routing version) and done at once."""
        return not any(step.moves for step in self.steps)

    @property
    def end_version(self) -> int:
        """The routing version in force once every step has been applied (fixed plans only:
        an adaptive plan's number of steps is known only when it is done). An empty plan
        leaves the routing at ``base_version``."""
        return self.base_version + sum(1 for step in self.steps if step.moves)

    @property
    def moves(self) -> list[Move]:
        """Every move of every step, in order."""
        return [m for step in self.steps for m in step.moves]

    # -- validation ----------------------------------------------------------------------

    def validate(self, table: RoutingTable, next_epoch: int | None = None) -> None:
        """Raise :class:`PlanError` unless every step applies, in order, on top of ``table``.

        Checks the fingerprint, that the plan starts from the table's newest version, that
        steps are non-empty with increasing epochs (absolute ones not before ``next_epoch``),
        and for each move: a known bin, moved at most once per step, whose source is a live
        worker that owns it at that point, and a destination in range. An :attr:`empty` plan
        (no step moves a bin) passes the same checks but for the steps' moves: it has nothing
        to do. ``table`` is not changed.
        """
        try:
            table.fingerprint.check(self.fingerprint, "plan")
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        if self.base_version != table.version:
            raise PlanError(
                f"stale plan: it starts from routing version {self.base_version}, "
                f"but the pipeline is at version {table.version}"
            )
        empty = self.empty
        owners = np.array(table.owners(), copy=True)
        live = {int(w) for w in np.unique(owners)}
        previous = None
        for i, step in enumerate(self.steps):
            where = f"step {i} (epoch {step.epoch})"
            if not step.moves and not empty:
                raise PlanError(f"{where}: moves no bin")
            if previous is not None and step.epoch <= previous:
                raise PlanError(f"{where}: epoch is not after the previous step's {previous}")
            previous = step.epoch
            if self.epochs == "relative" and step.epoch < 0:
                raise PlanError(f"{where}: relative epoch must be >= 0")
            if self.epochs == "absolute" and next_epoch is not None and step.epoch < next_epoch:
                raise PlanError(f"{where}: epoch already passed (next epoch is {next_epoch})")
            seen: set[int] = set()
            for move in step.moves:
                b, src, dst = move
                if not 0 <= b < table.num_bins:
                    raise PlanError(f"{where}: unknown bin {b} (bins are 0..{table.num_bins - 1})")
                if b in seen:
                    raise PlanError(f"{where}: bin {b} is moved twice in one step")
                seen.add(b)
                if src < 0:
                    raise PlanError(f"{where}, bin {b}: negative source worker {src}")
                if src not in live:
                    raise PlanError(f"{where}, bin {b}: unknown source worker {src}")
                if owners[b] != src:
                    raise PlanError(
                        f"{where}, bin {b}: source worker {src} is not the owner at that point "
                        f"(worker {int(owners[b])} is)"
                    )
                if not 0 <= dst < MAX_WORKERS:
                    raise PlanError(
                        f"{where}, bin {b}: destination worker {dst} outside 0..{MAX_WORKERS - 1}"
                    )
                if dst == src:
                    raise PlanError(f"{where}, bin {b}: moves from worker {src} to itself")
            for b, _, dst in step.moves:
                owners[b] = dst
            live = {int(w) for w in np.unique(owners)}
        if self.adaptive:
            counts = Counter(m.bin for m in self.moves)
            if len(counts) != len(self.moves):
                twice = min(b for b, n in counts.items() if n > 1)
                raise PlanError(f"adaptive plan moves bin {twice} more than once; its policy "
                                "orders the moves, so each bin may appear only once")

    def absolute_epochs(self, first_epoch: int) -> list[int]:
        """Each step's absolute epoch when the plan's first possible epoch is ``first_epoch``.

        A step never takes effect before ``first_epoch`` nor in the same epoch as the step
        before it, so a queued plan whose epochs passed while it waited keeps its order.
        """
        out: list[int] = []
        for step in self.steps:
            epoch = first_epoch + step.epoch if self.epochs == "relative" else step.epoch
            epoch = max(epoch, first_epoch, out[-1] + 1 if out else epoch)
            out.append(epoch)
        return out

    # -- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON form documented in the README."""
        return {
            "format": PLAN_FORMAT,
            "fingerprint": self.fingerprint.to_dict(),
            "base_version": self.base_version,
            "epochs": self.epochs,
            "strategy": self.strategy,
            "meta": self.meta,
            **({"policy": self.policy} if self.policy is not None else {}),
            "steps": [
                {"epoch": s.epoch, "moves": [[m.bin, m.src, m.dst] for m in s.moves]}
                for s in self.steps
            ],
        }

    def to_json(self, indent: int | None = None) -> str:
        """Serialize to JSON text (the exchange format of ``megaphone plan`` and ``migrate``)."""
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON atomically."""
        atomic_write_bytes(path, self.to_json(indent=1).encode())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MigrationPlan:
        """Read a plan file; a missing or malformed file is a :class:`PlanError`."""
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise PlanError(f"cannot read plan {path}: {exc}") from None
        return cls.from_json(text)

    @classmethod
    def from_json(cls, text: str | bytes) -> MigrationPlan:
        """Parse and type-check a plan; any deviation from the format is a :class:`PlanError`."""
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as exc:
            raise PlanError(f"plan is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> MigrationPlan:
        """Build a plan from its JSON form, checking every field's type."""
        if not isinstance(data, dict):
            raise PlanError("plan must be a JSON object")
        if data.get("format") != PLAN_FORMAT:
            raise PlanError(f"plan format must be {PLAN_FORMAT!r}, got {data.get('format')!r}")
        known = {"format", "fingerprint", "base_version", "epochs", "strategy", "meta", "steps",
                 "policy"}
        unknown = set(data) - known
        if unknown:
            raise PlanError(f"plan has unknown fields: {sorted(unknown)}")
        try:
            fingerprint = Fingerprint.from_dict(data.get("fingerprint"))
        except ValueError as exc:
            raise PlanError(f"plan {exc}") from None
        base_version = _int(data.get("base_version"), "base_version")
        if base_version < 0:
            raise PlanError(f"base_version must be >= 0, got {base_version}")
        epochs = data.get("epochs", "relative")
        if epochs not in EPOCH_MODES:
            raise PlanError(f"epochs must be one of {EPOCH_MODES}, got {epochs!r}")
        strategy = data.get("strategy", "custom")
        meta = data.get("meta", {})
        if not isinstance(strategy, str) or not isinstance(meta, dict):
            raise PlanError("strategy must be a string and meta an object")
        raw_steps = data.get("steps")
        if not isinstance(raw_steps, list):
            raise PlanError("steps must be a list")
        policy = data.get("policy")
        if policy is not None and not (isinstance(policy, dict)
                                       and isinstance(policy.get("name"), str)):
            raise PlanError(f"policy must be an object with a string 'name', got {policy!r}")
        return cls(fingerprint, base_version, tuple(_step(s, i) for i, s in enumerate(raw_steps)),
                   epochs, strategy, meta, policy)

    @classmethod
    def from_moves(
        cls,
        table: RoutingTable,
        steps: Iterable[Iterable[Move]],
        gap: int = 0,
        strategy: str = "custom",
    ) -> MigrationPlan:
        """A relative plan from ``table``'s newest version: step ``i`` at epoch ``i * (gap+1)``."""
        if gap < 0:
            raise PlanError(f"gap must be >= 0 epochs, got {gap}")
        built = tuple(
            PlanStep(i * (gap + 1), tuple(_move(m) for m in moves))
            for i, moves in enumerate(steps)
        )
        return cls(table.fingerprint, table.version, built, "relative", strategy)


def _move(m: Iterable[Any]) -> Move:
    """A move of plain ints (numpy integers, e.g. from ``routing.owners()``, are converted;
    anything else that is not an integer is a :class:`PlanError`)."""
    try:
        b, src, dst = (operator.index(v) for v in m)
    except (TypeError, ValueError):
        raise PlanError(f"a move is (bin, src, dst) of integers, got {m!r}") from None
    return Move(int(b), int(src), int(dst))


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{what} must be an integer, got {value!r}")
    return value


def _step(data: Any, i: int) -> PlanStep:
    if not isinstance(data, dict) or set(data) != {"epoch", "moves"}:
        raise PlanError(f"step {i} must be an object with exactly 'epoch' and 'moves'")
    epoch = _int(data["epoch"], f"step {i} epoch")
    if not isinstance(data["moves"], list):
        raise PlanError(f"step {i} moves must be a list")
    moves = []
    for j, m in enumerate(data["moves"]):
        if not isinstance(m, list) or len(m) != 3:
            raise PlanError(f"step {i} move {j} must be [bin, from_worker, to_worker], got {m!r}")
        moves.append(Move(*(_int(x, f"step {i} move {j}") for x in m)))
    return PlanStep(epoch, tuple(moves))
