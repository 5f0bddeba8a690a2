"""Users and API tokens in the job database (``Store.accounts``), each method one transaction.

Tokens are stored by id with the SHA-256 of their secret; making and checking the secret is
``spotwise.server.auth``'s job. Ids and names are matched exactly, never as prefixes or patterns.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Literal

import sqlalchemy as sa

from spotwise.control.store.engine import Writer
from spotwise.control.store.models import Token, User
from spotwise.control.store.schema import tokens, users
from spotwise.echo import shown
from spotwise.errors import ConfigError

USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}\Z")
MAX_TOKEN_ID_CHARS = 64
# the roles a user may hold; stored with the user, so they live beside the table, not in the server
Role = Literal["admin", "user", "viewer"]
ROLES: tuple[Role, ...] = ("admin", "user", "viewer")


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ConfigError(
            f"role {shown(role)} is not one of {', '.join(ROLES)}",
            hint="admin does everything, user submits and changes their own jobs, viewer reads",
        )
    return role


def _row_user(r: sa.RowMapping) -> User:
    notify = json.loads(r["notify_json"]) if r["notify_json"] else None
    return User(r["name"], r["role"], r["created_at"], notify)


def _row_token(r: sa.RowMapping) -> Token:
    return Token(
        id=r["id"],
        user=r["user"],
        name=r["name"],
        created_at=r["created_at"],
        expires_at=r["expires_at"],
        revoked_at=r["revoked_at"],
    )


def _no_user(name: str) -> ConfigError:
    return ConfigError(f"no user {shown(name)}", hint="list users with: spotwise users list")


def _no_token(token_id: str) -> ConfigError:
    return ConfigError(f"no token {shown(token_id)}", hint="list tokens with: spotwise tokens list")


_USER = sa.select(users).where(users.c.name == sa.bindparam("user_name"))  # (each state change)


class Accounts:
    """Typed access to the ``users`` and ``tokens`` tables of an open store."""

    def __init__(self, engine: sa.Engine, writer: Writer) -> None:
        self._engine = engine
        self._writer = writer

    # --- users -----------------------------------------------------------------------------
    def add_user(self, name: str, role: str, now: float | None = None) -> User:
        if not USER_NAME.match(name):
            raise ConfigError(
                f"user name {shown(name)} is not allowed",
                hint="use letters, digits and . _ @ - (at most 63; the first a letter or digit)",
            )
        user = User(name, check_role(role), time.time() if now is None else now)
        try:
            with self._writer.begin() as db:
                db.execute(users.insert().values(name=name, role=role, created_at=user.created_at))
        except sa.exc.IntegrityError:
            raise ConfigError(
                f"user {shown(name)} already exists ({self.user(name).role})",
                hint="give another name, or list users with: spotwise users list",
            ) from None
        return user

    def user(self, name: str) -> User:
        with self._engine.connect() as db:
            row = db.execute(_USER, {"user_name": name}).mappings().first()
        if row is None:
            raise _no_user(name)
        return _row_user(row)

    def users(self) -> list[User]:
        with self._engine.connect() as db:
            rows = db.execute(sa.select(users).order_by(users.c.created_at)).mappings().all()
        return [_row_user(r) for r in rows]

    def set_notify(self, name: str, notify: dict[str, Any] | None) -> User:
        """Replace the user's own webhooks (a validated ``notify`` document; None: none)."""
        with self._writer.begin() as db:
            done = db.execute(
                users.update()
                .where(users.c.name == name)
                .values(notify_json=None if notify is None else json.dumps(notify))
            )
        if done.rowcount == 0:
            raise _no_user(name)
        return self.user(name)

    # --- tokens ----------------------------------------------------------------------------
    def add_token(self, token: Token, sha256: str) -> None:
        """Record a token made by ``spotwise.server.auth`` (its hash, never its secret)."""
        self.user(token.user)
        with self._writer.begin() as db:
            db.execute(
                tokens.insert().values(
                    id=token.id,
                    user=token.user,
                    sha256=sha256,
                    name=token.name,
                    created_at=token.created_at,
                    expires_at=token.expires_at,
                    revoked_at=token.revoked_at,
                )
            )

    def credential(self, token_id: str) -> tuple[Token, str, str] | None:
        """(token, its user's role, the SHA-256 of its secret) for exactly this id, or None."""
        if not token_id or len(token_id) > MAX_TOKEN_ID_CHARS:
            return None
        query = (
            sa.select(tokens, users.c.role)
            .join(users, users.c.name == tokens.c.user)
            .where(tokens.c.id == token_id)
        )
        with self._engine.connect() as db:
            row = db.execute(query).mappings().first()
        return None if row is None else (_row_token(row), row["role"], row["sha256"])

    def tokens(self, user: str | None = None) -> list[Token]:
        query = sa.select(tokens).order_by(tokens.c.created_at)
        if user is not None:
            self.user(user)
            query = query.where(tokens.c.user == user)
        with self._engine.connect() as db:
            return [_row_token(r) for r in db.execute(query).mappings().all()]

    def revoke_token(self, token_id: str, now: float | None = None) -> Token:
        """Revoke the token with exactly this id (a token revoked before keeps its time)."""
        now = time.time() if now is None else now
        if not token_id or len(token_id) > MAX_TOKEN_ID_CHARS:
            raise _no_token(token_id)
        with self._writer.begin() as db:
            db.execute(
                tokens.update()
                .where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
                .values(revoked_at=now)
            )
            row = db.execute(sa.select(tokens).where(tokens.c.id == token_id)).mappings().first()
        if row is None:
            raise _no_token(token_id)
        return _row_token(row)
