"""Ids as people type them: the whole id, or the start of exactly one id.

What was typed is compared as text, never read as a pattern (no glob, ``LIKE`` or regex), so
``*`` or ``%`` in it match only themselves. The embedded store, the server's client and the
worker groups of sweeps and batch jobs all resolve through :func:`one_id`.
"""

from __future__ import annotations

from collections.abc import Iterable

from spotwise.errors import JobNotFoundError

# Ids are ``<name[:24]>-<6 hex>``; anything much longer is not an id (and is not echoed whole).
MAX_ID_CHARS = 128
# How many candidates an ambiguous prefix's error lists.
CANDIDATES_SHOWN = 10


def could_name_a_job(typed: str) -> bool:
    """Whether ``typed`` could be an id or the start of one: not empty, not absurdly long, no
    NUL (which no database column holds)."""
    return bool(typed) and len(typed) <= MAX_ID_CHARS and "\x00" not in typed


def quoted(typed: str) -> str:
    """The id as an error message shows it: bounded, whatever was typed."""
    return repr(typed if len(typed) <= 40 else f"{typed[:40]}...")


def one_id(typed: str, ids: Iterable[str], what: str = "job") -> str | None:
    """``typed`` when it is one of ``ids``, else the one id that starts with it; None when no id
    does (nor does a text :func:`could_name_a_job` refuses). Several are refused, naming the
    first of them (in the order given), so the user can type more of the one they meant."""
    if not could_name_a_job(typed):
        return None
    matches = []
    for candidate in ids:
        if candidate == typed:
            return candidate
        if candidate.startswith(typed):
            matches.append(candidate)
    if len(matches) > 1:
        listed = ", ".join(matches[:CANDIDATES_SHOWN])
        more = ", ..." if len(matches) > CANDIDATES_SHOWN else ""
        raise JobNotFoundError(
            f"{what} id {quoted(typed)} is ambiguous: it starts {listed}{more}",
            hint="give more of the id",
        )
    return matches[0] if matches else None
