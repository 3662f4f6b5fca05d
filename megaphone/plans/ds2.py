"""DS2 (Kalavri et al., OSDI 2018): the optimal parallelism of every operator from true rates.

DS2 measures each operator instance's *useful time* -- the time it spends processing, not
waiting for input -- and derives *true* rates that do not depend on how busy the instance was:

* true processing rate ``lp = records_processed / useful_time``;
* true output rate ``lo = records_produced / useful_time``;

an operator's rates are the sums over its ``p`` instances. Visiting operators in topological
order, the rate an operator must sustain is what its upstream operators would emit if *they*
kept up with the source rate, and its optimal parallelism is that rate over the true rate of
one instance::

    pi_i = ceil( sum_j A[j, i] * lo_j* / (lp_i / p_i) )
    lo_j* = source rate of j                                  if j is a source
          = (lo_j / lp_j) * sum_u A[u, j] * lo_u*             otherwise

``lo_j / lp_j`` is the operator's selectivity (outputs per input), so ``lo_j*`` is the output
rate ``j`` would have at the target input rate. With linear scaling one decision reaches the
right size; otherwise a few policy intervals do (DS2 needed at most 3 in the paper's runs).

Everything here is pure (numbers in, numbers out): :func:`rates_from_metrics` turns a window
of a megaphone pipeline's per-epoch metrics into :class:`OperatorRates`, and
:func:`optimal_parallelism` applies the formula to a dataflow graph given as a list of edges
or an adjacency matrix. The policy around it (windows, warm-up) is in :mod:`.autoscale`, the
decision in :mod:`.scale_decision`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from megaphone.records import EpochMetrics
from megaphone.snailtrail import EpochTrace
from megaphone.snailtrail.usage import WorkerUsage, usage_by_epoch

#: Relative slack before ``ceil``: 3.0000000001 instances of work is 3 instances, not 4.
_EPS = 1e-9


@dataclass(frozen=True)
class OperatorRates:
    """One operator's observed rates over a policy window, summed over its instances.

    ``instances`` is ``p``, the parallelism the rates were observed at; ``processing_rate`` and
    ``output_rate`` are the true rates ``lp`` and ``lo`` (records per second of useful time,
    summed over instances); ``records_in``, ``records_out`` and ``useful_s`` are the raw window
    totals they came from (for logs). Build one with :meth:`from_instances` or
    :func:`rates_from_metrics`; the constructor checks the numbers.
    """

    instances: int
    processing_rate: float
    output_rate: float
    records_in: float = 0.0
    records_out: float = 0.0
    useful_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.instances, bool) or not isinstance(self.instances, (int, np.integer)) \
                or self.instances < 1:
            raise ValueError(f"instances must be an integer >= 1, got {self.instances!r}")
        for name in ("processing_rate", "output_rate", "records_in", "records_out", "useful_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float, np.integer, np.floating)) or \
                    not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def per_instance_rate(self) -> float:
        """``lp / p``: the true processing rate of one instance (records/s)."""
        return self.processing_rate / self.instances

    @property
    def selectivity(self) -> float:
        """``lo / lp``: outputs per input record (0 for an operator that processed nothing)."""
        return self.output_rate / self.processing_rate if self.processing_rate > 0 else 0.0

    @classmethod
    def from_instances(
        cls, instances: Iterable[tuple[float, float, float]]
    ) -> OperatorRates:
        """Rates from ``(records_processed, records_produced, useful_s)`` per instance.

        Each instance's true rates are its records over its own useful time, and the
        operator's rates are their sums, as in DS2. An instance with no useful time contributes
        nothing (it ran no code, so it says nothing about the rate). An instance that had
        useful time but processed no record (an idle worker: its time is fixed overhead) tells
        nothing about its capacity either; it still counts as an instance but is credited with
        the mean rate of the instances that did process records, so idle instances do not make
        the operator look slower than it is. Raises ``ValueError`` for negative numbers or when
        no instance has useful time.
        """
        rows = [(float(r), float(o), float(u)) for r, o, u in instances]
        for r, o, u in rows:
            if min(r, o, u) < 0 or not all(math.isfinite(x) for x in (r, o, u)):
                raise ValueError(f"records and useful time must be finite and >= 0, got "
                                 f"records_in={r}, records_out={o}, useful_s={u}")
        active = [(r, o, u) for r, o, u in rows if u > 0]
        if not active:
            raise ValueError("no instance has any useful time in the window: nothing to "
                             "compute true rates from")
        busy = [(r / u, o / u) for r, o, u in active if r > 0]
        if busy:
            mean_lp = sum(lp for lp, _ in busy) / len(busy)
            mean_lo = sum(lo for _, lo in busy) / len(busy)
        else:
            mean_lp = mean_lo = 0.0
        idle = len(active) - len(busy)
        return cls(
            instances=len(active),
            processing_rate=sum(lp for lp, _ in busy) + idle * mean_lp,
            output_rate=sum(lo for _, lo in busy) + idle * mean_lo,
            records_in=sum(r for r, _, _ in active),
            records_out=sum(o for _, o, _ in active),
            useful_s=sum(u for _, _, u in active),
        )

    def to_dict(self) -> dict[str, float | int]:
        """The rates as a flat dict (with the derived per-instance rate), for logs and JSON."""
        return {
            "instances": int(self.instances),
            "records_in": float(self.records_in),
            "records_out": float(self.records_out),
            "useful_s": round(float(self.useful_s), 6),
            "processing_rate": round(float(self.processing_rate), 3),
            "output_rate": round(float(self.output_rate), 3),
            "per_instance_rate": round(float(self.per_instance_rate), 3),
        }


def rates_from_metrics(metrics_window: Iterable[EpochMetrics],
                       traces: Iterable[EpochTrace] = ()) -> OperatorRates:
    """The true rates of a megaphone pipeline's operator over a window of epoch metrics.

    A pipeline is one keyed operator whose instances are its workers. Each worker's records
    in and out and useful time (time spent applying records and installing state, excluding
    waiting for input) are summed over the window's epochs; then
    :meth:`OperatorRates.from_instances` combines the workers. The useful time is read from
    the epoch's SnailTrail trace when ``traces`` holds it (:func:`~megaphone.snailtrail.usage.
    epoch_usage`: the activities ``megaphone explain`` ranks), else from the metrics
    (``per_worker[w].useful_s``). Workers without useful time (an old owner that only exported
    bins, a worker without bins) contribute nothing. Raises ``ValueError`` when no worker has
    useful time in the window.
    """
    usage = usage_by_epoch(traces)
    totals: dict[int, list[float]] = {}
    for record in metrics_window:
        traced = usage.get(record.epoch)
        for w, wm in record.per_worker.items():
            row = totals.setdefault(int(w), [0.0, 0.0, 0.0])
            row[0] += float(wm.records_in or 0)
            row[1] += float(wm.records_out or 0)
            row[2] += float(wm.useful_s or 0) if traced is None else \
                traced.get(int(w), WorkerUsage()).useful_s
    if not totals:
        raise ValueError("the metrics window holds no per-worker metrics")
    return OperatorRates.from_instances(tuple(row) for _, row in sorted(totals.items()))


@dataclass(frozen=True)
class DS2Result:
    """What :func:`optimal_parallelism` decided, with the numbers behind it.

    ``parallelism`` is the optimal instance count of every non-source operator;
    ``target_input`` the input rate each operator must sustain (``sum_j A[j,i] lo_j*``);
    ``target_output`` the output rate ``lo*`` of every operator, sources included; ``order`` the
    topological order used.
    """

    parallelism: dict[str, int]
    target_input: dict[str, float] = field(default_factory=dict)
    target_output: dict[str, float] = field(default_factory=dict)
    order: tuple[str, ...] = ()


Edges = Iterable[tuple[str, str]] | np.ndarray | Sequence[Sequence[float]]
"""A dataflow graph: ``(upstream, downstream)`` pairs of operator names (strings), or a square
adjacency matrix (numbers) with ``A[j][i] > 0`` for an edge ``j -> i``, its rows named by
``names`` (``"0"``, ``"1"``, ... without)."""


def _adjacency(
    edges: Edges, names: Sequence[str] | None, operators: Iterable[str]
) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Nodes and ``upstream[i] = {j: A[j,i]}`` from an edge list or a matrix."""
    if not isinstance(edges, np.ndarray):
        edges = list(edges)
    is_matrix = names is not None or isinstance(edges, np.ndarray) or (
        len(edges) > 0 and all(isinstance(x, (int, float, np.integer, np.floating))
                               for x in edges[0])
    )
    upstream: dict[str, dict[str, float]] = {}
    if is_matrix:
        matrix = np.asarray(edges, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"the adjacency matrix must be square, got shape {matrix.shape}")
        nodes = [str(n) for n in names] if names is not None else \
            [str(i) for i in range(matrix.shape[0])]
        if len(nodes) != matrix.shape[0] or len(set(nodes)) != len(nodes):
            raise ValueError(f"names must be {matrix.shape[0]} distinct operator names, got "
                             f"{list(nodes)}")
        if not np.isfinite(matrix).all() or (matrix < 0).any():
            raise ValueError("adjacency entries must be finite and >= 0 (1 for an edge)")
        for i, node in enumerate(nodes):
            upstream[node] = {nodes[j]: float(matrix[j, i]) for j in range(len(nodes))
                              if matrix[j, i] > 0}
        return nodes, upstream
    nodes = []
    for pair in edges:
        if len(pair) != 2:
            raise ValueError(f"an edge is an (upstream, downstream) pair, got {pair!r}")
        src, dst = (str(x) for x in pair)
        for node in (src, dst):
            if node not in upstream:
                upstream[node] = {}
                nodes.append(node)
        upstream[dst][src] = upstream[dst].get(src, 0.0) + 1.0
    for node in operators:  # an operator with no edge at all is still a node
        if node not in upstream:
            upstream[node] = {}
            nodes.append(node)
    return nodes, upstream


def topological_order(nodes: Sequence[str], upstream: Mapping[str, Mapping[str, float]]
                      ) -> list[str]:
    """``nodes`` ordered so every operator follows its upstream ones (Kahn's algorithm).

    Ties keep the given node order, so the result is deterministic. Raises ``ValueError``
    naming the operators on a cycle (DS2 needs a DAG).
    """
    pending = {n: len(upstream.get(n, {})) for n in nodes}
    downstream: dict[str, list[str]] = {n: [] for n in nodes}
    for n in nodes:
        for u in upstream.get(n, {}):
            downstream[u].append(n)
    ready = [n for n in nodes if pending[n] == 0]
    order: list[str] = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for d in downstream[n]:
            pending[d] -= 1
            if pending[d] == 0:
                ready.append(d)
    if len(order) != len(nodes):
        stuck = [n for n in nodes if n not in set(order)]
        raise ValueError(f"the dataflow graph has a cycle through {', '.join(stuck)}; DS2 "
                         "needs a DAG")
    return order


def optimal_parallelism(
    rates: Mapping[str, OperatorRates],
    edges: Edges,
    source_rates: Mapping[str, float],
    names: Sequence[str] | None = None,
) -> DS2Result:
    """DS2's optimal parallelism of every operator of a dataflow graph.

    ``rates`` holds the observed :class:`OperatorRates` of every non-source operator;
    ``source_rates`` the target output rate (records/s) of every source; ``edges`` the graph as
    ``(upstream, downstream)`` pairs or an adjacency matrix ``A`` (``A[j][i]`` > 0 for an edge
    ``j -> i``; a weight other than 1 scales that edge's traffic; ``names`` names the rows).
    An operator that must sustain no input gets one instance (it cannot have zero).

    Raises ``ValueError`` for a cycle, a negative or non-finite source rate, a non-source
    operator without rates, an operator with no inputs that is not a source, or an operator
    that must sustain input but processed nothing in the window (its capacity is unknown).

    >>> r = OperatorRates(instances=2, processing_rate=1000.0, output_rate=1000.0)
    >>> optimal_parallelism({"op": r}, [("src", "op")], {"src": 1200.0}).parallelism
    {'op': 3}
    """
    for name, value in source_rates.items():
        if not isinstance(value, (int, float, np.integer, np.floating)) or \
                not math.isfinite(value) or value < 0:
            raise ValueError(f"source rate of {name!r} must be a finite number >= 0, "
                             f"got {value!r}")
    nodes, upstream = _adjacency(edges, names, list(rates) + list(source_rates))
    order = topological_order(nodes, upstream)
    target_input: dict[str, float] = {}
    target_output: dict[str, float] = {}
    parallelism: dict[str, int] = {}
    for node in order:
        if node in source_rates:
            target_output[node] = float(source_rates[node])
            continue
        if not upstream[node]:
            raise ValueError(f"operator {node!r} has no upstream operator and no source rate")
        if node not in rates:
            raise ValueError(f"no observed rates for operator {node!r}")
        r = rates[node]
        need = sum(weight * target_output[u] for u, weight in upstream[node].items())
        target_input[node] = need
        target_output[node] = r.selectivity * need
        if need <= 0:
            parallelism[node] = 1
            continue
        if r.processing_rate <= 0:
            raise ValueError(f"operator {node!r} must sustain {need:.1f} records/s but processed "
                             "no record in the window: its true rate is unknown")
        parallelism[node] = max(1, math.ceil(need / r.per_instance_rate * (1 - _EPS)))
    return DS2Result(parallelism, target_input, target_output, tuple(order))


def optimal_workers(rates: OperatorRates, source_rate: float) -> int:
    """DS2 for a single operator fed directly by a source: ``ceil(source_rate / (lp / p))``."""
    return optimal_parallelism({"operator": rates}, [("source", "operator")],
                               {"source": source_rate}).parallelism["operator"]


__all__ = [
    "DS2Result",
    "Edges",
    "OperatorRates",
    "optimal_parallelism",
    "optimal_workers",
    "rates_from_metrics",
    "topological_order",
]
