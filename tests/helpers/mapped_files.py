"""Which table files this process keeps mapped (the page-cache warmer's mappings)."""

from __future__ import annotations

import os


def mapped_tables(path: object) -> set[str]:
    """Names of the ``.sst`` files under ``path`` this process maps now (``/proc/self/maps``)."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        return {os.path.basename(line.split()[-1]) for line in f
                if line.rstrip().endswith(".sst") and str(path) in line}
