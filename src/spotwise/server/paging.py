"""How a listing is asked for: the page's size and the states it keeps, from the query string
(the page itself, newest first after a cursor, is the store's ``job_page``)."""

from __future__ import annotations

from collections.abc import Mapping

from spotwise.control.store import JobState
from spotwise.errors import ConfigError

PAGE = 100  # jobs in a listing's page unless ?limit= says otherwise
MAX_PAGE = 1000


def listing_params(query: Mapping[str, str]) -> tuple[int, list[JobState]]:
    """A listing's ``limit`` (default ``PAGE``, at most ``MAX_PAGE``) and ``state`` filter
    (comma-separated states), each refused by name when wrong."""
    raw = query.get("limit", str(PAGE))
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE:
        raise ConfigError(
            f"limit {raw!r} is not a number of jobs from 1 to {MAX_PAGE}",
            hint=f"e.g. ?limit={PAGE}",
        )
    states = []
    for name in filter(None, (n.strip() for n in query.get("state", "").split(","))):
        try:
            states.append(JobState(name.upper()))
        except ValueError:
            known = ",".join(s.value for s in JobState)
            raise ConfigError(f"state {name!r} is no job state", hint=f"one of {known}") from None
    return limit, states
