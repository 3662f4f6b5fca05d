"""Stateful operators beyond one keyed aggregate, engine-agnostic: keyed process functions
with event-time timers (:mod:`~megaphone.operators.process`), event-time windows
(:mod:`~megaphone.operators.window`), stream-stream joins (:mod:`~megaphone.operators.join`;
their input from two streams: :mod:`~megaphone.operators.join_input`),
Spark's ``StatefulProcessor`` (:mod:`~megaphone.operators.stateful_processor`),
and combinable updates whose hot keys can be split (:mod:`~megaphone.operators.combiner`).

Give one as a pipeline's ``update`` (with an ``event_time`` column); its state and timers live
under each key's bin, so they migrate with it.
"""

from megaphone.operators.combiner import Combiner
from megaphone.operators.durations import duration_us
from megaphone.operators.join import Join
from megaphone.operators.process import Context, ProcessFunction
from megaphone.operators.stateful_processor import TransformWithState
from megaphone.operators.window import WindowAggregate

__all__ = ["Combiner", "Context", "Join", "ProcessFunction", "TransformWithState",
           "WindowAggregate", "duration_us"]
