"""Users, tokens and job owners in the job store, on SQLite and PostgreSQL (``store_db``)."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from spotwise.control.store import Store, Token
from spotwise.errors import ConfigError

pytestmark = pytest.mark.usefixtures("store_db")


def _token(token_id: str, user: str, **fields: float | None) -> Token:
    return Token(token_id, user, "laptop", 100.0, fields.get("expires_at"), None)


def test_users_tokens_and_owners_round_trip(store_db: str):
    store = Store()
    accounts = store.accounts
    accounts.add_user("alice", "user", now=1.0)
    accounts.add_user("vic", "viewer", now=2.0)
    assert [(u.name, u.role) for u in accounts.users()] == [("alice", "user"), ("vic", "viewer")]
    with pytest.raises(ConfigError, match="already exists"):
        accounts.add_user("alice", "admin")
    with pytest.raises(ConfigError, match=r"'boss' is not one of admin, user, viewer"):
        accounts.add_user("bob", "boss")
    with pytest.raises(ConfigError, match="not allowed"):
        accounts.add_user("-rf%", "user")

    accounts.add_token(_token("aaaa00000001", "alice", expires_at=500.0), "f" * 64)
    with pytest.raises(ConfigError, match="no user 'carol'"):
        accounts.add_token(_token("aaaa00000002", "carol"), "e" * 64)
    found = Store().accounts.credential("aaaa00000001")  # another connection sees it
    assert found is not None
    record, role, sha256 = found
    assert (record.user, record.expires_at, role, sha256) == ("alice", 500.0, "user", "f" * 64)
    assert record.state(499.0) == "active" and record.state(500.0) == "expired"
    # ids are matched exactly: a prefix or a pattern finds nothing
    assert accounts.credential("aaaa") is None and accounts.credential("aaaa%") is None
    assert accounts.revoke_token("aaaa00000001", now=200.0).revoked_at == 200.0
    assert accounts.revoke_token("aaaa00000001", now=300.0).revoked_at == 200.0  # kept
    assert [t.state(0.0) for t in accounts.tokens("alice")] == ["revoked"]
    with pytest.raises(ConfigError, match="no token 'aaaa0'"):
        accounts.revoke_token("aaaa0")

    hooks = {"webhooks": [{"url_from": "env:SLACK", "states": ["FAILED"]}]}
    assert accounts.set_notify("alice", hooks).notify == hooks
    assert Store().accounts.user("alice").notify == hooks
    assert accounts.set_notify("alice", None).notify is None
    with pytest.raises(ConfigError, match="no user 'carol'"):
        accounts.set_notify("carol", hooks)

    assert store.create_job("mine", {}, None, owner="alice").owner == "alice"
    assert store.create_job("local", {}, None).owner is None
    assert {j.name: j.owner for j in store.jobs()} == {"mine": "alice", "local": None}


def test_only_the_hash_of_a_token_is_stored(store_db: str):
    from spotwise.server.auth import create_token

    store = Store()
    store.accounts.add_user("alice", "user")
    token, record = create_token(store, "alice", name="ci", expires_in_s=60.0)
    engine = sa.create_engine(store_db.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as db:
        rows = [tuple(r) for r in db.exec_driver_sql("SELECT * FROM tokens")]
    engine.dispose()
    assert len(rows) == 1
    assert record.id in rows[0] and token.startswith(f"spw_{record.id}_")
    # the whole secret: it may hold "_" itself (token_urlsafe), so never split it off by "_"
    secret = token.removeprefix(f"spw_{record.id}_")
    assert len(secret) == 43
    assert not any(secret in str(value) for value in rows[0])
    assert hashlib.sha256(token.encode()).hexdigest() in rows[0]
