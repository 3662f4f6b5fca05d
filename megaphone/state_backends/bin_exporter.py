"""Bins written ahead in a process of their own (docs/transfer.md, "Bins written ahead").

A bin's SST file takes about 1 us of Python per key (244 k keys: 0.25-0.3 s). Under the store
service's GIL one writer thread used one core, while between two epochs both cores of a 2-core
host were free. A :class:`BinExporter` runs :func:`main` in a process of its own, which opens
each store it is asked about as a RocksDB *secondary* instance (read-only, following the store's
own process through its manifest and write-ahead log), catches up with it and writes the bin's
file. The store noted the instant before
(:meth:`~megaphone.state_backends.rocksdb.RocksDBBackend.start_ahead`) and notes every key
written in the bin since, so a view from any later instant gives the same bin after the patch.
The store service runs one exporter per core, in Linux's ``SCHED_IDLE`` class, where it works
beside the epochs and yields a core to them at once; where there is no such class, it is paused
(between two chunks of keys) while an epoch runs or is due.

The exporter reads JSON lines on stdin (a job, or ``"pause"`` / ``"resume"``) and answers each
job with one JSON line on stdout; it exits when its stdin closes (its service is gone).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from megaphone.errors import MegaphoneError

#: How often the service checks, while a bin is written, whether the exporter is to pause.
POLL_S = 0.005
#: Seconds an exporter may take to start.
START_S = 60.0
#: Stores an exporter keeps open; the one used longest ago closes first.
OPEN_STORES = 8
PAUSE, RESUME = "pause", "resume"


#: The exporter's start: ``SCHED_IDLE`` first, so that even its imports (about a second of CPU
#: for four exporters) take no core from an epoch (an epoch that began as four started took
#: 1.95 s against 0.77-0.90 s before it, in a billion-key run).
_BOOT = """import os
if {idle} and hasattr(os, "SCHED_IDLE"):
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        pass
from megaphone.state_backends.bin_exporter import main
main({idle})
"""


class ExporterError(MegaphoneError, RuntimeError):
    """The exporter could not write a bin's file (its message says why), or it exited."""


class _Lines:
    """JSON lines read from a file descriptor without blocking longer than asked."""

    def __init__(self, fd: int) -> None:
        self.fd, self._buf, self.eof = fd, b"", False
        self._lines: collections.deque[Any] = collections.deque()

    def next(self, timeout: float | None) -> Any:
        """The next line's JSON value, waiting up to ``timeout`` seconds (``None``: until one
        comes); ``None`` if none came (see :attr:`eof`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._lines and not self.eof:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.fd], [], [], wait)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.eof = True
                break
            *done, self._buf = (self._buf + chunk).split(b"\n")
            self._lines.extend(json.loads(line) for line in done if line)
        return self._lines.popleft() if self._lines else None


class BinExporter:
    """The service's handle to one exporter process, started at its first job and again after
    it exited; one job at a time."""

    def __init__(self, idle: bool = True) -> None:
        """A handle with no process yet, whose process is to run in Linux's ``SCHED_IDLE``
        class if ``idle`` (and it has one)."""
        self._idle = idle
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: _Lines | None = None
        #: Whether the process runs in ``SCHED_IDLE`` (it says so as it starts): it then
        #: yields a core to any other process at once, and is never paused.
        self.yields = False

    def export(self, store: str, token: str, b: int, out: str,
               pause: Callable[[], bool] = lambda: False) -> int:
        """Write bin ``b`` of the store at ``store`` (opened as ``token``: a store reopened
        has a new one) into a new SST file at ``out``, as the store is now or later; pause the
        exporter while ``pause()`` is true, unless it :attr:`yields`. Returns the keys written
        (0: the bin is empty and no file was made); :class:`ExporterError` if it failed."""
        proc, lines = self._started()
        if self.yields:
            pause = _never
        self._send({"store": store, "token": token, "bin": int(b), "out": out})
        paused = False
        try:
            while (reply := lines.next(POLL_S)) is None:
                if lines.eof:
                    raise ExporterError(f"the bin exporter exited (code {proc.wait()}) while "
                                        f"writing bin {b} of {store}")
                if pause() != paused:
                    paused = not paused
                    self._send(PAUSE if paused else RESUME)
        except BaseException:  # its reply would be taken for the next job's: it goes
            self.close()
            raise
        if not isinstance(reply, dict) or "error" in reply:
            why = reply.get("error") if isinstance(reply, dict) else f"the reply {reply!r}"
            raise ExporterError(f"writing bin {b} of {store}: {why}")
        return int(reply["keys"])

    def close(self) -> None:
        """Stop the process (it exits as its stdin closes); safe to call twice."""
        proc, self._proc, self._lines = self._proc, None, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]

    def _started(self) -> tuple[subprocess.Popen[bytes], _Lines]:
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT.format(idle=self._idle)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._lines = _Lines(self._proc.stdout.fileno())  # type: ignore[union-attr]
            hello = self._lines.next(START_S)
            if not isinstance(hello, dict) or "idle" not in hello:
                self.close()
                raise ExporterError(f"the bin exporter did not start: {hello!r}")
            self.yields = hello["idle"] is True
        return self._proc, self._lines  # type: ignore[return-value]

    def _send(self, message: Any) -> None:
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
        except OSError as exc:  # it exited: the reply loop says so
            if message not in (PAUSE, RESUME):
                self.close()
                raise ExporterError(f"the bin exporter exited: {exc!r}") from None


# ---------------------------------------------------------------------- the exporter process


class _Stores:
    """The stores an exporter has open as secondaries, the most recently used last."""

    def __init__(self, scratch: str) -> None:
        self.scratch = scratch
        self._open: collections.OrderedDict[str, tuple[str, Any, Any]] = \
            collections.OrderedDict()
        self._made = 0

    def get(self, path: str, token: str) -> tuple[Any, Any]:
        """The store at ``path`` opened as ``token``, caught up with its process now."""
        from rocksdict import AccessType, Rdict

        from megaphone.state_backends.rocksdb_tuning import db_options

        held = self._open.pop(path, None)
        if held is not None and held[0] != token:
            held[1].close()
            held = None
        if held is None:
            if not os.path.exists(os.path.join(path, "CURRENT")):
                raise FileNotFoundError(f"no RocksDB store at {path}")
            while len(self._open) >= OPEN_STORES:
                self._open.popitem(last=False)[1][1].close()
            self._made += 1
            own = os.path.join(self.scratch, str(self._made))  # the secondary's own files
            options = db_options()
            held = (token, Rdict(path, options, access_type=AccessType.secondary(own)), options)
        self._open[path] = held
        held[1].try_catch_up_with_primary()
        return held[1], held[2]

    def close(self) -> None:
        """Close every store."""
        while self._open:
            self._open.popitem()[1][1].close()


def _write_bin(db: Any, options: Any, b: int, out: str, between: Callable[[], None]) -> int:
    from rocksdict import ReadOptions

    from megaphone.state_backends.encoding import bin_prefix
    from megaphone.state_backends.sst_files import write_in_chunks

    ro = ReadOptions()
    ro.set_iterate_upper_bound(bin_prefix(b + 1))
    ro.fill_cache(False)  # a bulk scan: nothing here reads it again
    try:
        return write_in_chunks(out, options, db.items(from_key=bin_prefix(b), read_opt=ro),
                               between)
    finally:
        del ro  # (the iterator points into it: it lives until the scan is done)


def _never() -> bool:
    return False


def _idle() -> bool:
    """Whether this process runs in Linux's ``SCHED_IDLE`` class (:data:`_BOOT` put it there)."""
    return hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) == os.SCHED_IDLE


def main(idle: bool = True) -> None:
    """The exporter process: say whether it is in ``SCHED_IDLE`` (where :data:`_BOOT` puts it
    if ``idle``), then answer jobs from stdin until it closes."""
    replies = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever else prints goes to the log
    os.write(replies, json.dumps({"idle": idle and _idle()}).encode() + b"\n")
    commands = _Lines(sys.stdin.fileno())
    scratch = tempfile.mkdtemp(prefix="megaphone-exporter-")
    stores = _Stores(scratch)

    def between() -> None:  # between two chunks: take a pause if asked, exit if orphaned
        paused = False
        while (msg := commands.next(None if paused else 0)) is not None or paused:
            if commands.eof:
                raise SystemExit(0)
            paused = {PAUSE: True, RESUME: False}.get(msg, paused)

    try:
        while (job := commands.next(None)) is not None or not commands.eof:
            if not isinstance(job, dict):
                continue  # a pause or resume that came after its job's end
            try:
                db, options = stores.get(job["store"], job["token"])
                reply: dict[str, Any] = {"keys": _write_bin(db, options, int(job["bin"]),
                                                            job["out"], between)}
            except Exception as exc:  # the service logs it; the bin goes the usual way
                reply = {"error": repr(exc)}
            os.write(replies, json.dumps(reply).encode() + b"\n")
    finally:
        stores.close()
        shutil.rmtree(scratch, ignore_errors=True)



__all__ = ["OPEN_STORES", "POLL_S", "START_S", "BinExporter", "ExporterError", "main"]
