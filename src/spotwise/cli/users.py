"""``spotwise users`` and ``spotwise tokens``: who may call ``spotwise server``, and with what.

They act on the job store the server uses (``SPOTWISE_DB``, else ``SPOTWISE_HOME``), so run
them where the server runs (or with its ``SPOTWISE_DB``). A token is printed once, at creation.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from spotwise.cli._terminal import literal
from spotwise.telemetry.jsonsafe import dumps

users_app = typer.Typer(help="Users of spotwise server: add, list.", no_args_is_help=True)
tokens_app = typer.Typer(
    help="API tokens of spotwise server: create, list, revoke.", no_args_is_help=True
)


def _store():
    from spotwise.control.store import Store

    return Store()


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _table(*headers: str) -> Table:
    return Table(*headers, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)


@users_app.command("add")
def users_add(
    name: str = typer.Argument(..., help="the user's name, e.g. alice"),
    role: str = typer.Option("user", "--role", help="admin | user | viewer"),
) -> None:
    """Add a user: admin (everything), user (submits, changes own jobs) or viewer (reads)."""
    user = _store().accounts.add_user(name, role)
    Console().print(literal(f"user {user.name} added ({user.role})"))
    typer.echo(f"create a token with: spotwise tokens create {user.name}")


@users_app.command("list")
def users_list(as_json: bool = typer.Option(False, "--json", help="machine-readable")) -> None:
    """List users and their roles."""
    users = _store().accounts.users()
    if as_json:
        typer.echo(dumps([u.as_dict() for u in users], indent=2))
        return
    table = _table("name", "role", "created")
    for u in users:
        table.add_row(literal(u.name), u.role, _when(u.created_at))
    Console().print(table)


@users_app.command("notify")
def users_notify(
    name: str = typer.Argument(..., help="the user whose jobs are reported"),
    url: str | None = typer.Option(None, "--url", help="http(s) URL to post to"),
    url_from: str | None = typer.Option(
        None, "--url-from", help="env:NAME: the server's variable holding the URL (Slack's)"
    ),
    secret_from: str | None = typer.Option(
        None, "--secret-from", help="env:NAME: the server's variable holding the HMAC key"
    ),
    states: str | None = typer.Option(
        None, "--states", help="comma-separated, e.g. SUCCEEDED,FAILED (default: every change)"
    ),
    clear: bool = typer.Option(False, "--clear", help="remove the user's webhooks instead"),
) -> None:
    """Add a webhook for all of a user's jobs (posted as a job file's notify.webhooks are)."""
    from pydantic import ValidationError

    from spotwise.errors import ConfigError
    from spotwise.telemetry.webhooks import Notify

    accounts = _store().accounts
    if clear:
        accounts.set_notify(name, None)
        typer.echo(f"webhooks of {name} removed")
        return
    hook: dict[str, Any] = {"url": url, "url_from": url_from, "secret_from": secret_from}
    if states is not None:
        hook["states"] = [s.strip().upper() for s in states.split(",")]
    old = accounts.user(name).notify or {"webhooks": []}
    try:
        notify = Notify.model_validate({"webhooks": [*old["webhooks"], hook]})
    except ValidationError as exc:
        lines = [_flag_error(err) for err in exc.errors()]
        raise ConfigError("; ".join(lines), hint="see docs/server.md, 'Webhooks'") from None
    accounts.set_notify(name, notify.model_dump(mode="json"))
    typer.echo(f"{len(notify.webhooks)} webhook(s) for the jobs of {name}")


def _flag_error(err: Any) -> str:
    """A pydantic error on a webhook in the words of the command's options."""
    field = str(err["loc"][-1]) if len(err["loc"]) > 2 else ""
    flag = "--" + field.replace("_", "-") + ": " if field else ""
    return flag + err["msg"].removeprefix("Value error, ")


@tokens_app.command("create")
def tokens_create(
    user: str = typer.Argument(..., help="the user the token acts as"),
    name: str = typer.Option("", "--name", help="a label, e.g. laptop or ci"),
    expires: str | None = typer.Option(
        None, "--expires", help="lifetime, e.g. 12h, 30d (default: until revoked)"
    ),
) -> None:
    """Create a token and print it, once: it is stored hashed and cannot be shown again."""
    from spotwise.durations import parse_duration_s
    from spotwise.errors import ConfigError
    from spotwise.server.auth import create_token

    expires_in_s = None
    if expires is not None:
        try:
            expires_in_s = parse_duration_s(expires)
        except ValueError as exc:
            raise ConfigError(f"--expires: {exc}", hint="give e.g. 12h or 30d") from None
    token, record = create_token(_store(), user, name=name, expires_in_s=expires_in_s)
    typer.echo(
        f"token {record.id} for {record.user}, expires {_when(record.expires_at)}"
        " (shown once; keep it secret: spotwise login URL, or SPOTWISE_TOKEN)",
        err=True,
    )
    typer.echo(token)


@tokens_app.command("list")
def tokens_list(
    user: str | None = typer.Option(None, "--user", help="only this user's tokens"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable"),
) -> None:
    """List tokens (ids, users, states; never the tokens themselves)."""
    now = time.time()
    tokens = _store().accounts.tokens(user)
    if as_json:
        typer.echo(dumps([t.as_dict(now) for t in tokens], indent=2))
        return
    table = _table("id", "user", "name", "state", "created", "expires")
    for t in tokens:
        table.add_row(
            t.id,
            literal(t.user),
            literal(t.name or "-"),
            t.state(now),
            _when(t.created_at),
            _when(t.expires_at),
        )
    Console().print(table)


@tokens_app.command("revoke")
def tokens_revoke(token_id: str = typer.Argument(..., help="the token's id (tokens list)")) -> None:
    """Revoke a token: requests with it are refused from now on."""
    record = _store().accounts.revoke_token(token_id)
    typer.echo(f"token {record.id} of {record.user} revoked")


def register(app: typer.Typer) -> None:
    app.add_typer(users_app, name="users")
    app.add_typer(tokens_app, name="tokens")
