"""Leases: how several workers split the shards without computing one twice or losing one.

A worker holds a shard only while its lease is live; it renews the lease while it computes and
gives it up (``finish``) once the shard is committed. A worker that dies (SIGKILL, machine taken
away) stops renewing, and once the lease expires any worker may claim the shard again. Two
boards implement the same three operations:

- :class:`SQLiteLeases`: one SQLite file, for workers on one machine (or a shared disk with
  working locks); each claim is one ``BEGIN IMMEDIATE`` transaction.
- :class:`ObjectLeases`: one small object per shard in an object store, claimed with conditional
  writes: ``If-None-Match: *`` creates a lease that does not exist yet, ``If-Match: <etag>``
  takes over an expired one or renews one's own. The store decides who wins; nobody needs a
  server or a lock. Expiry compares wall clocks, so workers' clocks must agree to well within
  the lease time (NTP does this on cloud machines).

Both decide by the rule of :mod:`spotwise.leases` (who may take a shard, whose renewal holds),
on time from an injected ``clock``, so the decisions can be tested without waiting.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from spotwise.errors import ConfigError, StorageError
from spotwise.leases import Clock, Lease, can_take, granted, renewed
from spotwise.registry import Entry, Registry


@runtime_checkable
class LeaseBoard(Protocol):
    def claim(self, holder: str, shards: Sequence[int], ttl_s: float) -> Lease | None:
        """A new lease on the first of ``shards`` that is neither finished nor leased by a live
        lease, or None if there is none right now."""
        ...

    def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        """The lease extended by ``ttl_s`` from now, or None if it was lost (expired and taken)."""
        ...

    def finish(self, lease: Lease) -> None:
        """Mark the shard done: it is never leased again."""
        ...

    def reopen(self, shard: int) -> None:
        """Make a finished shard leasable again (its output was found damaged)."""
        ...


# --- one machine: SQLite --------------------------------------------------------------------
_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
  shard INTEGER PRIMARY KEY, holder TEXT NOT NULL, token TEXT NOT NULL,
  expires_at REAL NOT NULL, done INTEGER NOT NULL DEFAULT 0, grants INTEGER NOT NULL DEFAULT 1
);
"""


class SQLiteLeases:
    """Leases in one SQLite file; every operation is one short write transaction."""

    def __init__(self, path: str | os.PathLike[str], *, clock: Clock = time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # a lease lost to a power cut only means a shard is redone: no fsync per commit
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(
                f"cannot open the lease database {self.path}: {exc}",
                hint="use a writable location for the leases (leases=sqlite:///path/leases.db)",
            ) from exc

    def _write(self, fn: Callable[[sqlite3.Connection], Lease | None]) -> Lease | None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return result
        except sqlite3.Error as exc:
            raise StorageError(f"lease database {self.path}: {exc}") from exc

    def claim(self, holder: str, shards: Sequence[int], ttl_s: float) -> Lease | None:
        def grant(db: sqlite3.Connection) -> Lease | None:
            now = self.clock()
            rows = {r[0]: r[1:] for r in db.execute(
                "SELECT shard, done, expires_at FROM leases WHERE shard >= ? AND shard <= ?",
                (min(shards), max(shards)))} if shards else {}  # fmt: skip
            for shard in shards:
                row = rows.get(shard)
                if row is not None and (row[0] or not can_take(row[1], now)):
                    continue
                lease = granted(shard, holder, now, ttl_s)
                db.execute(
                    "INSERT INTO leases (shard, holder, token, expires_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(shard) DO UPDATE SET holder=excluded.holder, "
                    "token=excluded.token, expires_at=excluded.expires_at, grants=grants+1",
                    (shard, holder, lease.token, lease.expires_at),
                )
                return lease
            return None

        return self._write(grant)

    def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        def extend(db: sqlite3.Connection) -> Lease | None:
            row = db.execute(
                "SELECT holder, token, expires_at FROM leases WHERE shard=? AND done=0",
                (lease.key,),
            ).fetchone()
            stored = None if row is None else Lease(lease.key, *row)
            kept = renewed(lease, stored, self.clock(), ttl_s)
            if kept is not None:  # (the write lock is ours since BEGIN IMMEDIATE)
                db.execute(
                    "UPDATE leases SET expires_at=? WHERE shard=?", (kept.expires_at, lease.key)
                )
            return kept

        return self._write(extend)

    def finish(self, lease: Lease) -> None:
        def mark(db: sqlite3.Connection) -> None:
            db.execute("UPDATE leases SET done=1 WHERE shard=?", (lease.key,))

        self._write(mark)

    def reopen(self, shard: int) -> None:
        def clear(db: sqlite3.Connection) -> None:
            db.execute("UPDATE leases SET done=0, expires_at=0 WHERE shard=?", (shard,))

        self._write(clear)

    def close(self) -> None:
        self._db.close()


# --- many machines: an object store with conditional writes --------------------------------
@runtime_checkable
class ConditionalStore(Protocol):
    """What ObjectLeases needs from an object store (S3Storage has it)."""

    def put_if(self, key: str, data: bytes, *, etag: str | None) -> str | None: ...

    def get_tagged(self, key: str) -> tuple[bytes, str] | None: ...


class ObjectLeases:
    """One lease object per shard (``leases/shard-NNNNNN.json``) changed only by conditional
    writes, so two workers can never both believe they hold the same live lease."""

    def __init__(
        self, store: ConditionalStore, *, prefix: str = "leases/", clock: Clock = time.time
    ) -> None:
        if not isinstance(store, ConditionalStore):
            raise ConfigError(
                f"{getattr(store, 'uri', store)!r} has no conditional writes for leases",
                hint="use an s3://, gs:// or az:// location for multi-machine leases, or "
                "leases=sqlite:///path",
            )
        self.store = store
        self.prefix = prefix
        self.clock = clock

    def _key(self, shard: int) -> str:
        return f"{self.prefix}shard-{shard:06d}.json"

    @staticmethod
    def _body(lease: Lease, done: bool = False) -> bytes:
        return json.dumps(
            {
                "holder": lease.holder,
                "token": lease.token,
                "expires_at": lease.expires_at,
                "done": done,
            }
        ).encode()

    def claim(self, holder: str, shards: Sequence[int], ttl_s: float) -> Lease | None:
        for shard in shards:
            found = self.store.get_tagged(self._key(shard))
            etag: str | None = None
            if found is not None:
                doc = _parse(found[0])
                if doc is not None and (doc[0] or not can_take(doc[1], self.clock())):
                    continue
                etag = found[1]
            lease = granted(shard, holder, self.clock(), ttl_s)
            new_etag = self.store.put_if(self._key(shard), self._body(lease), etag=etag)
            if new_etag is not None:
                return replace(lease, etag=new_etag)
        return None

    def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        # the stored lease is ours as we last wrote it, or the write on its etag fails; a lapsed
        # one is not renewed: someone may hold it already, and the write would steal it back
        kept = renewed(lease, lease, self.clock(), ttl_s)
        if kept is None:
            return None
        etag = self.store.put_if(self._key(lease.key), self._body(kept), etag=lease.etag)
        return None if etag is None else replace(kept, etag=etag)

    def finish(self, lease: Lease) -> None:
        # if the lease was lost meanwhile the new holder finishes it; the ledger decides anyway
        self.store.put_if(self._key(lease.key), self._body(lease, done=True), etag=lease.etag)

    def reopen(self, shard: int) -> None:
        found = self.store.get_tagged(self._key(shard))
        if found is not None:  # an expired, unfinished lease: the next claim takes it over
            opened = Lease(shard, "", "", 0.0)
            self.store.put_if(self._key(shard), self._body(opened), etag=found[1])


def _parse(raw: bytes) -> tuple[bool, float] | None:
    """(done, expires_at) of a lease object."""
    try:
        doc = json.loads(raw)
        return bool(doc["done"]), float(doc["expires_at"])
    except (ValueError, KeyError, TypeError):
        return None  # torn or foreign: treat as expired and take it over


# lease boards by URI scheme; a plain path is a SQLite file
LEASE_BOARDS: Registry[LeaseBoard] = Registry(
    "lease board",
    {
        "sqlite": "spotwise.batch.leases:SQLiteLeases",
        "s3": Entry("spotwise.batch.leases:object_leases", "s3"),
        "gs": Entry("spotwise.batch.leases:object_leases", "gcs"),
        "az": Entry("spotwise.batch.leases:object_leases", "azureblob"),
    },
    group="spotwise.lease_boards",
)


def object_leases(uri: str, *, clock: Clock = time.time) -> ObjectLeases:
    """ObjectLeases on the object store prefix ``uri``."""
    from spotwise.storage import open_storage

    return ObjectLeases(open_storage(uri), prefix="", clock=clock)  # type: ignore[arg-type]


def open_leases(uri: str, *, clock: Clock = time.time) -> LeaseBoard:
    """``sqlite:///path.db`` (SQLAlchemy's spelling: four slashes for an absolute path) or a
    plain path -> SQLiteLeases; ``s3://bucket/prefix`` -> ObjectLeases on that prefix."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else "sqlite"
    if scheme not in LEASE_BOARDS:
        raise ConfigError(
            f"unsupported lease location {uri!r}",
            hint="use sqlite:///path/leases.db or an s3://, gs:// or az://bucket/prefix",
        )
    board = LEASE_BOARDS.load(scheme)
    if scheme == "sqlite":
        return board(uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else uri, clock=clock)
    return board(uri, clock=clock)
