"""Durations as the settings and declarations write them: ``"500ms"``, ``"30s"``,
``"2m"``, ``"1h"``, ``"7d"``, ``"2w"`` or a number of seconds."""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
#: Seconds per duration unit.
DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``"500ms"``, ``"30s"``, ``"2m"``, ``"1h"``, ``"7d"``, ``"2w"``, or a
    (finite) number of seconds, as a number or text (``"30"``): the one form of every
    duration of the app."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"invalid duration {value!r}: not a finite number")
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(
            f"invalid duration {value!r}: use a number of seconds or a number with "
            "ms, s, m, h, d or w, like '500ms' or '30s'"
        )
    return float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]
