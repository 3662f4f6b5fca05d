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

from megaphone._version import __version__
from megaphone.migrator.pipeline.api import migrate, rescale
from megaphone.migrator.pipeline.chain import Chain
from megaphone.migrator.pipeline.facade import Pipeline
from megaphone.migrator.pipeline.join_input import join_input
from megaphone.migrator.task.updates import UpdateError
from megaphone.operators import (
    Combiner,
    Context,
    Join,
    ProcessFunction,
    WindowAggregate,
    duration_us,
)
from megaphone.plans.hot_keys import HotSplit, ShareThreshold
from megaphone.plans.plan import MigrationPlan, PlanError, PlanStep
from megaphone.plans.plan_queue import MigrationHandle
from megaphone.routing.bins import bin_column, bin_of
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move, RoutingTable

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
