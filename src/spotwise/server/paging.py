"""How a listing is asked for: the page's size, the states it keeps and the start of the ids it
keeps, from the query string (the page itself, newest first after a cursor, is the store's
``job_page``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spotwise.control.ids import MAX_ID_CHARS, could_name_a_job
from spotwise.control.store import JobState
from spotwise.errors import ConfigError

PAGE = 100  # jobs in a listing's page unless ?limit= says otherwise
MAX_PAGE = 1000


@dataclass(frozen=True)
class Listing:
    limit: int
    states: list[JobState]
    id_prefix: str | None  # only ids that start with this text (a CLI resolving what was typed)


def listing_params(query: Mapping[str, str]) -> Listing:
    """A listing's ``limit`` (default ``PAGE``, at most ``MAX_PAGE``), ``state`` filter
    (comma-separated states) and ``id_prefix``, each refused by name when wrong."""
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
    id_prefix = query.get("id_prefix")
    if id_prefix is not None and not could_name_a_job(id_prefix):
        raise ConfigError(
            f"id_prefix must be 1 to {MAX_ID_CHARS} characters without NUL",
            hint="the start of a job id, e.g. ?id_prefix=train-",
        )
    return Listing(limit, states, id_prefix)
