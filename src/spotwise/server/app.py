"""The server's HTTP face: ``/healthz``, the versioned JSON API ``/api/v1`` and the dashboard.

Every route but ``/healthz`` asks ``authenticate(request)`` who is calling (None: 401, with the
fix) and the :class:`~spotwise.server.principal.Principal` whether it may read or change the
job (403). A job another caller may not read is answered as a job that does not exist (404),
so that its id is not disclosed; ids are matched exactly (no prefixes, unlike the CLI).

Requests never call a provider, except submit's own checks (the same as ``spotwise launch``:
provider reachable, budget covers the estimate), which run on a worker thread. Everything
else a job needs (launch, watch, relaunch, cancel) is the :class:`~spotwise.server.driver.
Driver`'s, which the routes only wake.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Receive, Scope, Send

from spotwise.control.controller import job_summaries, job_summary, submit
from spotwise.control.jobfile import MAX_FILE_BYTES, parse_job_bytes
from spotwise.control.spec import parse_spec
from spotwise.control.store import Job, Store
from spotwise.control.workdir import ARCHIVES, split_workdir
from spotwise.errors import ConfigError, JobNotFoundError, SpotwiseError
from spotwise.server.driver import Driver
from spotwise.server.openapi import openapi_document
from spotwise.server.owners import job_owner
from spotwise.server.paging import listing_params
from spotwise.server.principal import Principal
from spotwise.server.uploads import TooLarge, receive, stored
from spotwise.telemetry.dashboard.app import FiniteJSONResponse
from spotwise.telemetry.dashboard.app import create_app as create_dashboard
from spotwise.telemetry.dashboard.data import job_detail
from spotwise.telemetry.jobview import job_view

Authenticate = Callable[[Request], "Principal | None"]
API = "/api/v1"
LOG_POLL_S = 0.3
UNAUTHORIZED_HINT = (
    "send a token as 'Authorization: Bearer TOKEN': log in with 'spotwise login URL', "
    "or set SPOTWISE_TOKEN"
)


def _error(status: int, message: str, hint: str | None = None) -> Response:
    body: dict[str, Any] = {"error": message}
    if hint:
        body["hint"] = hint
    return FiniteJSONResponse(body, status_code=status)


def _spotwise_error(status: int, exc: SpotwiseError) -> Response:
    return _error(status, exc.message, exc.hint)


class _Denied(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def create_app(
    store: Store,
    driver: Driver,
    *,
    authenticate: Authenticate,
    allowed_hosts: list[str] | None = None,
) -> Starlette:
    """The server app over ``store``, whose jobs ``driver`` drives."""

    def caller(request: Request) -> Principal:
        principal = authenticate(request)
        if principal is None:
            raise _Denied(
                _error(401, "missing, wrong, revoked or expired token", UNAUTHORIZED_HINT)
            )
        return principal

    def readable(principal: Principal, job_id: str) -> Job:
        """The job with exactly this id, if the caller may read it; else 404."""
        try:
            job = store.job(job_id)
        except JobNotFoundError:
            job = None
        if job is None or job.id != job_id or not principal.can_read(job_owner(job)):
            raise _Denied(_error(404, f"no job {job_id!r}", f"list your jobs with: GET {API}/jobs"))
        return job

    def changeable(principal: Principal, job_id: str) -> Job:
        job = readable(principal, job_id)
        if not principal.can_change(job_owner(job)):
            raise _Denied(
                _error(
                    403,
                    f"{principal.name} ({principal.role}) may not change job {job.id}",
                    "ask its owner or an admin",
                )
            )
        return job

    async def healthz(request: Request) -> Response:
        return FiniteJSONResponse({"ok": True, "driving": driver.driving()})

    async def openapi(request: Request) -> Response:
        caller(request)
        return FiniteJSONResponse(openapi_document())

    async def list_jobs(request: Request) -> Response:
        principal = caller(request)
        try:
            limit, states = listing_params(request.query_params)
        except SpotwiseError as exc:
            return _spotwise_error(400, exc)
        cursor = request.query_params.get("cursor") or None

        def page() -> tuple[list[dict[str, Any]], str | None]:
            jobs, after = store.job_page(
                limit, cursor=cursor, owner=principal.reads_only(), states=states
            )
            return job_summaries(store, jobs), after

        # (on a worker thread, so that other requests are answered meanwhile)
        try:
            summaries, after = await run_in_threadpool(page)
        except ConfigError as exc:  # a cursor no listing gave
            return _spotwise_error(400, exc)
        headers = {}
        if after is not None:  # RFC 8288, as GitHub's API pages
            query = urllib.parse.urlencode({**request.query_params, "cursor": after})
            headers["Link"] = f'<{request.url.path}?{query}>; rel="next"'
        return FiniteJSONResponse(summaries, headers=headers)

    async def submit_job(request: Request) -> Response:
        principal = submitter(request)
        data = await _body(request, MAX_FILE_BYTES + 1)
        base = request.query_params.get("base_dir")
        if base is not None and not Path(base).is_absolute():
            return _error(
                400, f"base_dir {base!r} is not an absolute path", "send the job file's directory"
            )
        try:
            doc = parse_job_bytes(data, "job file")
        except SpotwiseError as exc:
            return _spotwise_error(400, exc)
        uploaded = uploaded_workdir(request, doc)
        try:
            spec = parse_spec(
                doc,
                base_dir=Path(base) if base else None,
                source="job file",
                packed=uploaded is not None,
            )
            job = await run_in_threadpool(submit, store, spec, None, principal.name, uploaded)
        except SpotwiseError as exc:
            return _spotwise_error(422, exc)
        accepted = job_summary(store, job)  # as accepted: before the driver launches it
        driver.wake(job.id)
        return FiniteJSONResponse(accepted, status_code=201)

    async def job_status(request: Request) -> Response:
        job = readable(caller(request), request.path_params["job_id"])
        return FiniteJSONResponse(job_summary(store, job))

    async def job_metrics(request: Request) -> Response:
        job = readable(caller(request), request.path_params["job_id"])
        detail = await run_in_threadpool(lambda: job_detail(job_view(store, job)))
        return FiniteJSONResponse(
            {
                "id": job.id,
                "metrics": detail["metrics"],
                "ledger": detail["ledger"],
                "checkpoints": detail["checkpoints"],
            }
        )

    async def job_logs(request: Request) -> Response:
        job = readable(caller(request), request.path_params["job_id"])
        follow = request.query_params.get("follow") in ("1", "true")
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            return _error(400, "offset must be a whole number of bytes", "e.g. ?offset=0")

        async def chunks() -> AsyncIterator[bytes]:
            pos = offset
            while True:
                chunk = _read_from(job.log_path, pos)
                pos += len(chunk)
                if chunk:
                    yield chunk
                if not follow or (not chunk and store.job(job.id).state.terminal):
                    return
                if not chunk:
                    if await request.is_disconnected():
                        return
                    await asyncio.sleep(LOG_POLL_S)

        return StreamingResponse(chunks(), media_type="text/plain; charset=utf-8")

    async def cancel_job(request: Request) -> Response:
        job = changeable(caller(request), request.path_params["job_id"])
        if not job.state.terminal:
            store.request_cancel(job.id)
            driver.wake(job.id)
        return FiniteJSONResponse(
            {"id": job.id, "state": store.job(job.id).state.value, "cancel_requested": True},
            status_code=202,
        )

    # --- a remote client's packed workdir (spotwise.server.uploads) ---------------------
    uploads = store.home / ARCHIVES

    def submitter(request: Request) -> Principal:
        principal = caller(request)
        if not principal.can_submit():
            raise _Denied(
                _error(
                    403, f"{principal.name} ({principal.role}) may not submit jobs", "ask an admin"
                )
            )
        return principal

    async def workdir_status(request: Request) -> Response:
        """Whether the server has this archive already (a client then skips its upload)."""
        submitter(request)
        sha256 = request.path_params["sha256"]
        try:
            found = stored(uploads, sha256)
        except SpotwiseError as exc:
            return _spotwise_error(400, exc)
        if found is None:
            return _error(404, f"no workdir archive {sha256}", f"upload it: PUT {API}/workdirs/SHA")
        return FiniteJSONResponse({"sha256": sha256, "bytes": found.stat().st_size})

    async def upload_workdir(request: Request) -> Response:
        submitter(request)
        sha256 = request.path_params["sha256"]
        try:
            size, new = await receive(request.stream(), sha256, uploads)
        except TooLarge as exc:
            return _spotwise_error(413, exc)
        except SpotwiseError as exc:
            return _spotwise_error(422, exc)
        return FiniteJSONResponse(
            {"sha256": sha256, "bytes": size}, status_code=201 if new else 200
        )

    def uploaded_workdir(request: Request, doc: Any) -> str | None:
        """The digest a submit names in ``?workdir_sha256=``, once its archive is here."""
        sha256 = request.query_params.get("workdir_sha256")
        if sha256 is None:
            return None
        written = doc.get("workdir") if isinstance(doc, dict) else None
        if not isinstance(written, str) or split_workdir(written)[0] != "pack":
            raise _Denied(
                _error(
                    422,
                    "workdir_sha256 is given but the job file's workdir is not pack:PATH",
                    "send workdir_sha256 only with a workdir: pack:PATH",
                )
            )
        try:
            found = stored(uploads, sha256)
        except SpotwiseError as exc:
            raise _Denied(_spotwise_error(400, exc)) from None
        if found is None:
            raise _Denied(
                _error(
                    422,
                    f"workdir: {written}: no uploaded archive {sha256}",
                    f"upload it first: PUT {API}/workdirs/{sha256}",
                )
            )
        return sha256

    async def resume_job(request: Request) -> Response:
        job = changeable(caller(request), request.path_params["job_id"])
        driver.wake(job.id)
        return FiniteJSONResponse(job_summary(store, job), status_code=202)

    dashboard = create_dashboard(store, allowed_hosts=allowed_hosts, on_cancel=driver.wake)

    async def guarded_dashboard(scope: Scope, receive: Receive, send: Send) -> None:
        """The dashboard shows every job, so it is for callers who read every job (admins,
        viewers); its one action, cancel, for those who change every job (admins)."""
        if scope["type"] == "http":
            request = Request(scope)
            principal = authenticate(request)
            if principal is None:
                return await _error(401, "missing or wrong token", UNAUTHORIZED_HINT)(
                    scope, receive, send
                )
            # a job nobody owns: only a caller who reads (changes) every job may
            everything = (
                principal.can_read(None) if request.method == "GET" else principal.can_change(None)
            )
            if not everything:
                return await _error(
                    403,
                    f"the dashboard shows every job; {principal.name} ({principal.role}) "
                    "may not see them all",
                    f"use the API: GET {API}/jobs",
                )(scope, receive, send)
        await dashboard(scope, receive, send)

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route(f"{API}/openapi.json", openapi),
        Route(f"{API}/jobs", list_jobs, methods=["GET"]),
        Route(f"{API}/jobs", submit_job, methods=["POST"]),
        Route(f"{API}/jobs/{{job_id}}", job_status),
        Route(f"{API}/jobs/{{job_id}}/logs", job_logs),
        Route(f"{API}/jobs/{{job_id}}/metrics", job_metrics),
        Route(f"{API}/jobs/{{job_id}}/cancel", cancel_job, methods=["POST"]),
        Route(f"{API}/jobs/{{job_id}}/resume", resume_job, methods=["POST"]),
        Route(f"{API}/workdirs/{{sha256}}", workdir_status, methods=["GET"]),
        Route(f"{API}/workdirs/{{sha256}}", upload_workdir, methods=["PUT"]),
        Mount("/", app=guarded_dashboard),
    ]

    async def denied(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Denied)
        return exc.response

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        """The driver runs while the app serves; stopping lets the jobs go (before uvicorn
        re-raises the SIGTERM or SIGINT that stopped it)."""
        driver.start()
        try:
            yield
        finally:
            await run_in_threadpool(driver.stop)

    return Starlette(routes=routes, exception_handlers={_Denied: denied}, lifespan=lifespan)


async def _body(request: Request, limit: int) -> bytes:
    """The request body, cut at ``limit`` bytes (the job file's own limit then refuses it)."""
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) >= limit:
            break
    return bytes(data[:limit])


def _read_from(path: Path, pos: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            return f.read(1 << 20)
    except FileNotFoundError:
        return b""
