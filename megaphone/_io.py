"""Small file helpers: atomic JSON writes and strict JSON reads with clear errors."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, before_rename: Callable[[], None] | None = None,
    *, sync: bool = True,
) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new file, never a torn one.

    The bytes go to a temporary file in the same directory, are fsynced, then renamed over
    ``path``; the directory is fsynced so the rename itself survives a crash. ``sync=False``
    skips both fsyncs, for a file with a durable copy elsewhere (it survives a process crash,
    not a power loss).
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if not sync:
        return
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(
    path: str | os.PathLike[str], obj: Any, before_rename: Callable[[], None] | None = None,
    *, sync: bool = True,
) -> None:
    """Write ``obj`` as JSON atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, json.dumps(obj, separators=(",", ":")).encode(), before_rename,
                       sync=sync)


def create_once(path: str | os.PathLike[str], make: Callable[[], str], mode: int = 0o600
                ) -> str:
    """The text of the file at ``path``, written with ``make()`` (readable by ``mode``) if it
    does not exist yet. Concurrent first writers agree: the first link wins, the others read
    it; no reader ever sees a partly written file."""
    target = Path(path)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "w") as fh:
                fh.write(make())
            os.link(tmp, target)  # never replaces: a concurrent writer's file stands
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return target.read_text().strip()


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """Read a JSON file; a missing, unreadable or corrupt file is a ``ValueError`` naming it."""
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        raise ValueError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} at {path} is corrupt or unreadable: {exc}") from None


class ChunkedLog:
    """An append-only JSON-lines log kept in two chunks: a full ``current`` file (``chunk``
    lines) first replaces ``old``, so disk holds one or two chunks however long it runs."""

    def __init__(self, current: Path, old: Path, chunk: int) -> None:
        self.current, self.old, self.chunk = current, old, chunk
        self._lines: int | None = None  # lines in ``current`` (counted once)

    def append(self, line: str) -> None:
        """Append one line (without its newline)."""
        if self._lines is None:
            self._lines = 0
            if self.current.exists():
                with open(self.current, "rb") as fh:
                    self._lines = sum(1 for _ in fh)
        if self._lines >= self.chunk:
            os.replace(self.current, self.old)
            self._lines = 0
        with open(self.current, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        self._lines += 1

    def read(self, parse: Callable[[str], _T]) -> list[_T]:
        """Every line as ``parse`` reads it, oldest first; a line it refuses with a
        ``ValueError`` (torn by a crash, or malformed) is skipped."""
        out: list[_T] = []
        for path in (self.old, self.current):
            with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as fh:
                for line in fh:
                    with contextlib.suppress(ValueError):
                        out.append(parse(line))
        return out
