"""Fault injection for crash tests: kill the pipeline, or the store service, at a named phase
(:data:`megaphone.migrator.epoch.run.PHASES`, each passed where its :func:`crash_point` stands).

Inert unless ``MEGAPHONE_CRASH_AT`` is set in the pipeline's environment (Spark's Python
workers inherit it): a comma-separated list of ``<phase>:<epoch>`` (SIGKILL the whole pipeline)
or ``<phase>:<epoch>:store`` (SIGKILL the host's store services once; the pipeline must recover
by itself). A store kill finds the services through the pipeline's ``local_dir``, or the default.
"""

from __future__ import annotations

import os
import signal


def crash_point(phase: str, epoch: int, local_dir: str | None = None) -> None:
    """SIGKILL what ``MEGAPHONE_CRASH_AT`` names, if it names this phase and epoch.

    Spark's Python daemon puts workers in a process group of their own, so a pipeline crash
    kills the session: the crash tests start the pipeline as a session leader
    (``start_new_session``).
    """
    spec = os.environ.get("MEGAPHONE_CRASH_AT")
    if not spec:
        return
    for item in spec.split(","):
        if item == f"{phase}:{epoch}":
            os.killpg(os.getsid(0), signal.SIGKILL)
        if item == f"{phase}:{epoch}:store":
            _kill_store_service(phase, epoch, local_dir)


def _kill_store_service(phase: str, epoch: int, local_dir: str | None) -> None:
    from megaphone.state_backends.remote import default_local_dir, service_pids

    local_dir = local_dir or default_local_dir()
    marker = os.path.join(local_dir, f"crashed-{phase}-{epoch}")
    try:  # once: the retried epoch passes the same point again
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    for pid in service_pids(local_dir):  # every service of the host
        os.kill(pid, signal.SIGKILL)
