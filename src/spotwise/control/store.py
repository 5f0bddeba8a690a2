"""Jobs, attempts and events in SQLite under ``$SPOTWISE_HOME`` (default ``~/.spotwise``).

The database is the controller's memory: every state change is written before it is acted on,
so a controller killed at any instant finds, on restart, exactly what it was doing.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from spotwise.errors import ControlError, JobNotFoundError


class JobState(str, Enum):
    PENDING = "PENDING"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def spotwise_home() -> Path:
    return Path(os.environ.get("SPOTWISE_HOME") or Path.home() / ".spotwise").expanduser()


_SCHEMA = """
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
# Columns added after the first release: (table, column, declaration), added to older databases.
_ADDED = (("jobs", "policy_json", "TEXT"),)


@dataclass
class Attempt:
    """One placement of a job on one machine; cost accrues from launch to end."""

    job_id: str
    n: int
    state: str  # launching | running | ended
    provider: str
    market: str
    zone: str
    handle: dict[str, Any] | None
    started_at: float
    running_at: float | None
    ended_at: float | None
    reason: str | None
    exit_code: int | None
    usd_per_hour: float
    ondemand_usd_per_hour: float
    time_scale: float

    def billed_h(self, now: float) -> float:
        """Billed machine hours (simulated hours on the sim provider)."""
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.started_at) * self.time_scale / 3600.0

    def cost_usd(self, now: float) -> float:
        return self.billed_h(now) * self.usd_per_hour

    def ondemand_cost_usd(self, now: float) -> float:
        return self.billed_h(now) * self.ondemand_usd_per_hour

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "n": self.n,
            "state": self.state,
            "provider": self.provider,
            "market": self.market,
            "zone": self.zone,
            "start": self.started_at,
            "running_at": self.running_at,
            "end": self.ended_at,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "usd_per_hour": self.usd_per_hour,
            "cost_usd": round(self.cost_usd(now), 6),
            "handle": self.handle,
        }


@dataclass
class Job:
    id: str
    name: str
    spec: dict[str, Any]
    spec_path: str | None
    state: JobState
    created_at: float
    updated_at: float
    cancel_requested: bool
    next_launch_at: float
    errors_used: int
    message: str
    blocked: dict[str, float] = field(default_factory=dict)  # zone -> blocked until (wall)
    control_error_since: float | None = None
    stop_reason: str = ""  # why the controller stops the attempt: cancel | budget | switch
    policy: dict[str, Any] | None = None  # the job's policy driver (PolicyDriver.to_json)

    @property
    def dir(self) -> Path:
        return spotwise_home() / "jobs" / self.id

    @property
    def log_path(self) -> Path:
        return self.dir / "job.log"


def _row_job(r: sqlite3.Row) -> Job:
    return Job(
        id=r["id"],
        name=r["name"],
        spec=json.loads(r["spec_json"]),
        spec_path=r["spec_path"],
        state=JobState(r["state"]),
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        cancel_requested=bool(r["cancel_requested"]),
        next_launch_at=r["next_launch_at"],
        errors_used=r["errors_used"],
        message=r["message"],
        blocked=json.loads(r["blocked_json"]),
        control_error_since=r["control_error_since"],
        stop_reason=r["stop_reason"],
        policy=json.loads(r["policy_json"]) if r["policy_json"] else None,
    )


def _row_attempt(r: sqlite3.Row) -> Attempt:
    return Attempt(
        job_id=r["job_id"],
        n=r["n"],
        state=r["state"],
        provider=r["provider"],
        market=r["market"],
        zone=r["zone"],
        handle=json.loads(r["handle_json"]) if r["handle_json"] else None,
        started_at=r["started_at"],
        running_at=r["running_at"],
        ended_at=r["ended_at"],
        reason=r["reason"],
        exit_code=r["exit_code"],
        usd_per_hour=r["usd_per_hour"],
        ondemand_usd_per_hour=r["ondemand_usd_per_hour"],
        time_scale=r["time_scale"],
    )


class Store:
    """Thin typed access to the database; each method is one short transaction."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or spotwise_home()
        self.home.mkdir(parents=True, exist_ok=True)
        self.path = self.home / "spotwise.db"
        try:
            self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            for table, column, decl in _ADDED:
                have = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    try:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
                    except sqlite3.OperationalError as exc:  # another process just added it
                        if "duplicate column" not in str(exc):
                            raise
        except sqlite3.Error as exc:
            raise ControlError(
                f"cannot open the job database {self.path}: {exc}",
                hint="check SPOTWISE_HOME and its permissions",
            ) from exc

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- jobs ------------------------------------------------------------------------------
    def create_job(
        self, name: str, spec: dict[str, Any], spec_path: str | None, now: float | None = None
    ) -> Job:
        now = time.time() if now is None else now
        job_id = f"{name[:24]}-{secrets.token_hex(3)}"
        with self.tx() as db:
            db.execute(
                "INSERT INTO jobs (id, name, spec_json, spec_path, state, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, name, json.dumps(spec), spec_path, JobState.PENDING.value, now, now),
            )
            self._event(db, job_id, now, "created", f"job {job_id} created")
        job = self.job(job_id)
        job.dir.mkdir(parents=True, exist_ok=True)
        return job

    def job(self, job_id: str) -> Job:
        r = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if r is None:
            rows = self._db.execute(
                "SELECT id FROM jobs WHERE id LIKE ? ORDER BY created_at DESC", (f"{job_id}%",)
            ).fetchall()
            if len(rows) == 1:
                return self.job(rows[0]["id"])
            raise JobNotFoundError(f"no job {job_id!r}", hint="list jobs with: spotwise jobs")
        return _row_job(r)

    def jobs(self) -> list[Job]:
        rows = self._db.execute("SELECT * FROM jobs ORDER BY created_at").fetchall()
        return [_row_job(r) for r in rows]

    def update_job(
        self,
        job_id: str,
        *,
        event: tuple[str, str] | None = None,
        now: float | None = None,
        **fields: Any,
    ) -> None:
        """Change job fields (and log one event) in one transaction."""
        now = time.time() if now is None else now
        cols = {k: (v.value if isinstance(v, Enum) else v) for k, v in fields.items()}
        for name in ("blocked", "policy"):
            if name in cols:
                cols[f"{name}_json"] = json.dumps(cols.pop(name))
        cols["updated_at"] = now
        sets = ", ".join(f"{k} = ?" for k in cols)
        with self.tx() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*cols.values(), job_id))
            if event is not None:
                self._event(db, job_id, now, *event)

    def request_cancel(self, job_id: str) -> None:
        self.update_job(job_id, cancel_requested=1, event=("cancel", "cancel requested"))

    # --- attempts ----------------------------------------------------------------------------
    def attempts(self, job_id: str) -> list[Attempt]:
        rows = self._db.execute(
            "SELECT * FROM attempts WHERE job_id = ? ORDER BY n", (job_id,)
        ).fetchall()
        return [_row_attempt(r) for r in rows]

    def open_attempt(
        self,
        job_id: str,
        *,
        provider: str,
        market: str,
        zone: str,
        usd_per_hour: float,
        ondemand_usd_per_hour: float,
        time_scale: float,
        handle: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> Attempt:
        """Record an attempt *before* launching it, so a crash can never leave one unknown."""
        now = time.time() if now is None else now
        with self.tx() as db:
            row = db.execute(
                "SELECT COALESCE(MAX(n), 0) + 1 FROM attempts WHERE job_id = ?", (job_id,)
            ).fetchone()
            n = int(row[0])
            open_ = db.execute(
                "SELECT n FROM attempts WHERE job_id = ? AND state != 'ended'", (job_id,)
            ).fetchone()
            if open_ is not None:
                raise ControlError(f"job {job_id} already has attempt {open_[0]} open")
            db.execute(
                "INSERT INTO attempts (job_id, n, state, provider, market, zone, handle_json,"
                " started_at, usd_per_hour, ondemand_usd_per_hour, time_scale)"
                " VALUES (?, ?, 'launching', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    n,
                    provider,
                    market,
                    zone,
                    json.dumps(handle) if handle else None,
                    now,
                    usd_per_hour,
                    ondemand_usd_per_hour,
                    time_scale,
                ),
            )
            self._event(
                db,
                job_id,
                now,
                "attempt",
                f"attempt {n}: {market} {zone}".rstrip(),
                {"n": n, "market": market, "zone": zone},
            )
        return self.attempts(job_id)[-1]

    def discard_attempt(self, job_id: str, n: int, reason: str) -> None:
        """Forget an attempt whose launch was refused before anything started (no capacity)."""
        with self.tx() as db:
            db.execute(
                "DELETE FROM attempts WHERE job_id = ? AND n = ? AND state = 'launching'",
                (job_id, n),
            )
            self._event(db, job_id, time.time(), "launch-refused", reason, {"n": n})

    def update_attempt(self, job_id: str, n: int, **fields: Any) -> None:
        if "handle" in fields:
            fields["handle_json"] = json.dumps(fields.pop("handle"))
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.tx() as db:
            db.execute(
                f"UPDATE attempts SET {sets} WHERE job_id = ? AND n = ?",
                (*fields.values(), job_id, n),
            )

    # --- events ----------------------------------------------------------------------------
    def _event(
        self,
        db: sqlite3.Connection,
        job_id: str,
        at: float,
        kind: str,
        message: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        db.execute(
            "INSERT INTO events (job_id, at, kind, message, data_json) VALUES (?,?,?,?,?)",
            (job_id, at, kind, message, json.dumps(data or {})),
        )

    def event(
        self,
        job_id: str,
        kind: str,
        message: str,
        data: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> None:
        with self.tx() as db:
            self._event(db, job_id, time.time() if now is None else now, kind, message, data)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT * FROM events WHERE job_id = ? ORDER BY id", (job_id,)
        ).fetchall()
        return [
            {
                "at": r["at"],
                "kind": r["kind"],
                "message": r["message"],
                "data": json.loads(r["data_json"]),
            }
            for r in rows
        ]
