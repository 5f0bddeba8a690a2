"""``spotwise dashboard``: a local web app over the job store (Starlette on uvicorn).

Read only, except one action: cancelling a job. A dashboard on 127.0.0.1 is still reachable by
any page the user's browser opens, so:

- the ``Host`` header must name this server (loopback names, or the ``--host`` given): a DNS
  rebinding page, whose requests carry its own host name, gets 400;
- the cancel request must carry the per-session token: the page sets a random session cookie
  (``SameSite=Strict``, ``HttpOnly``) and embeds an HMAC of it, which another site can neither
  read nor send (a custom header also forces a CORS preflight, which is never granted); a cookie
  or token of the wrong shape (any byte a header may carry) is refused like a wrong one;
- a Content-Security-Policy limits the pages to this origin, and no page refers to another site.

Every JSON answer, page and event goes through :mod:`spotwise.telemetry.jsonsafe`: a run that
logged ``nan`` still gets valid JSON (``null``, drawn as a gap).

Store access happens on the event loop's thread only (every endpoint is ``async``), so one
SQLite connection serves the app. Live pages follow ``/api/stream`` (server-sent events): the
server looks for a change twice a second and sends the page's whole document when there is one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import re
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from spotwise.control.spec import stored_spec
from spotwise.control.store import Store
from spotwise.errors import JobNotFoundError
from spotwise.telemetry.dashboard.data import job_detail, job_row
from spotwise.telemetry.dashboard.pages import CSP_LIVE, page
from spotwise.telemetry.jobview import job_view, run_dir
from spotwise.telemetry.jsonsafe import dumps
from spotwise.telemetry.metrics import render

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
SESSION_COOKIE = "spotwise_session"
TOKEN_HEADER = "X-Spotwise-Token"
POLL_S = 0.5
SESSION_SHAPE = re.compile(r"[A-Za-z0-9_-]{32}")  # secrets.token_urlsafe(24)
TOKEN_SHAPE = re.compile(r"[0-9a-f]{64}")  # an HMAC-SHA256 hex digest


class FiniteJSONResponse(JSONResponse):
    """Valid JSON even when a run logged NaN or Infinity (those become ``null``)."""

    def render(self, content: Any) -> bytes:
        return dumps(content, ensure_ascii=False, separators=(",", ":")).encode()


def _session(request: Request) -> str | None:
    """The session cookie this app set, or None for a missing or foreign-shaped one."""
    value = request.cookies.get(SESSION_COOKIE, "")
    return value if SESSION_SHAPE.fullmatch(value) else None


class _Dashboard:
    """The dashboard's pages and API over one store; a session token (an HMAC of the session
    cookie under a per-app secret) guards the one action, cancel."""

    def __init__(self, store: Store, on_cancel: Callable[[str], None] | None) -> None:
        self.store = store
        self.on_cancel = on_cancel
        self._secret = secrets.token_bytes(32)

    def token_for(self, session: str) -> str:
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def html_page(self, request: Request, **kw: Any) -> HTMLResponse:
        session = _session(request) or secrets.token_urlsafe(24)
        response = HTMLResponse(page(live=True, token=self.token_for(session), **kw))
        response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict")
        return response

    def jobs_doc(self) -> list[dict[str, Any]]:
        return [job_row(job_view(self.store, j)) for j in self.store.jobs()]

    def job_doc(self, job_id: str) -> dict[str, Any]:
        return job_detail(job_view(self.store, self.store.job(job_id)))

    def fingerprint(self, job_id: str | None) -> tuple[Any, ...]:
        """Cheap: changes whenever anything a page shows may have changed."""
        jobs = [self.store.job(job_id)] if job_id else self.store.jobs()
        marks: list[Any] = [len(jobs)]
        for j in jobs:
            marks += [j.updated_at, len(self.store.events(j.id)), _size(j.log_path)]
            directory = run_dir(j, stored_spec(j.id, j.spec))
            marks.append(_size(directory / "events.jsonl") if directory else 0)
            marks.append(max((a.ended_at or 0 for a in self.store.attempts(j.id)), default=0))
        return tuple(marks)

    async def jobs_page(self, request: Request) -> Response:
        return self.html_page(request, kind="jobs", title="spotwise jobs", data=self.jobs_doc())

    async def job_page(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            doc = self.job_doc(job_id)
        except JobNotFoundError as exc:
            return HTMLResponse(f"<p>{html.escape(exc.message)}</p>", status_code=404)
        return self.html_page(
            request, kind="job", title=f"spotwise job {doc['row']['id']}", data=doc
        )

    async def api_jobs(self, request: Request) -> Response:
        return FiniteJSONResponse(self.jobs_doc())

    async def api_job(self, request: Request) -> Response:
        try:
            return FiniteJSONResponse(self.job_doc(request.path_params["job_id"]))
        except JobNotFoundError as exc:
            return FiniteJSONResponse({"error": exc.message}, status_code=404)

    async def stream(self, request: Request) -> Response:
        job_id = request.query_params.get("job")
        try:
            job_id = self.store.job(job_id).id if job_id else None
        except JobNotFoundError as exc:
            return FiniteJSONResponse({"error": exc.message}, status_code=404)

        async def updates() -> AsyncIterator[str]:
            seen = self.fingerprint(job_id)
            yield ": connected\n\n"
            while not await request.is_disconnected():
                await asyncio.sleep(POLL_S)
                now = self.fingerprint(job_id)
                if now != seen:
                    seen = now
                    doc = self.job_doc(job_id) if job_id else self.jobs_doc()
                    yield f"event: update\ndata: {dumps(doc, separators=(',', ':'))}\n\n"

        return StreamingResponse(
            updates(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    async def cancel(self, request: Request) -> Response:
        session = _session(request)
        sent = request.headers.get(TOKEN_HEADER, "")
        if session is None or not TOKEN_SHAPE.fullmatch(sent):
            return FiniteJSONResponse(
                {
                    "error": f"missing or malformed session cookie or {TOKEN_HEADER} header "
                    "(64 hex digits from the page); reload the page"
                },
                status_code=403,
            )
        if not hmac.compare_digest(sent, self.token_for(session)):
            return FiniteJSONResponse(
                {"error": "wrong session token; reload the page"}, status_code=403
            )
        try:
            job = self.store.job(request.path_params["job_id"])
        except JobNotFoundError as exc:
            return FiniteJSONResponse({"error": exc.message}, status_code=404)
        if not job.state.terminal:
            self.store.request_cancel(job.id)
            if self.on_cancel is not None:  # (it may wait for a controller to start)
                await asyncio.to_thread(self.on_cancel, job.id)
        return FiniteJSONResponse(
            {"job": job.id, "state": self.store.job(job.id).state.value, "cancel_requested": True}
        )

    async def metrics(self, request: Request) -> Response:
        return Response(render(self.store), media_type="text/plain; version=0.0.4; charset=utf-8")


def create_app(
    store: Store,
    *,
    allowed_hosts: list[str] | None = None,
    on_cancel: Callable[[str], None] | None = None,
) -> Starlette:
    """The dashboard app. ``on_cancel(job_id)`` runs after a cancel was recorded (the CLI
    passes one that restarts a dead controller so that the cancel is carried out)."""
    app = _Dashboard(store, on_cancel)
    static = Path(__file__).resolve().parent / "static"
    routes = [
        Route("/", app.jobs_page),
        Route("/job/{job_id}", app.job_page),
        Route("/api/jobs", app.api_jobs),
        Route("/api/jobs/{job_id}", app.api_job),
        Route("/api/jobs/{job_id}/cancel", app.cancel, methods=["POST"]),
        Route("/api/stream", app.stream),
        Route("/metrics", app.metrics),
        Mount("/static", StaticFiles(directory=static), name="static"),
    ]
    hosts = [*LOOPBACK_NAMES, *(allowed_hosts or [])]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts),
            Middleware(_SecurityHeaders),
        ],
    )


class _SecurityHeaders:
    """Adds the CSP and friends to every response (plain ASGI: server-sent events stream)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] += [
                    (k.encode(), v.encode())
                    for k, v in (
                        ("content-security-policy", CSP_LIVE),
                        ("x-content-type-options", "nosniff"),
                        ("referrer-policy", "no-referrer"),
                    )
                ]
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1
