"""Run the server: the app on uvicorn (with the driver, for as long as it serves) until SIGINT
or SIGTERM. Stopping lets every job go with its machines running; the next start adopts them.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from spotwise.control.store.leases import DEFAULT_LEASE_S
from spotwise.durations import parse_duration_s
from spotwise.errors import ConfigError
from spotwise.registry import require

if TYPE_CHECKING:
    from spotwise.control.store import Store
    from spotwise.server.app import Authenticate

LOOPBACK_NAMES = ("localhost",)
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
MIN_LEASE_S = 1.0
MAX_LEASE_S = 600.0


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, tls_cert: Path | None, tls_key: Path | None, behind_proxy: bool) -> None:
    """Tokens travel in clear over plain HTTP: another address than loopback needs TLS here,
    or a TLS-terminating proxy in front (``behind_proxy``)."""
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError(
            "--tls-cert and --tls-key go together", hint="give both files (PEM), or neither"
        )
    if not is_loopback(host) and tls_cert is None and not behind_proxy:
        raise ConfigError(
            f"--host {host} would send tokens in clear text to the network",
            hint="add --tls-cert CERT.pem --tls-key KEY.pem, or --behind-proxy when a proxy "
            "on this host terminates TLS, or keep the default --host 127.0.0.1",
        )


def check_host(name: str) -> str:
    """An ``--allowed-host`` value: a host name or address as a Host header carries it, without
    port (``*.example.com`` for every subdomain)."""
    bare = name.removeprefix("*.")
    if not _HOST.fullmatch(bare) or name == "*":
        raise ConfigError(
            f"--allowed-host {name!r} is not a host name",
            hint="a name as clients write it in the URL, without scheme or port, e.g. "
            "spotwise-server.spotwise.svc or *.example.com",
        )
    return name.lower()


def check_lease(text: str) -> float:
    """``--lease``: long enough to renew (every third of it) on a busy host, short enough that
    a dead replica's jobs do not wait long for another."""
    try:
        lease_s = parse_duration_s(text)
    except ValueError as exc:
        raise ConfigError(f"--lease {text}: {exc}", hint="e.g. --lease 15s (the default)") from None
    if not MIN_LEASE_S <= lease_s <= MAX_LEASE_S:
        raise ConfigError(
            f"--lease {text} is outside {MIN_LEASE_S:g}s..{MAX_LEASE_S:g}s",
            hint="e.g. --lease 15s (the default): renewed every 5s, taken over 15s after a "
            "replica dies",
        )
    return lease_s


def serve(
    *,
    host: str,
    port: int,
    authenticate: Authenticate | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    behind_proxy: bool = False,
    admin_token_file: Path | None = None,
    allowed_hosts: Sequence[str] = (),
    lease_s: float = DEFAULT_LEASE_S,
) -> None:
    """Serve until stopped (the store is ``SPOTWISE_DB``, else SQLite in ``SPOTWISE_HOME``).

    Callers are the store's users, by their tokens (``authenticate`` replaces that check, for
    tests); at the first start an admin token is made and printed once, or the one in
    ``admin_token_file`` is registered (and never shown). ``allowed_hosts``: names the
    dashboard answers to besides loopback and ``host`` (a Service's, a proxy's). Several
    servers may share one PostgreSQL database: each job is driven by the one holding its lease
    (``lease_s``: a dead replica's jobs are adopted by another within it, plus one scan)."""
    uvicorn = require("uvicorn", "dashboard", "spotwise server")
    require("starlette", "dashboard", "spotwise server")
    from spotwise.control.store import Store
    from spotwise.server.app import create_app
    from spotwise.server.driver import Driver

    check_bind(host, tls_cert, tls_key, behind_proxy)
    names = [*([host] if host not in ("0.0.0.0", "::") else []), *map(check_host, allowed_hosts)]
    preset = None
    if admin_token_file is not None:
        from spotwise.server.auth import read_token_file

        preset = read_token_file(admin_token_file)
    store = Store()
    token = None
    if authenticate is None:
        authenticate, token = _store_tokens(store, preset, admin_token_file)
    driver = Driver(store, lease_s=lease_s)
    app = create_app(store, driver, authenticate=authenticate, allowed_hosts=names)
    sock = listen(host, port)
    scheme = "https" if tls_cert else "http"
    shown = f"[{host}]" if sock.family == socket.AF_INET6 else host
    print(
        f"spotwise server on {scheme}://{shown}:{sock.getsockname()[1]}/ driving the jobs of "
        f"{store.where} as replica {driver.replica} (lease {lease_s:g}s; Ctrl-C to stop)",
        flush=True,
    )
    if token is not None:
        _show_admin_token(store, token, admin_token_file)
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=1,
        lifespan="on",  # starts and stops the driver
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None,
        proxy_headers=behind_proxy,
    )
    uvicorn.Server(config).run(sockets=[sock])


def _store_tokens(
    store: Store, preset: str | None, admin_token_file: Path | None
) -> tuple[Authenticate, str | None]:
    """Callers by the store's tokens, and the admin token made (or the preset one registered)
    if this is the store's first start."""
    from spotwise.server.auth import authenticator, ensure_admin_token, is_registered

    token = ensure_admin_token(store, store.home, preset)
    if preset is not None and token is None and not is_registered(store, preset):
        print(
            f"warning: the token of {admin_token_file} is not registered: the store has "
            "an admin already, and a preset admin token is registered only at the first "
            "start (use a token of yours: spotwise tokens create)",
            file=sys.stderr,
            flush=True,
        )
    return authenticator(store), token


def _show_admin_token(store: Store, token: str, preset_file: Path | None) -> None:
    """The first start's admin token, printed once; one from ``preset_file`` never is."""
    if preset_file is not None:
        print(f"first start: the admin token of {preset_file} is registered", flush=True)
    else:
        print(
            f"first start: the admin token, shown once (also in {store.home / 'admin-token'}, "
            f"mode 0600):\n  {token}",
            flush=True,
        )


def listen(host: str, port: int) -> socket.socket:
    """A listening socket (IPv6 for an address with a colon); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # connections queue from now on, before the URL is printed
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}",
            hint="choose another --port (0 picks a free one)",
        ) from exc
    return sock
