"""Tokens checked as the server checks them: a real Starlette request's Bearer header."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from starlette.requests import Request

from spotwise.control.store import Store
from spotwise.errors import ConfigError
from spotwise.server.auth import (
    ADMIN_TOKEN_FILE,
    authenticator,
    check_token,
    create_token,
    ensure_admin_token,
    principal_for,
    refusal,
)
from spotwise.server.principal import Principal


def _request(authorization: str | None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    return Request({"type": "http", "method": "GET", "path": "/api/v1/jobs", "headers": headers})


def test_a_token_names_its_user_until_revoked_or_expired():
    store = Store()
    store.accounts.add_user("alice", "user")
    store.accounts.add_user("vic", "viewer")
    token, record = create_token(store, "alice", expires_in_s=3600.0, now=1000.0)
    viewer, _ = create_token(store, "vic")
    authenticate = authenticator(store)
    assert principal_for(store, token, now=1000.0) == Principal("alice", "user")
    assert authenticate(_request(f"Bearer {viewer}")) == Principal("vic", "viewer")
    assert authenticate(_request(f"bearer  {viewer} ")) == Principal("vic", "viewer")
    # expired an hour after it was made
    assert principal_for(store, token, now=4599.0) is not None
    assert principal_for(store, token, now=4600.0) is None
    assert check_token(store, token, now=4600.0).startswith(
        f"token {record.id} of alice has expired"
    )
    wrong = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for header in (None, "", "Bearer", f"Basic {viewer}", f"Bearer {wrong}", f"Bearer {viewer}x"):
        assert authenticate(_request(header)) is None, header
    store.accounts.revoke_token(record.id)
    assert principal_for(store, token, now=1000.0) is None
    # the 401's text says why, with the fix, and never echoes the token
    for header, why in [
        (None, "no token: send the header 'Authorization: Bearer <token>'"),
        (f"Bearer {wrong}", "the token is not valid"),
        (f"Bearer {token}", f"token {record.id} of alice was revoked"),
    ]:
        text = refusal(store, _request(header))
        assert text.startswith(why) and "spotwise tokens create USER" in text
        assert token not in text and wrong not in text
    assert refusal(store, _request(f"Bearer {viewer}")) == ""
    with pytest.raises(ConfigError, match="expires at once"):
        create_token(store, "alice", expires_in_s=0)
    with pytest.raises(ConfigError, match="at most 100 printable characters"):
        create_token(store, "alice", name="\x1b[2J")


def test_the_first_start_creates_the_admin_token_once(tmp_path: Path):
    store = Store()
    home = tmp_path / "home"
    token = ensure_admin_token(store, home)
    assert token is not None and token.startswith("spw_")
    path = home / ADMIN_TOKEN_FILE
    assert path.read_text() == token + "\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert authenticator(store)(_request(f"Bearer {token}")) == Principal("admin", "admin")
    assert ensure_admin_token(Store(), home) is None  # a later start (or a second replica)
    assert path.read_text() == token + "\n"
