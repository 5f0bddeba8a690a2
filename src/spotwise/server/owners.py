"""Whose a job is: the one place the API asks, so that the store's owner column plugs in here."""

from __future__ import annotations

from spotwise.control.store import Job


def job_owner(job: Job) -> str | None:
    """The name of the user who submitted ``job``; None for a job nobody owns (launched
    without a server), which only admins and viewers read and only admins change."""
    return job.owner
