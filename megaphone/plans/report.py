"""Plain-text rendering shared by the ``inspect``, ``plan`` and ``migrate`` subcommands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def human_bytes(n: float) -> str:
    """``n`` bytes as a short human-readable string (``"21.4 KiB"``), binary units."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


def human_rate(bytes_per_s: float) -> str:
    """A transfer rate such as ``"47.7 MiB/s"``."""
    return f"{human_bytes(bytes_per_s)}/s"


def human_seconds(s: float) -> str:
    """A duration in seconds, minutes or hours, whichever reads best."""
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Right-aligned text table lines (first column left-aligned)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for row in cells:
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:],
                                                                         strict=True)]
        out.append("  ".join(parts).rstrip())
    return out


def skew(values: Sequence[float]) -> float:
    """Max over mean of ``values`` (1.0 is perfectly even; 1.0 for all-zero input)."""
    if not values:
        return 1.0
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def arrow(before: Any, after: Any) -> str:
    """``"a -> b"``, or just ``"a"`` when nothing changed."""
    return str(before) if before == after else f"{before} -> {after}"


__all__ = ["arrow", "human_bytes", "human_rate", "human_seconds", "skew", "table"]
