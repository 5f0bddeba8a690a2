"""Who is calling the server, and what that caller may do with a job.

The one contract between authentication (who presented which token) and the API (which job a
request may read or change): routes ask these questions and never look at roles themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotwise.control.store.accounts import Role


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a user's name and role (an admin token is an admin user)."""

    name: str
    role: Role

    def can_read(self, owner: str | None) -> bool:
        """Admins and viewers read every job; a user reads their own."""
        return self.role in ("admin", "viewer") or owner == self.name

    def reads_only(self) -> str | None:
        """The one owner whose jobs this caller reads (a user: their own), None when every job
        (the listing's filter in the query, the same rule as ``can_read``)."""
        return None if self.role in ("admin", "viewer") else self.name

    def can_change(self, owner: str | None) -> bool:
        """Admins change every job; a user changes their own; a viewer changes none."""
        return self.role == "admin" or (self.role == "user" and owner == self.name)

    def can_submit(self) -> bool:
        return self.role in ("admin", "user")
