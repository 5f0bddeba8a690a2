"""Opening the job store: databases written before migrations, files kept private, and the
databases it refuses at start (too new is in test_store.py), each naming the database."""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from spotwise.control.store import JobState, Store
from spotwise.control.store.migrate import HEAD, alembic_config
from spotwise.errors import ConfigError, ControlError, MissingExtraError

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]

# The schema as spotwise wrote it before migrations (src/spotwise/control/store.py at d2ea188);
# databases from before policy_json existed lack that column.
SCHEMA_D2EA188 = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_json TEXT NOT NULL, spec_path TEXT,
  state TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
  cancel_requested INTEGER NOT NULL DEFAULT 0, next_launch_at REAL NOT NULL DEFAULT 0,
  errors_used INTEGER NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '',
  blocked_json TEXT NOT NULL DEFAULT '{}', control_error_since REAL,
  stop_reason TEXT NOT NULL DEFAULT '', policy_json TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
  job_id TEXT NOT NULL REFERENCES jobs(id), n INTEGER NOT NULL,
  state TEXT NOT NULL, provider TEXT NOT NULL, market TEXT NOT NULL, zone TEXT NOT NULL,
  handle_json TEXT, started_at REAL NOT NULL, running_at REAL, ended_at REAL,
  reason TEXT, exit_code INTEGER, usd_per_hour REAL NOT NULL DEFAULT 0,
  ondemand_usd_per_hour REAL NOT NULL DEFAULT 0, time_scale REAL NOT NULL DEFAULT 1,
  PRIMARY KEY (job_id, n)
);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, at REAL NOT NULL,
  kind TEXT NOT NULL, message TEXT NOT NULL, data_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, id);
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _write_old_database(home: Path, *, with_policy: bool) -> Path:
    """A store as the old code left it: 0755 home, 0644 database, WAL side files."""
    home.mkdir(mode=0o755, exist_ok=True)
    os.chmod(home, 0o755)
    path = home / "spotwise.db"
    schema = SCHEMA_D2EA188 if with_policy else SCHEMA_D2EA188.replace(", policy_json TEXT", "")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(schema)
    db.execute(
        "INSERT INTO jobs (id, name, spec_json, state, created_at, updated_at, message)"
        " VALUES ('old-abc123', 'old', '{\"command\": \"x\"}', 'RUNNING', 1.0, 2.0, 'going')"
    )
    db.execute(
        "INSERT INTO attempts (job_id, n, state, provider, market, zone, handle_json, started_at,"
        " usd_per_hour) VALUES ('old-abc123', 1, 'running', 'sim', 'spot', 'z1', '{\"pid\": 3}',"
        " 1.5, 0.25)"
    )
    for i in range(3):
        db.execute(
            "INSERT INTO events (job_id, at, kind, message) VALUES ('old-abc123', ?, 'note', ?)",
            (float(i), f"old event {i}"),
        )
    for p in home.iterdir():
        os.chmod(p, 0o644)
    # left open on purpose: the -wal and -shm files stay, as with a controller still running
    return path


@pytest.mark.parametrize("with_policy", [True, False], ids=["d2ea188", "before-policy"])
def test_a_database_written_before_migrations_upgrades_in_place(with_policy: bool):
    home = Path(os.environ["SPOTWISE_HOME"])
    path = _write_old_database(home, with_policy=with_policy)
    assert {p.name for p in home.iterdir()} >= {"spotwise.db", "spotwise.db-wal"}
    store = Store()
    job = store.job("old")
    assert (job.id, job.state, job.message, job.policy) == (
        "old-abc123",
        JobState.RUNNING,
        "going",
        None,
    )
    [attempt] = store.attempts(job.id)
    assert (attempt.handle, attempt.usd_per_hour, attempt.zone) == ({"pid": 3}, 0.25, "z1")
    store.update_job(job.id, policy={"kind": "greedy"}, event=("note", "new event"))
    assert store.job(job.id).policy == {"kind": "greedy"}
    assert [e["message"] for e in store.events(job.id)] == [
        "old event 0",
        "old event 1",
        "old event 2",
        "new event",
    ]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]
    # the old 0755/0644 modes are tightened, the WAL and SHM files' too
    assert _mode(home) == 0o700
    side = [home / f"spotwise.db{s}" for s in ("", "-wal", "-shm")]
    assert [_mode(p) for p in side if p.exists()] == [0o600] * 3


def test_head_is_the_newest_migration():
    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == HEAD


def test_a_new_store_is_private(tmp_path: Path):
    home = tmp_path / "fresh" / "home"
    os.umask(old := os.umask(0o022))
    try:
        store = Store(home)
        store.create_job("secret", {"env": {"TOKEN": "x"}}, None)
        files = sorted(p.name for p in home.iterdir() if p.is_file())
        # (the lock file orders the stores that open the database at once)
        assert files == ["spotwise.db", "spotwise.db-shm", "spotwise.db-wal", "spotwise.db.lock"]
        assert _mode(home) == 0o700
        assert {p.name: _mode(p) for p in home.iterdir() if p.is_file()} == dict.fromkeys(
            files, 0o600
        )
    finally:
        os.umask(old)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_database_that_cannot_connect_is_refused_at_start_naming_it(tmp_path: Path):
    port = _closed_port()
    env = {
        **os.environ,
        "SPOTWISE_DB": f"postgresql://ops:pa55-w0rd@127.0.0.1:{port}/jobs",
        "SPOTWISE_HOME": str(tmp_path),
    }
    out = subprocess.run([*SPOTWISE, "jobs"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"cannot open the job database postgresql://ops:***@127.0.0.1:{port}/jobs" in (
        out.stderr
    )
    assert "Connection refused" in out.stderr and "SPOTWISE_DB" in out.stderr
    assert "pa55-w0rd" not in out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_a_wrong_password_is_refused_without_showing_it(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
):
    url = sa.make_url(postgres_url).set(password="not-the-pa55word")
    monkeypatch.setenv("SPOTWISE_DB", url.render_as_string(hide_password=False))
    with pytest.raises(ControlError, match="password authentication failed") as err:
        Store()
    assert url.render_as_string(hide_password=True) in str(err.value)
    assert "not-the-pa55word" not in str(err.value)


@pytest.mark.parametrize(
    "value",
    ["mysql://u:pw@127.0.0.1/db", "sqlite://", "not a url at all", "postgresql+pg8000://h/d"],
)
def test_a_database_spotwise_cannot_use_is_refused(value: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPOTWISE_DB", value)
    with pytest.raises(ConfigError, match="SPOTWISE_DB") as err:
        Store()
    assert "postgresql://USER:PASSWORD@HOST" in str(err.value)
    assert ":pw@" not in str(err.value)


def test_postgresql_without_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    """As in an install without the extra: psycopg cannot be imported."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setenv("SPOTWISE_DB", "postgresql://u@127.0.0.1/db")
    with pytest.raises(MissingExtraError) as err:
        Store()
    assert "pip install 'spotwise[postgres]'" in str(err.value)


def test_a_database_at_revision_0001_upgrades_in_place(store_db: str):
    """Jobs kept, no owner; users and tokens tables added."""
    from alembic import command

    engine = sa.create_engine(store_db.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as db:
        command.upgrade(alembic_config(db), "0001")
        db.exec_driver_sql(
            "INSERT INTO jobs (id, name, spec_json, state, created_at, updated_at)"
            " VALUES ('old-abc123', 'old', '{}', 'RUNNING', 1.0, 2.0)"
        )
    store = Store()
    job = store.job("old-abc123")
    assert (job.state, job.owner) == (JobState.RUNNING, None)
    store.accounts.add_user("alice", "user")
    assert store.create_job("new", {}, None, owner="alice").owner == "alice"
    with engine.connect() as db:
        assert db.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == HEAD
    engine.dispose()
