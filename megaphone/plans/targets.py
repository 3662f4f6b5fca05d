"""Target assignments: which worker should own each bin after a rescale.

Pure functions over numpy arrays (``owners[bin] = worker`` and ``weights[bin]``), so they are
fast to test and independent of Spark and of the state backends. Two ways to get a target:

* :func:`balanced_target` scales to ``N`` workers, balancing the per-worker sum of bin weights
  (keys, bytes or observed load) while moving as little as possible;
* :func:`explicit_target` applies a user's map ``{bin: worker}`` or full list of owners.

:func:`target_moves` turns a target into the :class:`~megaphone.routing.table.Move` list that a
strategy (:mod:`megaphone.plans.strategies`) orders into steps.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from megaphone.plans.plan import PlanError
from megaphone.routing.table import MAX_WORKERS, Move

#: What :func:`balanced_target` can balance: keys per bin, bytes per bin, or observed records.
BALANCE_MODES: tuple[str, ...] = ("keys", "bytes", "load")

TargetSpec = Mapping[Any, Any] | Sequence[Any] | np.ndarray
"""A user's target: ``{bin: worker}`` (keys may be strings, as in JSON) or a list of owners."""


def check_workers(workers: int) -> int:
    """Validate a target worker count (``1..MAX_WORKERS``) and return it as an ``int``."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)):
        raise PlanError(f"workers must be an integer, got {workers!r}")
    if not 1 <= workers <= MAX_WORKERS:
        raise PlanError(f"workers must be in 1..{MAX_WORKERS}, got {workers}")
    return int(workers)


def balanced_target(owners: np.ndarray, weights: np.ndarray, workers: int) -> np.ndarray:
    """New owners over workers ``0..workers-1``, balanced by ``weights`` with few moves.

    Bins stay where they are unless their worker must shed load:

    1. bins of removed workers (ids ``>= workers``) must all move; they are placed largest
       first on the currently least loaded worker (LPT);
    2. then, while it strictly lowers the pair's maximum, one bin moves from the most loaded to
       the least loaded worker, choosing the bin whose weight best fits what the pair needs
       (``min(excess of the sender, deficit of the receiver)`` against the mean), so no move
       overshoots and every byte moved reduces imbalance; bins already on the move (from a
       removed worker or an earlier move) go first, since moving them again costs nothing;
    3. finally bins of weight zero (no keys yet) even out the bin counts, moving only while
       two workers differ by two or more bins; bins already on the move are preferred.

    The result is within one bin of the ideal: every worker exceeds the least loaded one by
    at most the weight of its own smallest bin, and with equal weights bin counts differ by
    at most one. Ties break on worker and bin id, so the same input always gives the same target.
    """
    workers = check_workers(workers)
    owners = np.asarray(owners, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if owners.shape != weights.shape or owners.ndim != 1:
        raise PlanError("owners and weights must be 1-d arrays of the same length")
    if owners.size == 0:
        return owners.copy()
    if (weights < 0).any() or not np.isfinite(weights).all():
        raise PlanError("bin weights must be finite and >= 0")
    target = owners.copy()
    load = np.zeros(workers, dtype=np.float64)
    count = np.zeros(workers, dtype=np.int64)
    kept = owners < workers
    np.add.at(load, owners[kept], weights[kept])
    np.add.at(count, owners[kept], 1)

    # 1. removed workers' bins: largest first onto the least loaded worker (LPT).
    removed = np.flatnonzero(~kept)
    for b in sorted(removed.tolist(), key=lambda b: (-weights[b], b)):
        w = _argmin(load, count)
        target[b] = w
        load[w] += weights[b]
        count[w] += 1

    total = float(weights.sum())
    tol = 1e-9 * max(total, 1.0)
    mean = total / workers
    # Per worker: positive-weight bins sorted by (weight, bin), those already on the move
    # (away from their current owner, so moving them again costs nothing extra) apart from
    # those at home; zero-weight bins by bin id.
    home: list[list[tuple[float, int]]] = [[] for _ in range(workers)]
    away: list[list[tuple[float, int]]] = [[] for _ in range(workers)]
    light: list[list[int]] = [[] for _ in range(workers)]
    for b in range(owners.size):
        if weights[b] > 0:
            (home if target[b] == owners[b] else away)[target[b]].append((float(weights[b]), b))
        else:
            light[target[b]].append(b)
    for lst in home + away:
        lst.sort()

    # 2. most loaded -> least loaded while the pair's maximum strictly drops. A worker with no
    # bin that fits (say, one huge bin) is set aside so the others still even out among
    # themselves; it rejoins once it receives a bin.
    stuck = np.zeros(workers, dtype=bool)
    moves_left = 16 * owners.size + 4 * workers  # a safety net; far more than ever needed
    while moves_left > 0 and not stuck.all():
        a = _argmax(np.where(stuck, -np.inf, load), count)
        r = _argmin(load, count)
        gap = load[a] - load[r]
        if a == r or gap <= tol:
            break
        want = min(load[a] - mean, mean - load[r])
        source = away[a]
        pick = _best_fit(source, want, gap - tol)
        if pick is None:
            source = home[a]
            pick = _best_fit(source, want, gap - tol)
        if pick is None:
            stuck[a] = True
            continue
        w, b = source.pop(pick)
        bisect.insort((home if owners[b] == r else away)[r], (w, b))
        target[b] = r
        load[a] -= w
        load[r] += w
        count[a] -= 1
        count[r] += 1
        stuck[r] = False
        moves_left -= 1

    # 3. weight-free bins even out the bin counts.
    for _ in range(owners.size + workers):
        donors = [w for w in range(workers) if light[w]]
        if not donors:
            break
        a = max(donors, key=lambda w: (count[w], -w))
        r = min(range(workers), key=lambda w: (count[w], w))
        if count[a] - count[r] < 2:
            break
        moving = [b for b in light[a] if owners[b] != a]
        b = moving[0] if moving else light[a][0]
        light[a].remove(b)
        bisect.insort(light[r], b)
        target[b] = r
        count[a] -= 1
        count[r] += 1
    return target


def _argmax(load: np.ndarray, count: np.ndarray) -> int:
    """The most loaded worker: highest load, then most bins, then lowest id."""
    cands = np.flatnonzero(load == load.max())
    return int(cands[np.argmax(count[cands])])


def _argmin(load: np.ndarray, count: np.ndarray) -> int:
    """The least loaded worker: lowest load, then fewest bins, then lowest id."""
    cands = np.flatnonzero(load == load.min())
    return int(cands[np.argmin(count[cands])])


def _best_fit(bins: list[tuple[float, int]], want: float, limit: float) -> int | None:
    """Index in sorted ``bins`` of the weight closest to ``want`` among weights < ``limit``.

    Ties prefer the heavier bin (more progress), then the lower bin id.
    """
    end = bisect.bisect_left(bins, (limit, -1))  # bins[:end] have weight < limit
    if end == 0:
        return None
    pos = min(bisect.bisect_left(bins, (want, -1), 0, end), end - 1)
    best = pos
    if pos > 0 and abs(bins[pos - 1][0] - want) < abs(bins[pos][0] - want):
        best = pos - 1
    return bisect.bisect_left(bins, (bins[best][0], -1), 0, end)  # lowest bin id at that weight


def explicit_target(owners: np.ndarray, target: TargetSpec) -> np.ndarray:
    """New owners from a user's map ``{bin: worker}`` (others stay) or full list of owners.

    Bins that do not exist, malformed bins or workers, and lists of the wrong length raise
    :class:`PlanError` naming them.
    """
    owners = np.asarray(owners, dtype=np.int64)
    num_bins = owners.size
    out = owners.copy()
    if isinstance(target, Mapping):
        items = list(target.items())
    elif isinstance(target, (Sequence, np.ndarray)) and not isinstance(target, (str, bytes)):
        if len(target) != num_bins:
            raise PlanError(
                f"a target list must name the owner of every bin: got {len(target)} entries "
                f"for {num_bins} bins"
            )
        items = list(enumerate(target))
    else:
        raise PlanError("target must be a {bin: worker} object or a list of owners, one per bin")
    bad_bins: list[str] = []
    unknown: list[int] = []
    bad_workers: list[str] = []
    parsed: list[tuple[int, int]] = []
    for raw_bin, raw_worker in items:
        b = _as_int(raw_bin)
        if b is None:
            bad_bins.append(repr(raw_bin))
            continue
        if not 0 <= b < num_bins:
            unknown.append(b)
            continue
        w = _as_int(raw_worker, strings=False)
        if w is None or not 0 <= w < MAX_WORKERS:
            bad_workers.append(f"bin {b} -> {raw_worker!r}")
            continue
        parsed.append((b, w))
    if unknown:
        names = ", ".join(str(b) for b in sorted(set(unknown))[:10])
        more = f" and {len(set(unknown)) - 10} more" if len(set(unknown)) > 10 else ""
        raise PlanError(
            f"target names bins that do not exist: {names}{more} (bins are 0..{num_bins - 1})"
        )
    if bad_bins:
        raise PlanError(f"target bins must be integers, got {', '.join(bad_bins[:10])}")
    if bad_workers:
        raise PlanError(
            f"target workers must be integers in 0..{MAX_WORKERS - 1}: "
            + ", ".join(bad_workers[:10])
        )
    for b, w in parsed:
        out[b] = w
    return out


def _as_int(value: Any, strings: bool = True) -> int | None:
    """``value`` as an int (JSON object keys arrive as strings), or None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if strings and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def read_target_file(path: str | os.PathLike[str]) -> TargetSpec:
    """Read a target map from JSON: ``{"bin": worker, ...}`` or a list of owners."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise PlanError(f"target file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"target file {path} is not readable JSON: {exc}") from None
    if not isinstance(data, (dict, list)):
        raise PlanError(f"target file {path} must hold a {{bin: worker}} object or a list")
    return data


def target_moves(owners: np.ndarray, target: np.ndarray) -> list[Move]:
    """The moves that turn ``owners`` into ``target``, one per bin that changes, by bin id."""
    owners = np.asarray(owners)
    target = np.asarray(target)
    changed = np.flatnonzero(owners != target)
    return [Move(int(b), int(owners[b]), int(target[b])) for b in changed]


__all__ = [
    "BALANCE_MODES",
    "TargetSpec",
    "balanced_target",
    "check_workers",
    "explicit_target",
    "read_target_file",
    "target_moves",
]
