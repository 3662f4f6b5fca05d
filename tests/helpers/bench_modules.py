"""Import a benchmark script as a module (``bench/`` is not a package), for the smoke tests."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

#: The benchmarks' directory.
BENCH = Path(__file__).resolve().parents[2] / "bench"


@contextlib.contextmanager
def bench_module(name: str) -> Iterator[ModuleType]:
    """``bench/<name>.py`` imported, with ``bench/`` on the path while the block runs (its
    scripts import their helpers by bare name)."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
