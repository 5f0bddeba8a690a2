"""JSON that every parser accepts, whatever a run logged.

A diverged run logs ``loss=nan`` or ``inf``; Python's ``json`` writes those as ``NaN`` and
``Infinity``, which are not JSON: browsers, ``jq`` and strict parsers reject the whole document.
Every view that serializes run data goes through :func:`dumps`, which writes a non-finite number
as ``null`` (a chart draws it as a gap).
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every NaN, Infinity and -Infinity (at any depth) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def nonfinite_name(value: Any) -> str | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` for a non-finite float (how a user would write it)."""
    if not isinstance(value, float) or math.isfinite(value):
        return None
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that never writes ``NaN``/``Infinity`` (they become ``null``).

    The encoder refuses a non-finite number itself, so a document is walked and copied by
    :func:`finite` only when it has one: a listing of 100 jobs is encoded once, not walked first.
    """
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:  # (a NaN or an Infinity somewhere in it)
        return json.dumps(finite(value), allow_nan=False, **kwargs)
