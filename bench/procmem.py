"""Resident memory of a PySpark application, read from ``/proc`` (no psutil needed).

Three parts are told apart: the Python driver (this process), the Spark JVM it launched (a
descendant whose command line names ``SparkSubmit``) and the Python workers (descendants of the
JVM running ``pyspark.daemon`` or ``pyspark.worker``). Each is the ``VmRSS`` line of
``/proc/<pid>/status``; forked workers share pages with their daemon, so the workers' sum
counts shared pages once per process (an upper bound). :class:`RssSampler` samples in a
background thread so the peak inside an epoch is caught, not only its end.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
JVM_MARK = "org.apache.spark.deploy.SparkSubmit"
WORKER_MARKS = ("pyspark.daemon", "pyspark.worker")


@dataclass(frozen=True)
class Rss:
    """Resident memory in MiB of the driver, the JVM and all Python workers together."""

    driver: float = 0.0
    jvm: float = 0.0
    workers: float = 0.0

    @property
    def total(self) -> float:
        """Driver + JVM + workers."""
        return self.driver + self.jvm + self.workers

    def max(self, other: Rss) -> Rss:
        """Component-wise maximum (peaks of each part, which may not coincide in time)."""
        return Rss(max(self.driver, other.driver), max(self.jvm, other.jvm),
                   max(self.workers, other.workers))


def rss_mib(pid: int) -> float:
    """``VmRSS`` of ``pid`` in MiB (0 when the process is gone or unreadable)."""
    try:
        with open(PROC / str(pid) / "status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def process_table() -> dict[int, tuple[int, str]]:
    """Every visible process: ``pid -> (parent pid, command line)``."""
    table: dict[int, tuple[int, str]] = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = (PROC / entry.name / "stat").read_text(errors="replace")
            cmd = (PROC / entry.name / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # the name may hold spaces and parens
        table[int(entry.name)] = (int(fields[1]), cmd.decode(errors="replace"))
    return table


def descendants(root: int, table: dict[int, tuple[int, str]]) -> set[int]:
    """Pids below ``root`` in the process tree (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def spark_pids(driver: int) -> tuple[list[int], list[int]]:
    """``(jvm pids, python worker pids)`` of the Spark application launched by ``driver``."""
    table = process_table()
    below = descendants(driver, table)
    jvms = [p for p in below if JVM_MARK in table[p][1]]
    workers = sorted({p for j in jvms for p in descendants(j, table)
                      if any(mark in table[p][1] for mark in WORKER_MARKS)})
    return jvms, workers


class RssSampler(threading.Thread):
    """Samples :class:`Rss` every ``period`` seconds; :meth:`take_peak` returns the peak so far.

    The process tree is rescanned every ``rescan`` seconds (workers come and go); in between
    only the ``status`` files of the known processes are read, so sampling stays cheap.
    """

    def __init__(self, period: float = 0.2, rescan: float = 1.0) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.period = period
        self.rescan = rescan
        self._driver = os.getpid()
        self._lock = threading.Lock()
        self._peak = Rss()
        self._stop = threading.Event()
        self._pids: tuple[list[int], list[int]] = ([], [])
        self._scanned = 0.0

    def sample(self) -> Rss:
        """One reading now."""
        if time.monotonic() - self._scanned > self.rescan:
            self._pids = spark_pids(self._driver)
            self._scanned = time.monotonic()
        jvms, workers = self._pids
        return Rss(rss_mib(self._driver), sum(rss_mib(p) for p in jvms),
                   sum(rss_mib(p) for p in workers))

    def run(self) -> None:
        """Sample until :meth:`stop`."""
        while not self._stop.is_set():
            now = self.sample()
            with self._lock:
                self._peak = self._peak.max(now)
            self._stop.wait(self.period)

    def take_peak(self) -> Rss:
        """The peak since the previous call (including one fresh reading), then reset."""
        now = self.sample()
        with self._lock:
            peak, self._peak = self._peak.max(now), Rss()
        return peak

    def stop(self) -> None:
        """End the sampling thread."""
        self._stop.set()
