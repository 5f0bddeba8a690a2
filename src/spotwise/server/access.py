"""Who is calling a route and what they may do with a job: the checks every API route makes.

Every route but ``/healthz`` asks ``authenticate(request)`` who is calling (None: 401, with the
fix) and the :class:`~spotwise.server.principal.Principal` whether it may read or change the
job (403). A job another caller may not read is answered as a job that does not exist (404),
so that its id is not disclosed; ids are matched exactly (no prefixes, unlike the CLI). A
refusal is raised as :class:`Denied`, which the app answers with its response.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from spotwise.control.store import Job, Store
from spotwise.errors import JobNotFoundError, SpotwiseError
from spotwise.server.owners import job_owner
from spotwise.server.principal import Principal
from spotwise.telemetry.dashboard.app import FiniteJSONResponse

Authenticate = Callable[[Request], "Principal | None"]
API = "/api/v1"
UNAUTHORIZED_HINT = (
    "send a token as 'Authorization: Bearer TOKEN': log in with 'spotwise login URL', "
    "or set SPOTWISE_TOKEN"
)


def error(status: int, message: str, hint: str | None = None) -> Response:
    body: dict[str, Any] = {"error": message}
    if hint:
        body["hint"] = hint
    return FiniteJSONResponse(body, status_code=status)


def spotwise_error(status: int, exc: SpotwiseError) -> Response:
    return error(status, exc.message, exc.hint)


class Denied(Exception):
    """A refusal deep in a route: the app answers it with ``response``."""

    def __init__(self, response: Response) -> None:
        self.response = response


class Access:
    """The caller of a request, and the jobs of ``store`` they may read or change."""

    def __init__(self, store: Store, authenticate: Authenticate) -> None:
        self.store = store
        self.authenticate = authenticate

    def caller(self, request: Request) -> Principal:
        principal = self.authenticate(request)
        if principal is None:
            raise Denied(error(401, "missing, wrong, revoked or expired token", UNAUTHORIZED_HINT))
        return principal

    def readable(self, principal: Principal, job_id: str) -> Job:
        """The job with exactly this id, if the caller may read it; else 404."""
        try:
            job = self.store.job(job_id)
        except JobNotFoundError:
            job = None
        if job is None or job.id != job_id or not principal.can_read(job_owner(job)):
            raise Denied(error(404, f"no job {job_id!r}", f"list your jobs with: GET {API}/jobs"))
        return job

    def changeable(self, principal: Principal, job_id: str) -> Job:
        job = self.readable(principal, job_id)
        if not principal.can_change(job_owner(job)):
            raise Denied(
                error(
                    403,
                    f"{principal.name} ({principal.role}) may not change job {job.id}",
                    "ask its owner or an admin",
                )
            )
        return job

    def submitter(self, request: Request) -> Principal:
        principal = self.caller(request)
        if not principal.can_submit():
            raise Denied(
                error(
                    403, f"{principal.name} ({principal.role}) may not submit jobs", "ask an admin"
                )
            )
        return principal
