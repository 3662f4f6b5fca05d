"""Relief-first ordering: the steps of a plan that unload the busiest worker go first.

A strategy fixes the *shape* of a plan (one step, one bin per step, one matching per step);
which step comes first is free. Bin order makes the bins of an overloaded worker wait behind
cold ones. Relief order (after Meces, ATC'22, which migrates the hottest state first, and
DRRS, ICDE'25, which schedules the sub-migrations that relieve the bottleneck first) orders
the same steps by the measured load they take off the most loaded workers:

    repeatedly take the remaining step after which the largest worker load is lowest;
    ties: the step that takes the most records off the currently most loaded worker, then
    the most records moved, then the lowest bin

A worker's load is the records per epoch of the bins it owns (``load[bin]``, as the pipeline
measures them). Guarantee: every step is the best single next step given the ones before it
(no remaining step would leave a lower maximum), so the first step is never worse than bin
order's first step and the order ends where bin order ends; the same moves, the same steps.
It is not a bound at every step count: a plan that swaps bins both ways can be ahead in bin
order midway. Without load the order is bin order (:func:`order_steps` says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from megaphone.plans.plan import PlanError
from megaphone.routing.table import Move

if TYPE_CHECKING:
    from megaphone.plans.policy import EpochView
    from megaphone.records import EpochMetrics

RELIEF = "relief"
"""Order name: the steps that most lower the largest worker load first."""
BINS = "bins"
"""Order name: the strategy's own order by bin id (the order without load data)."""
ORDERS: tuple[str, ...] = (RELIEF, BINS)
"""Every order :func:`order_steps` accepts."""


@dataclass(frozen=True)
class Ordering:
    """Steps in their chosen ``order``, and ``reason`` (why relief was not used, or ``""``)."""

    order: str
    steps: list[list[Move]]
    reason: str = ""


def check_order(order: str | None) -> None:
    """Raise :class:`PlanError` unless ``order`` is ``None`` (the default) or in :data:`ORDERS`."""
    if order is not None and order not in ORDERS:
        raise PlanError(f"unknown order {order!r}; expected one of {', '.join(ORDERS)}")


def usable_load(load: np.ndarray | None, num_bins: int) -> np.ndarray | None:
    """``load`` as floats if it is a measurement of ``num_bins`` bins with some records."""
    if load is None:
        return None
    arr = np.asarray(load, dtype=np.float64)
    if arr.shape != (num_bins,) or not np.isfinite(arr).all() or (arr < 0).any():
        raise PlanError(f"load must be {num_bins} finite records/epoch >= 0, one per bin")
    return arr if arr.any() else None


def worker_loads(owners: np.ndarray, load: np.ndarray, workers: int) -> np.ndarray:
    """Records per epoch of each worker ``0..workers-1`` when bin ``b`` is on ``owners[b]``."""
    return np.bincount(np.asarray(owners, dtype=np.int64), weights=load, minlength=workers)


def _deltas(steps: Sequence[Sequence[Move]], load: np.ndarray, workers: int) -> np.ndarray:
    """Per step, how each worker's load changes when the step applies (steps x workers)."""
    out = np.zeros((len(steps), workers), dtype=np.float64)
    for i, step in enumerate(steps):
        for b, src, dst in step:
            out[i, src] -= load[b]
            out[i, dst] += load[b]
    return out


def order_steps(steps: Sequence[Sequence[Move]], owners: np.ndarray, load: np.ndarray | None,
                order: str | None = None) -> Ordering:
    """``steps`` (each a list of moves, in bin order) in ``order``.

    ``order=None`` is relief when ``load`` (records per epoch per bin) has records, else bins;
    ``"relief"`` without load falls back to bins, with the reason. Steps are never split or
    merged: only their order changes, so each strategy keeps its step sizes. Relief costs
    ``O(steps^2 x workers)`` array work (well under a second for 2,000 one-bin steps on 64
    workers).
    """
    check_order(order)
    steps = [list(s) for s in steps]
    if order == BINS:
        return Ordering(BINS, steps)
    load = usable_load(load, len(owners))
    if load is None:
        return Ordering(BINS, steps, "no load measured: bin order")
    workers = 1 + max([int(np.max(owners))] + [m.dst for s in steps for m in s])
    current = worker_loads(owners, load, workers)
    delta = _deltas(steps, load, workers)
    first_bin = np.array([min((m.bin for m in s), default=0) for s in steps], dtype=np.int64)
    moved = np.abs(delta).sum(axis=1) / 2
    left = np.ones(len(steps), dtype=bool)
    out: list[list[Move]] = []
    for _ in range(len(steps)):
        idx = np.flatnonzero(left)
        after = (current + delta[idx]).max(axis=1)
        off_top = -delta[idx, int(np.argmax(current))]
        pick = idx[np.lexsort((first_bin[idx], -moved[idx], -off_top, after))[0]]
        current = current + delta[pick]
        left[pick] = False
        out.append(steps[pick])
    return Ordering(RELIEF, out)


def _walk(steps: Sequence[Sequence[Move]], owners: np.ndarray, load: np.ndarray
          ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every worker's load before and after each step (the steps before it applied)."""
    load = np.asarray(load, dtype=np.float64)
    workers = 1 + max([int(np.max(owners))] + [m.dst for s in steps for m in s])
    current = worker_loads(owners, load, workers)
    out = []
    for step in steps:
        after = current.copy()
        for b, src, dst in step:
            after[src] -= load[b]
            after[dst] += load[b]
        out.append((current, after))
        current = after
    return out


def max_loads(steps: Sequence[Sequence[Move]], owners: np.ndarray,
              load: np.ndarray) -> list[float]:
    """The largest worker load once each step (and the steps before it) applied."""
    return [float(after.max()) for _, after in _walk(steps, owners, load)]


def relief_steps(steps: Sequence[Sequence[Move]], owners: np.ndarray,
                 load: np.ndarray) -> list[dict[str, float | int]]:
    """What each step relieves, as ``megaphone plan`` shows it (records per epoch, rounded to
    0.1): ``records`` it moves; ``busiest``, the most loaded worker just before it (lowest
    number on ties); ``relief``, the records per epoch it takes off that worker (negative if
    it adds to it); ``busiest_after``, that worker's load after it; ``max_load``, the largest
    worker load after it (and the steps before it)."""
    load = np.asarray(load, dtype=np.float64)
    out: list[dict[str, float | int]] = []
    for step, (before, after) in zip(steps, _walk(steps, owners, load), strict=True):
        top = int(np.argmax(before))
        out.append({"records": round(float(sum(load[m.bin] for m in step)), 1),
                    "busiest": top,
                    "relief": round(float(before[top] - after[top]), 1),
                    "busiest_after": round(float(after[top]), 1),
                    "max_load": round(float(after.max()), 1)})
    return out


def busiest_workers(history: Sequence[EpochMetrics]) -> set[int]:
    """The workers that applied the most records in the newest epoch (empty without one)."""
    if not history:
        return set()
    records = {int(w): wm.records_in or 0 for w, wm in history[-1].per_worker.items()}
    top = max(records.values(), default=0)
    return {w for w, n in records.items() if n == top} if top > 0 else set()


def relief_first(view: EpochView, size: Mapping[Move, int]) -> list[Move]:
    """``view.remaining`` by the records per epoch a move takes off the busiest worker (the
    newest epoch's most records in) per unit of ``size`` (its bytes, or the microseconds its
    transfer is predicted to take), most first; then by its records per unit (a bin of no
    size counts as one); ties keep the plan's order, which is relief order when the plan was
    made with load. Without a measured epoch every sender counts as busiest."""
    busiest = busiest_workers(view.history)

    def key(m: Move) -> tuple[float, float]:
        per_byte = view.bin_records.get(m.bin, 0.0) / max(size[m], 1)
        return (-per_byte if not busiest or m.src in busiest else 0.0, -per_byte)

    return sorted(view.remaining, key=key)


__all__ = [
    "BINS",
    "ORDERS",
    "RELIEF",
    "Ordering",
    "busiest_workers",
    "check_order",
    "max_loads",
    "order_steps",
    "relief_first",
    "relief_steps",
    "usable_load",
    "worker_loads",
]
