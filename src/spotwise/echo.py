"""User data echoed in messages: bounded and terminal-safe.

An error message that quotes what the user gave must not be as large as what was given (a 5 MB
name) nor act on the terminal (an escape sequence in a CSV cell, a job file's path).
"""

from __future__ import annotations

import unicodedata
from typing import Any

_SHOWN = 60  # characters of a value quoted in an error message


def shown(value: Any, limit: int = _SHOWN) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error must not echo a 5 MB value."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value):,} characters" if isinstance(value, (str, bytes)) else "long"
    return f"{text[: limit - 10]}... ({size})"


def escape_controls(text: str, keep: str = "") -> str:
    """``text`` with its control characters (C0, DEL, C1) but those in ``keep`` written as
    ``\\x1b``-style escapes, so none of them acts on the terminal."""
    return "".join(
        f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in keep else c for c in text
    )


def printable(text: str, limit: int = 300) -> str:
    """``text`` (a path, a name) for a terminal: control characters escaped (``\\x1b``),
    cut to ``limit`` characters."""
    escaped = escape_controls(text[: limit + 1])
    return escaped if len(text) <= limit else f"{escaped[:limit]}... ({len(text):,} characters)"
