"""The job routes of ``/api/v1``: list, submit, status, logs, metrics, cancel and resume.

Requests never call a provider, except submit's own checks (the same as ``spotwise launch``:
provider reachable, budget covers the estimate), which run on a worker thread. Everything
else a job needs (launch, watch, relaunch, cancel) is the :class:`~spotwise.server.driver.
Driver`'s, which the routes only wake.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from spotwise.control.jobfile import MAX_FILE_BYTES, parse_job_bytes
from spotwise.control.spec import parse_spec
from spotwise.control.store import Store
from spotwise.control.submission import submit
from spotwise.control.summary import job_summaries, job_summary
from spotwise.errors import ConfigError, SpotwiseError
from spotwise.server.access import Access, Authenticate, error, spotwise_error
from spotwise.server.driver import Driver
from spotwise.server.openapi import openapi_document
from spotwise.server.paging import listing_params
from spotwise.server.workdir_routes import WorkdirRoutes
from spotwise.telemetry.dashboard.app import FiniteJSONResponse
from spotwise.telemetry.dashboard.data import job_detail
from spotwise.telemetry.jobview import job_view

LOG_POLL_S = 0.3


class JobRoutes(Access):
    """The routes over ``store``'s jobs, which ``driver`` drives; a submit's packed workdir is
    one ``workdirs`` has received."""

    def __init__(
        self, store: Store, driver: Driver, authenticate: Authenticate, workdirs: WorkdirRoutes
    ) -> None:
        super().__init__(store, authenticate)
        self.driver = driver
        self.workdirs = workdirs

    async def healthz(self, request: Request) -> Response:
        return FiniteJSONResponse({"ok": True, "driving": self.driver.driving()})

    async def openapi(self, request: Request) -> Response:
        self.caller(request)
        return FiniteJSONResponse(openapi_document())

    async def list_jobs(self, request: Request) -> Response:
        principal = self.caller(request)
        try:
            asked = listing_params(request.query_params)
        except SpotwiseError as exc:
            return spotwise_error(400, exc)
        cursor = request.query_params.get("cursor") or None

        def page() -> tuple[list[dict[str, Any]], str | None]:
            jobs, after = self.store.job_page(
                asked.limit,
                cursor=cursor,
                owner=principal.reads_only(),
                states=asked.states,
                id_prefix=asked.id_prefix,
            )
            return job_summaries(self.store, jobs), after

        # (on a worker thread, so that other requests are answered meanwhile)
        try:
            summaries, after = await run_in_threadpool(page)
        except ConfigError as exc:  # a cursor no listing gave
            return spotwise_error(400, exc)
        headers = {}
        if after is not None:  # RFC 8288, as GitHub's API pages
            query = urllib.parse.urlencode({**request.query_params, "cursor": after})
            headers["Link"] = f'<{request.url.path}?{query}>; rel="next"'
        return FiniteJSONResponse(summaries, headers=headers)

    async def submit_job(self, request: Request) -> Response:
        principal = self.submitter(request)
        data = await _body(request, MAX_FILE_BYTES + 1)
        base = request.query_params.get("base_dir")
        if base is not None and not Path(base).is_absolute():
            return error(
                400, f"base_dir {base!r} is not an absolute path", "send the job file's directory"
            )
        try:
            doc = parse_job_bytes(data, "job file")
        except SpotwiseError as exc:
            return spotwise_error(400, exc)
        uploaded = self.workdirs.uploaded(request, doc)
        try:
            spec = parse_spec(
                doc,
                base_dir=Path(base) if base else None,
                source="job file",
                packed=uploaded is not None,
            )
            job = await run_in_threadpool(submit, self.store, spec, None, principal.name, uploaded)
        except SpotwiseError as exc:
            return spotwise_error(422, exc)
        accepted = job_summary(self.store, job)  # as accepted: before the driver launches it
        self.driver.wake(job.id)
        return FiniteJSONResponse(accepted, status_code=201)

    async def job_status(self, request: Request) -> Response:
        job = self.readable(self.caller(request), request.path_params["job_id"])
        return FiniteJSONResponse(job_summary(self.store, job))

    async def job_metrics(self, request: Request) -> Response:
        job = self.readable(self.caller(request), request.path_params["job_id"])
        detail = await run_in_threadpool(lambda: job_detail(job_view(self.store, job)))
        return FiniteJSONResponse(
            {
                "id": job.id,
                "metrics": detail["metrics"],
                "ledger": detail["ledger"],
                "checkpoints": detail["checkpoints"],
            }
        )

    async def job_logs(self, request: Request) -> Response:
        job = self.readable(self.caller(request), request.path_params["job_id"])
        follow = request.query_params.get("follow") in ("1", "true")
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            return error(400, "offset must be a whole number of bytes", "e.g. ?offset=0")

        async def chunks() -> AsyncIterator[bytes]:
            pos = offset
            while True:
                chunk = _read_from(job.log_path, pos)
                pos += len(chunk)
                if chunk:
                    yield chunk
                if not follow or (not chunk and self.store.job(job.id).state.terminal):
                    return
                if not chunk:
                    if await request.is_disconnected():
                        return
                    await asyncio.sleep(LOG_POLL_S)

        return StreamingResponse(chunks(), media_type="text/plain; charset=utf-8")

    async def cancel_job(self, request: Request) -> Response:
        job = self.changeable(self.caller(request), request.path_params["job_id"])
        if not job.state.terminal:
            self.store.request_cancel(job.id)
            self.driver.wake(job.id)
        return FiniteJSONResponse(
            {"id": job.id, "state": self.store.job(job.id).state.value, "cancel_requested": True},
            status_code=202,
        )

    async def resume_job(self, request: Request) -> Response:
        job = self.changeable(self.caller(request), request.path_params["job_id"])
        self.driver.wake(job.id)
        return FiniteJSONResponse(job_summary(self.store, job), status_code=202)


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
