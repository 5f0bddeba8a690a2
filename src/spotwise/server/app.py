"""The server's HTTP face: ``/healthz``, the versioned JSON API ``/api/v1`` and the dashboard.

This module only wires them: the job routes are :mod:`spotwise.server.job_routes`', the packed
workdir uploads :mod:`spotwise.server.workdir_routes`', and who may call which route is
:mod:`spotwise.server.access`' to say. The :class:`~spotwise.server.driver.Driver` runs while
the app serves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from spotwise.control.store import Store
from spotwise.server.access import API, UNAUTHORIZED_HINT, Authenticate, Denied, error
from spotwise.server.driver import Driver
from spotwise.server.job_routes import JobRoutes
from spotwise.server.workdir_routes import WorkdirRoutes
from spotwise.telemetry.dashboard.app import create_app as create_dashboard

__all__ = ["Authenticate", "create_app"]


def create_app(
    store: Store,
    driver: Driver,
    *,
    authenticate: Authenticate,
    allowed_hosts: list[str] | None = None,
) -> Starlette:
    """The server app over ``store``, whose jobs ``driver`` drives."""
    workdirs = WorkdirRoutes(store, authenticate)
    jobs = JobRoutes(store, driver, authenticate, workdirs)
    dashboard = create_dashboard(store, allowed_hosts=allowed_hosts, on_cancel=driver.wake)
    routes: list[BaseRoute] = [
        Route("/healthz", jobs.healthz),
        Route(f"{API}/openapi.json", jobs.openapi),
        Route(f"{API}/jobs", jobs.list_jobs, methods=["GET"]),
        Route(f"{API}/jobs", jobs.submit_job, methods=["POST"]),
        Route(f"{API}/jobs/{{job_id}}", jobs.job_status),
        Route(f"{API}/jobs/{{job_id}}/logs", jobs.job_logs),
        Route(f"{API}/jobs/{{job_id}}/metrics", jobs.job_metrics),
        Route(f"{API}/jobs/{{job_id}}/cancel", jobs.cancel_job, methods=["POST"]),
        Route(f"{API}/jobs/{{job_id}}/resume", jobs.resume_job, methods=["POST"]),
        Route(f"{API}/workdirs/{{sha256}}", workdirs.status, methods=["GET"]),
        Route(f"{API}/workdirs/{{sha256}}", workdirs.upload, methods=["PUT"]),
        Mount("/", app=_guarded(dashboard, authenticate)),
    ]
    return Starlette(
        routes=routes, exception_handlers={Denied: _denied}, lifespan=_lifespan(driver)
    )


def _guarded(dashboard: ASGIApp, authenticate: Authenticate) -> ASGIApp:
    """The dashboard shows every job, so it is for callers who read every job (admins,
    viewers); its one action, cancel, for those who change every job (admins)."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            principal = authenticate(request)
            if principal is None:
                return await error(401, "missing or wrong token", UNAUTHORIZED_HINT)(
                    scope, receive, send
                )
            # a job nobody owns: only a caller who reads (changes) every job may
            everything = (
                principal.can_read(None) if request.method == "GET" else principal.can_change(None)
            )
            if not everything:
                return await error(
                    403,
                    f"the dashboard shows every job; {principal.name} ({principal.role}) "
                    "may not see them all",
                    f"use the API: GET {API}/jobs",
                )(scope, receive, send)
        await dashboard(scope, receive, send)

    return guarded


async def _denied(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Denied)
    return exc.response


def _lifespan(driver: Driver) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        """The driver runs while the app serves; stopping lets the jobs go (before uvicorn
        re-raises the SIGTERM or SIGINT that stopped it)."""
        driver.start()
        try:
            yield
        finally:
            await run_in_threadpool(driver.stop)

    return lifespan
