"""API tokens: how one is made, how a request's ``Authorization: Bearer`` header is checked,
and the admin token a new server creates for its first user.

A token reads ``spw_<id>_<secret>``: the prefix lets secret scanners and people recognise it,
the id (public: listed, revoked by) finds its row exactly, and only the SHA-256 of the whole
token is stored, compared in constant time. A token is never logged or echoed; the only copy is
the one printed (or written 0600) when it is made.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from spotwise.control.store import Store, Token
from spotwise.control.store.accounts import Role
from spotwise.echo import shown
from spotwise.errors import ConfigError
from spotwise.server.principal import Principal

if TYPE_CHECKING:
    from starlette.requests import Request

TOKEN_PREFIX = "spw_"
ADMIN_USER = "admin"
ADMIN_TOKEN_FILE = "admin-token"
MAX_LABEL_CHARS = 100
_TOKEN = re.compile(r"spw_([0-9a-f]{12})_[A-Za-z0-9_-]{43}\Z")
_BEARER = "bearer "
MAKE_TOKEN = (
    'python3 -c "import secrets; '
    "print(f'spw_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}')\""
)
_GET_ONE = (
    "use a token of yours (spotwise login URL, or SPOTWISE_TOKEN); an admin creates one with: "
    "spotwise tokens create USER"
)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    store: Store,
    user: str,
    *,
    name: str = "",
    expires_in_s: float | None = None,
    now: float | None = None,
    token: str | None = None,
) -> tuple[str, Token]:
    """A new token for ``user`` (who must exist): (the token, to show once; its record).
    ``token``: one made elsewhere (a preset admin token, checked by :func:`read_token_file`)
    to register instead of a new one."""
    if expires_in_s is not None and expires_in_s <= 0:
        raise ConfigError("a token that expires at once is of no use", hint="give e.g. 30d")
    if len(name) > MAX_LABEL_CHARS or not name.isprintable():
        raise ConfigError(
            f"token name {shown(name)}: at most {MAX_LABEL_CHARS} printable characters",
            hint="a short label such as laptop or ci",
        )
    now = time.time() if now is None else now
    if token is None:
        token = f"{TOKEN_PREFIX}{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
    match = _TOKEN.match(token)
    if match is None:  # (never shown: it may be a secret with a typo)
        raise ConfigError(
            "a preset token is not a spotwise token", hint=f"make one with: {MAKE_TOKEN}"
        )
    token_id = match.group(1)
    record = Token(
        id=token_id,
        user=user,
        name=name,
        created_at=now,
        expires_at=None if expires_in_s is None else now + expires_in_s,
        revoked_at=None,
    )
    store.accounts.add_token(record, token_sha256(token))
    return token, record


def check_token(store: Store, token: str | None, now: float | None = None) -> Principal | str:
    """Who ``token`` belongs to, or why it is refused, in words a 401 can show with the fix.
    Revoked and expired are named only for a token whose secret matched."""
    if token is None:
        return f"no token: send the header 'Authorization: Bearer <token>'; {_GET_ONE}"
    match = _TOKEN.match(token)
    found = None if match is None else store.accounts.credential(match.group(1))
    if found is None or not hmac.compare_digest(found[2], token_sha256(token)):
        return f"the token is not valid (a typo, or cut short?); {_GET_ONE}"
    record, role, _ = found
    state = record.state(time.time() if now is None else now)
    if state == "revoked":
        return f"token {record.id} of {record.user} was revoked; {_GET_ONE}"
    if state == "expired":
        return f"token {record.id} of {record.user} has expired; {_GET_ONE}"
    return Principal(record.user, cast(Role, role))


def principal_for(store: Store, token: str | None, now: float | None = None) -> Principal | None:
    """Who ``token`` belongs to, or None for a token that is missing, malformed, unknown,
    revoked or expired (all answered 401)."""
    checked = check_token(store, token, now)
    return checked if isinstance(checked, Principal) else None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (scheme case-insensitive)."""
    if authorization is None or authorization[: len(_BEARER)].lower() != _BEARER:
        return None
    return authorization[len(_BEARER) :].strip() or None


def authenticator(store: Store) -> Callable[[Request], Principal | None]:
    """The server app's ``authenticate`` hook: a request's principal, or None (then 401)."""

    def authenticate(request: Request) -> Principal | None:
        return principal_for(store, bearer_token(request.headers.get("authorization")))

    return authenticate


def refusal(store: Store, request: Request) -> str:
    """Why ``authenticate`` refused ``request``: the text of its 401, with the fix."""
    checked = check_token(store, bearer_token(request.headers.get("authorization")))
    return "" if isinstance(checked, Principal) else checked


def read_token_file(path: Path) -> str:
    """A preset token (``--admin-token-file``, a mounted Kubernetes Secret), checked for the
    token's form; its content is never part of an error."""
    try:
        token = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as exc:
        raise ConfigError(
            f"--admin-token-file {path}: cannot read it ({exc.strerror or type(exc).__name__})",
            hint="mount the Secret's admin-token key there, or leave the option out",
        ) from None
    if not _TOKEN.match(token):
        raise ConfigError(
            f"--admin-token-file {path} does not hold a spotwise token (spw_, 12 hex digits, _, "
            "43 URL-safe characters)",
            hint=f"make one with: {MAKE_TOKEN}",
        )
    return token


def ensure_admin_token(store: Store, home: Path, preset: str | None = None) -> str | None:
    """At a server's first start (no admin in the store): create the ``admin`` user and a token
    and return it. A generated token is written to ``<home>/admin-token`` (0600) to be printed
    once; a ``preset`` one (from a Secret) is registered by its hash only, written nowhere.
    None when an admin exists already.

    Two replicas starting at once on one database: one creates the user, the other gets None.
    """
    if any(u.role == "admin" for u in store.accounts.users()):
        return None
    try:
        store.accounts.add_user(ADMIN_USER, "admin")
    except ConfigError:
        if store.accounts.user(ADMIN_USER).role == "admin":  # another replica was first
            return None
        raise
    if preset is not None:
        create_token(
            store, ADMIN_USER, name="admin (preset, registered at first start)", token=preset
        )
        return preset
    token, _ = create_token(store, ADMIN_USER, name="admin (created at first start)")
    write_private(home / ADMIN_TOKEN_FILE, token + "\n")
    return token


def is_registered(store: Store, token: str) -> bool:
    return isinstance(check_token(store, token), Principal)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file readable by its owner only (0600 from its creation), durably."""
    from spotwise.checkpoint.durable import write_atomic

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, text.encode(), mode=0o600)
