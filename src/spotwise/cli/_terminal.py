"""User data on the terminal: shown as written, never read as rich markup.

A job's name, command, zone, message or log line may hold ``[/]``, ``[bold red]``, ``:smile:``
or a terminal escape sequence. Passed to rich as a string, the first raises ``MarkupError`` (the
whole ``spotwise jobs`` table lost for one job), the others restyle or rewrite the terminal.
Every command prints such values through :func:`literal`.
"""

from __future__ import annotations

from rich.console import OverflowMethod
from rich.text import Text

from spotwise.echo import escape_controls


def literal(value: object, style: str = "", *, one_line: bool = False) -> Text:
    """``value`` as plain text (a rich ``Text``: no markup, no emoji codes), with control
    characters shown as ``\\x1b``-style escapes; ``one_line`` cuts it with an ellipsis where a
    table cell would wrap it."""
    shown = escape_controls(str(value), keep="\t\n")
    overflow: OverflowMethod | None = "ellipsis" if one_line else None
    return Text(shown, style=style, no_wrap=one_line or None, overflow=overflow)
