"""User data on the terminal: shown as written, never read as rich markup.

A job's name, command, zone, message or log line may hold ``[/]``, ``[bold red]``, ``:smile:``
or a terminal escape sequence. Passed to rich as a string, the first raises ``MarkupError`` (the
whole ``spotwise jobs`` table lost for one job), the others restyle or rewrite the terminal.
Every command prints such values through :func:`literal`.
"""

from __future__ import annotations

import re

from rich.console import OverflowMethod
from rich.text import Text

# C0 and C1 control characters except tab and newline: escaped, so none reaches the terminal
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def literal(value: object, style: str = "", *, one_line: bool = False) -> Text:
    """``value`` as plain text (a rich ``Text``: no markup, no emoji codes), with control
    characters shown as ``\\x1b``-style escapes; ``one_line`` cuts it with an ellipsis where a
    table cell would wrap it."""
    shown = _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))
    overflow: OverflowMethod | None = "ellipsis" if one_line else None
    return Text(shown, style=style, no_wrap=one_line or None, overflow=overflow)
