"""SnailTrail (Hoffmann et al., NSDI 2018) for megaphone, engine-agnostic: typed traces of what
the driver and the workers did in each epoch (:mod:`~megaphone.snailtrail.activity`), the
program activity graph of a time window (:mod:`~megaphone.snailtrail.graph`) and the critical
participation of its activities, by path counting (:mod:`~megaphone.snailtrail.critical`).

Nothing here knows Spark or the migrator: the runtime records traces, this ranks them.
"""

from megaphone.snailtrail.activity import (
    ACTIVITY_KINDS,
    DEPENDENCY_KINDS,
    TRACE_FORMAT,
    Activity,
    Dependency,
    EpochTrace,
    Timeline,
)
from megaphone.snailtrail.critical import (
    CriticalReport,
    Participation,
    PathCounts,
    analyze,
    count_paths,
    critical_participation,
)
from megaphone.snailtrail.graph import (
    COMM,
    GAP,
    LINK,
    RECORDED,
    Pag,
    PagEdge,
    build_pag,
    clip,
    trace_span,
)

__all__ = [
    "ACTIVITY_KINDS",
    "COMM",
    "DEPENDENCY_KINDS",
    "GAP",
    "LINK",
    "RECORDED",
    "TRACE_FORMAT",
    "Activity",
    "CriticalReport",
    "Dependency",
    "EpochTrace",
    "Pag",
    "PagEdge",
    "Participation",
    "PathCounts",
    "Timeline",
    "analyze",
    "build_pag",
    "clip",
    "count_paths",
    "critical_participation",
    "trace_span",
]
