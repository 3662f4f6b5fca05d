"""megaphone: move keyed streaming state between workers while a PySpark pipeline runs.

The public API: :func:`bin_of` and :func:`bin_column` (keys to bins, in Python and in the
JVM), :class:`RoutingTable`, :class:`MigrationPlan`, :class:`Pipeline`, :func:`rescale` and
:func:`migrate`; event-time operators to give a pipeline as its ``update``
(:class:`WindowAggregate`, :class:`Join` with :func:`join_input`, or your own
:class:`ProcessFunction`), a :class:`Combiner` (an update whose hot keys can be split across
workers, with :class:`ShareThreshold` and :class:`HotSplit` to decide when) and :class:`Chain` to
run pipelines one after the other; the errors
:class:`PlanError` (a plan that cannot be applied) and :class:`UpdateError` (an update
function that failed on a key).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from megaphone._version import __version__

if TYPE_CHECKING:
    from megaphone.migrator.pipeline.api import migrate, rescale
    from megaphone.migrator.pipeline.chain import Chain
    from megaphone.migrator.pipeline.facade import Pipeline
    from megaphone.migrator.task.updates import UpdateError
    from megaphone.operators import (
        Combiner,
        Context,
        Join,
        ProcessFunction,
        WindowAggregate,
        duration_us,
    )
    from megaphone.operators.join_input import join_input
    from megaphone.plans.handle import MigrationHandle
    from megaphone.plans.hot_keys import HotSplit, ShareThreshold
    from megaphone.plans.plan import MigrationPlan, PlanError, PlanStep
    from megaphone.routing.bins import bin_column, bin_of
    from megaphone.routing.fingerprint import Fingerprint
    from megaphone.routing.table import Move, RoutingTable

#: Where each public name lives. They are imported on first use (PEP 562): a process that
#: imports one module of the package -- a store service, a Spark task -- does not pay for the
#: whole API (PySpark and pandas among it: a store service started 4x slower).
_HOMES = {
    "migrate": "megaphone.migrator.pipeline.api",
    "rescale": "megaphone.migrator.pipeline.api",
    "Chain": "megaphone.migrator.pipeline.chain",
    "Pipeline": "megaphone.migrator.pipeline.facade",
    "join_input": "megaphone.operators.join_input",
    "UpdateError": "megaphone.migrator.task.updates",
    "Combiner": "megaphone.operators",
    "Context": "megaphone.operators",
    "Join": "megaphone.operators",
    "ProcessFunction": "megaphone.operators",
    "WindowAggregate": "megaphone.operators",
    "duration_us": "megaphone.operators",
    "HotSplit": "megaphone.plans.hot_keys",
    "ShareThreshold": "megaphone.plans.hot_keys",
    "MigrationPlan": "megaphone.plans.plan",
    "PlanError": "megaphone.plans.plan",
    "PlanStep": "megaphone.plans.plan",
    "MigrationHandle": "megaphone.plans.plan_queue",
    "bin_column": "megaphone.routing.bins",
    "bin_of": "megaphone.routing.bins",
    "Fingerprint": "megaphone.routing.fingerprint",
    "Move": "megaphone.routing.table",
    "RoutingTable": "megaphone.routing.table",
}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (then kept here)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'megaphone' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the public ones not yet imported included."""
    return sorted({*globals(), *_HOMES})


__all__ = [
    "Chain",
    "Combiner",
    "Context",
    "Fingerprint",
    "HotSplit",
    "Join",
    "MigrationHandle",
    "MigrationPlan",
    "Move",
    "Pipeline",
    "PlanError",
    "PlanStep",
    "ProcessFunction",
    "RoutingTable",
    "ShareThreshold",
    "UpdateError",
    "WindowAggregate",
    "__version__",
    "bin_column",
    "bin_of",
    "duration_us",
    "join_input",
    "migrate",
    "rescale",
]
