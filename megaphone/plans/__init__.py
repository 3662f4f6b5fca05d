"""Migration plans: the plan format, target assignments, strategies and the rescale planner.

``megaphone.rescale(pipeline_or_state_dir, workers=N, strategy="fluid")`` is the usual way
in: it reads the planning inputs from the runtime, then :func:`plan_rescale` picks a balanced
target that moves little state and orders the moves by a strategy of the Megaphone paper
(``all-at-once``, ``fluid`` or ``batched``) into a :class:`MigrationPlan`, or makes an adaptive
plan whose moves a latency target paces (``deadline``, :mod:`.deadline`); policies
(:mod:`.policy`) are the per-epoch interface behind every strategy.

No module of this package imports the runtime (the migrator package): planning works on plain
data (:class:`PlanningInputs`), which the runtime's ``planning`` module supplies.
"""

from megaphone.plans.deadline import DeadlinePolicy  # registers the "deadline" policy
from megaphone.plans.plan import MigrationPlan, PlanError, PlanStep
from megaphone.plans.planner import BinSizes, PlanningInputs, plan_rescale
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
    "DeadlinePolicy",
    "MigrationPlan",
    "PlanError",
    "PlanStep",
    "PlanningInputs",
    "balanced_target",
    "explicit_target",
    "make_plan",
    "matching_rounds",
    "plan_rescale",
    "schedule",
    "target_moves",
]
