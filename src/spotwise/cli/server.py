"""``spotwise server``: drive every job from one long-running process, with an HTTP API."""

from __future__ import annotations

import os
from pathlib import Path

import typer

_HOST = typer.Option(
    "127.0.0.1",
    "--host",
    help="address to listen on; another than loopback needs --tls-cert/--tls-key or --behind-proxy",
)
_PORT = typer.Option(8790, "--port", help="TCP port (0 picks a free one)")
_HOME = typer.Option(
    None,
    "--home",
    help="spotwise home: the job store and the jobs' directories "
    "(default: $SPOTWISE_HOME, else ~/.spotwise)",
    show_default=False,
)
_TLS_CERT = typer.Option(None, "--tls-cert", help="serve HTTPS: certificate (PEM)")
_TLS_KEY = typer.Option(None, "--tls-key", help="serve HTTPS: private key (PEM)")
_BEHIND_PROXY = typer.Option(
    False,
    "--behind-proxy",
    help="a proxy in front terminates TLS (allows another --host without --tls-*)",
)
_ALLOWED_HOST = typer.Option(
    [],
    "--allowed-host",
    help="a host name the dashboard answers to besides loopback and --host (a "
    "Kubernetes Service's, a proxy's); repeatable; *.example.com for subdomains",
    show_default=False,
)
_ADMIN_TOKEN_FILE = typer.Option(
    None,
    "--admin-token-file",
    envvar="SPOTWISE_ADMIN_TOKEN_FILE",
    help="at the store's first start, register the admin token in this file (a "
    "mounted Secret) instead of making one; it is never printed",
    show_default=False,
)
_LEASE = typer.Option(
    "15s",
    "--lease",
    help="how long a job's lease lasts unrenewed (renewed every third of it): with "
    "several servers on one PostgreSQL, a dead one's jobs are adopted within it",
)


def register(app: typer.Typer) -> None:
    app.command()(server)


def server(
    host: str = _HOST,
    port: int = _PORT,
    home: Path = _HOME,
    tls_cert: Path = _TLS_CERT,
    tls_key: Path = _TLS_KEY,
    behind_proxy: bool = _BEHIND_PROXY,
    allowed_host: list[str] = _ALLOWED_HOST,
    admin_token_file: Path = _ADMIN_TOKEN_FILE,
    lease: str = _LEASE,
) -> None:
    """Drive every job from this one process, and serve the API and the dashboard.

    Launches, watches, relaunches, switches, budgets and cleans up every unfinished job of
    the store exactly as `spotwise launch` does, from one process instead of one per job.
    At start it adopts every job that has not ended (a restarted server continues them;
    no attempt is launched twice). Several servers may share one PostgreSQL database
    (SPOTWISE_DB): each job is driven by one of them at a time, through a lease. Serves
    /healthz, the JSON API under /api/v1 (described at /api/v1/openapi.json) and the
    dashboard at /. Stops on Ctrl-C or SIGTERM; the jobs' machines keep running and the
    next start (or another replica) adopts them. See docs/server.md.
    """
    from spotwise import settings
    from spotwise.server.serve import check_bind, check_lease, serve

    check_bind(host, tls_cert, tls_key, behind_proxy)  # before anything is opened
    lease_s = check_lease(lease)
    if home is not None:
        os.environ[settings.HOME.name] = str(home.expanduser().resolve())
    serve(
        host=host,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        behind_proxy=behind_proxy,
        admin_token_file=admin_token_file,
        allowed_hosts=allowed_host,
        lease_s=lease_s,
    )
