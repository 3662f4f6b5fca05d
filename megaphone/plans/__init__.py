"""Migration plans: the plan format, target assignments, strategies and ``rescale``.

``rescale(pipeline_or_state_dir, workers=N, strategy="fluid")`` is the usual way in: it picks
a balanced target that moves little state and orders the moves by a strategy of the Megaphone
paper (``all-at-once``, ``fluid`` or ``batched``) into a :class:`MigrationPlan`, or makes an
adaptive plan whose moves a latency target paces (``deadline``, :mod:`.deadline`); policies
(:mod:`.policy`) are the per-epoch interface behind every strategy.

Only modules free of ``megaphone.migrator`` imports are imported here (``megaphone`` itself
imports this package while it loads the migrator), so there are no import cycles.
"""

from megaphone.plans.plan import MigrationPlan, PlanError, PlanStep
from megaphone.plans.rescale import BinSizes, plan_rescale, rescale
from megaphone.plans.strategies import (
    ALL_AT_ONCE,
    BATCHED,
    DEADLINE,
    FIXED_STRATEGIES,
    FLUID,
    STRATEGIES,
    make_plan,
    matching_rounds,
    schedule,
)
from megaphone.plans.targets import (
    BALANCE_MODES,
    balanced_target,
    explicit_target,
    target_moves,
)

__all__ = [
    "ALL_AT_ONCE",
    "BALANCE_MODES",
    "BATCHED",
    "DEADLINE",
    "FIXED_STRATEGIES",
    "FLUID",
    "STRATEGIES",
    "BinSizes",
    "MigrationPlan",
    "PlanError",
    "PlanStep",
    "balanced_target",
    "explicit_target",
    "make_plan",
    "matching_rounds",
    "plan_rescale",
    "rescale",
    "schedule",
    "target_moves",
]
