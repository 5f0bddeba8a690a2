"""The one way spotwise reads a duration (job files, ``every=``, token lifetimes, CLI flags).

``90`` (seconds), ``"90s"``, ``"500ms"``, ``"15m"``/``"15min"``, ``"2h"``/``"2hr"``,
``"1.5d"``; at most ten years, since beyond it a number is a typo, not a duration.
Standard library only: the runtime, the controller and the CLI all read durations.
"""

from __future__ import annotations

import math
import re
from typing import Any

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|hr|d)?\s*$", re.IGNORECASE)
UNIT_S = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
MAX_DURATION_S = 10 * 365 * 86400.0


def has_unit(text: str) -> bool:
    """Whether ``text`` is a duration written with its unit (``"10m"``, not ``"10"``)."""
    match = DURATION.match(text)
    return match is not None and match.group(2) is not None


def parse_duration_s(value: Any) -> float:
    """``90``, ``"90s"``, ``"15m"``, ``"2h"``, ``"1.5d"`` -> seconds (ValueError otherwise)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 15m or 2h")
    if isinstance(value, int) and abs(value) > MAX_DURATION_S:
        value = math.inf  # (float() of a 400-digit int raises OverflowError)
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; use e.g. 90s, 15m, 2h or 1d")
        seconds = float(match.group(1)) * UNIT_S[(match.group(2) or "s").lower()]
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise ValueError("a duration must be a finite number of at most 10 years (3650d)")
    if seconds < 0:
        raise ValueError("a duration must be >= 0")
    return seconds
