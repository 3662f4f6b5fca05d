"""megaphone: move keyed streaming state between workers while a PySpark pipeline runs.

The public API: :func:`bin_of` and :func:`bin_column` (keys to bins, in Python and in the
JVM), :class:`RoutingTable`, :class:`MigrationPlan`, :class:`Pipeline`, :func:`rescale` and
:func:`migrate`; the errors :class:`PlanError` (a plan that cannot be applied) and
:class:`UpdateError` (a general update function that failed on a key).
"""

from megaphone._version import __version__
from megaphone.migrator.api import migrate, rescale
from megaphone.migrator.pipeline import Pipeline
from megaphone.migrator.plan_queue import MigrationHandle
from megaphone.migrator.updates import UpdateError
from megaphone.plans.plan import MigrationPlan, PlanError, PlanStep
from megaphone.routing.bins import bin_column, bin_of
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move, RoutingTable

__all__ = [
    "Fingerprint",
    "MigrationHandle",
    "MigrationPlan",
    "Move",
    "Pipeline",
    "PlanError",
    "PlanStep",
    "RoutingTable",
    "UpdateError",
    "__version__",
    "bin_column",
    "bin_of",
    "migrate",
    "rescale",
]
