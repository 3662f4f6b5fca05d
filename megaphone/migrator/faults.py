"""Fault injection for crash tests: kill the whole pipeline at a named phase of an epoch.

Inert unless ``MEGAPHONE_CRASH_AT=<phase>:<epoch>`` is set in the environment of the pipeline
process (Spark's Python workers inherit it). Phases: ``export`` (mid-export), ``exported``
(after export, before install), ``installed`` (after install, before the worker's commit),
``applied`` (after the workers' commits, before the epoch's), ``commit`` (mid-commit-write).
"""

from __future__ import annotations

import os
import signal

PHASES = ("export", "exported", "installed", "applied", "commit")


def crash_point(phase: str, epoch: int) -> None:
    """SIGKILL the whole pipeline (driver, JVM, Python workers) if told to crash here.

    Spark's Python daemon puts workers in a process group of their own, so the target is the
    session: the crash tests start the pipeline as a session leader (``start_new_session``).
    """
    if os.environ.get("MEGAPHONE_CRASH_AT") == f"{phase}:{epoch}":
        os.killpg(os.getsid(0), signal.SIGKILL)
