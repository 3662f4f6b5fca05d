"""Durations as operators take them: microseconds, from a number, a ``timedelta`` or a text
such as ``"10 seconds"`` (the units Spark's interval strings use)."""

from __future__ import annotations

import datetime as dt
import re

_UNITS = {
    "us": 1, "microsecond": 1, "ms": 1_000, "millisecond": 1_000,
    "s": 1_000_000, "sec": 1_000_000, "second": 1_000_000,
    "m": 60_000_000, "min": 60_000_000, "minute": 60_000_000,
    "h": 3_600_000_000, "hour": 3_600_000_000, "d": 86_400_000_000, "day": 86_400_000_000,
}
_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


def duration_us(value: int | float | str | dt.timedelta) -> int:
    """``value`` in whole microseconds: a number is microseconds already; a text is
    ``"<number> <unit>"`` (us, ms, second, minute, hour, day; plurals and short forms)."""
    if isinstance(value, dt.timedelta):
        return value // dt.timedelta(microseconds=1)
    if isinstance(value, bool):
        raise TypeError(f"a duration is a number, a timedelta or a text, not {value!r}")
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        match = _TEXT.match(value.lower())
        word = match[2] if match else ""
        unit = _UNITS.get(word) or _UNITS.get(word[:-1] if word.endswith("s") else "")
        if match and unit:
            return round(float(match[1]) * unit)
        raise ValueError(f"cannot read {value!r} as a duration (e.g. '10 seconds', '500 ms')")
    raise TypeError(f"a duration is a number, a timedelta or a text, not {type(value).__name__}")
