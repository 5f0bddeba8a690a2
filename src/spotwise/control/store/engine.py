"""Which database the store opens (``SPOTWISE_DB`` or SQLite in ``SPOTWISE_HOME``), an engine
that behaves alike on both, and the 0700/0600 modes that keep the files private."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import stat
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from spotwise import settings
from spotwise.errors import ConfigError
from spotwise.registry import require

DB_FILE = "spotwise.db"
BUSY_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10
# Connections a process keeps open, and more it may open while busy: a server's 12 driver
# workers, its lease renewer, its scans and the API's threads use the store at once. With
# SQLAlchemy's defaults (5 kept, 10 more) a server driving 200 jobs on PostgreSQL opened 160
# connections and closed them again (each a new PostgreSQL backend, and its session settings),
# and its threads could wait for one. A connection is only opened when needed: a CLI keeps one.
POOL_SIZE = 16
POOL_OVERFLOW = 16
# A process frozen inside a transaction (a stalled server replica) holds its row locks until
# PostgreSQL ends its session: at most this long, so it cannot hold up the take-over of its
# jobs' leases for more. The store's transactions never wait on their client for long.
IDLE_IN_TRANSACTION_S = 5
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")
_URL_FORMS = "sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"


def database_url(home: Path) -> sa.URL:
    """``SPOTWISE_DB`` if set, else ``<home>/spotwise.db``; ``postgresql://`` means psycopg 3."""
    raw = settings.DB.raw()
    if not raw:
        return sa.URL.create("sqlite", database=str(home / DB_FILE))
    try:
        url = sa.make_url(raw)
    except sa.exc.ArgumentError:
        # the value itself is not echoed: it may hold a password
        raise ConfigError(
            f"{settings.DB.name} is not a database URL", hint=f"use {_URL_FORMS}"
        ) from None
    backend, driver = url.get_backend_name(), url.get_driver_name()
    if backend == "postgresql" and driver in ("psycopg2", "psycopg", ""):
        return url.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and url.database not in (None, "", ":memory:"):
        return url
    raise ConfigError(
        f"{settings.DB.name} names a database spotwise cannot keep jobs in: {shown(url)}",
        hint=f"use {_URL_FORMS}",
    )


def shown(url: sa.URL) -> str:
    """The URL for messages, in the form the docs give it (``postgresql://``), never with
    the password."""
    return url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)


def open_engine(url: sa.URL) -> sa.Engine:
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(Path(str(url.database)))
    require("psycopg", "postgres", f"the PostgreSQL job store ({settings.DB.name}={shown(url)})")
    engine = sa.create_engine(
        url,
        pool_pre_ping=True,
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_S}s'")
        dbapi_connection.commit()

    return engine


@contextlib.contextmanager
def opening(url: sa.URL) -> Iterator[None]:
    """Held while a store opens a SQLite database (first connection, WAL switch, migration):
    one opener at a time, across threads and processes. SQLite answers "database is locked" at
    once, without its busy timeout, to a connection that finds another switching a fresh file
    to WAL (3 of 30 rounds of 6 stores opened together failed so); PostgreSQL needs nothing
    (its migrations take an advisory lock)."""
    if url.get_backend_name() != "sqlite" or not url.database:
        yield
        return
    fd = os.open(f"{url.database}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing the file releases the lock)


def _sqlite_engine(path: Path) -> sa.Engine:
    """WAL (readers never wait for a writer), a busy timeout for the other controllers, and
    transactions that begin as SQLAlchemy says (the sqlite3 module's own are switched off);
    its writes go through :func:`writer`."""
    private_file(path)
    engine = sa.create_engine(
        sa.URL.create("sqlite", database=str(path)),
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
    )
    _WRITERS_LOCK[engine] = threading.Lock()

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    return engine


# SQLite engine -> the lock its process's writers queue on (none on PostgreSQL)
_WRITERS_LOCK: weakref.WeakKeyDictionary[sa.Engine, threading.Lock] = weakref.WeakKeyDictionary()


class Writer:
    """Transactions that write, on an engine of :func:`open_engine`.

    On SQLite the write lock is taken at ``BEGIN IMMEDIATE``, so that a read-then-write
    transaction never fails half-way with "database is locked", and the writers of this process
    queue on a lock of their own first: SQLite's busy handler makes a writer that finds the
    database locked sleep and retry, up to 100 ms a try, so a server's threads writing at once
    (a thousand jobs' ticks) waited seconds for a lock held for a millisecond (measured: ``BEGIN
    IMMEDIATE`` took 0.24 s on average with 200 jobs driven). The lock hands the database over
    as soon as the holder's connection is back in the pool; the busy timeout still orders this
    process and the others. (Not an engine event: a connection event makes SQLAlchemy dispatch
    events around every statement, reads included: 8% of a server's CPU with 200 jobs.)"""

    def __init__(self, engine: sa.Engine, via: sa.Engine | None = None) -> None:
        self._engine = via if via is not None else engine
        self._lock = _WRITERS_LOCK.get(engine)

    @contextlib.contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        if self._lock is None:
            with self._engine.begin() as db:
                yield db
            return
        if not self._lock.acquire(timeout=BUSY_TIMEOUT_S):
            raise sqlite3.OperationalError("database is locked (by this process's writers)")
        try:
            with self._engine.begin() as db:
                db.connection.driver_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
                yield db
        finally:  # (the connection is back in the pool: committed or rolled back)
            self._lock.release()


def private_dir(path: Path) -> None:
    """Create ``path`` 0700, or take group and other access away from the one there."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path, 0o700)


def private_file(path: Path) -> None:
    """Create the database file 0600 before SQLite does (its WAL and SHM files copy the
    database's mode) and take group and other access away from any written before.

    An existing file is never opened here: closing any descriptor of it drops every POSIX lock
    this process holds on it, including those of a store already open in this process, and then
    another process closing the database deletes the WAL that store is still appending to (its
    later commits lost)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for p in (path, *(path.with_name(path.name + s) for s in _SQLITE_SIDE_FILES)):
        _tighten(p, 0o600)


def _tighten(path: Path, mode: int) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    # a shared sticky directory such as /tmp given as SPOTWISE_HOME is not ours to close
    if st.st_uid != os.getuid() or st.st_mode & stat.S_ISVTX:
        return
    if stat.S_IMODE(st.st_mode) & ~mode:
        os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
