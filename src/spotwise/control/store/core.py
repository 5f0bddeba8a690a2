"""The store's one interface: jobs, attempts and events, each method one short transaction.

The database is the controller's memory: every state change is written before it is acted on,
so a controller killed at any instant finds, on restart, exactly what it was doing. Several
controllers and the dashboard share one database; SQLite serialises writers (``BEGIN
IMMEDIATE``), PostgreSQL locks the job's row where a write depends on what was read.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from spotwise.control.ids import CANDIDATES_SHOWN, could_name_a_job, one_id, quoted
from spotwise.control.store.accounts import Accounts
from spotwise.control.store.engine import (
    Writer,
    database_url,
    open_engine,
    opening,
    private_dir,
    shown,
)
from spotwise.control.store.leases import Leases
from spotwise.control.store.migrate import ensure_schema
from spotwise.control.store.models import Attempt, Job, JobState, spotwise_home
from spotwise.control.store.schema import attempts, events, jobs
from spotwise.errors import ConfigError, ControlError, JobNotFoundError

# Checked inside a transaction that records an action on a machine; raises to refuse it (and
# roll the record back): a server's lease is one (leases.py, the fencing of launches).
Guard = Callable[[sa.Connection], None]

# How many fresh ids a new job draws before giving up (one is taken only by chance).
ID_TRIES = 5

# The reads the views repeat (the dashboard polls them), built once.
_ID: sa.BindParameter[str] = sa.bindparam("job_id")
_JOB = sa.select(jobs).where(jobs.c.id == _ID)
_JOBS = sa.select(jobs).order_by(jobs.c.created_at)
_TERMINAL = [s.value for s in JobState if s.terminal]
_UNFINISHED = sa.select(jobs.c.id).where(jobs.c.state.not_in(_TERMINAL))
# A page of a listing is newest first: (created_at, id) descending, which the listing indexes
# keep in order (with or without the owner in front).
_NEWEST_FIRST = (jobs.c.created_at.desc(), jobs.c.id.desc())
_ATTEMPTS = sa.select(attempts).where(attempts.c.job_id == _ID).order_by(attempts.c.n)
_EVENTS = sa.select(events).where(events.c.job_id == _ID).order_by(events.c.id)
# the writes of every tick, built once: a statement built with its values at each call cost more
# CPU than running it (SQLAlchemy coerces each value and keys the statement again), about a
# third of the store's CPU with 200 jobs driven; the values go as parameters instead
_ADD_EVENT = events.insert()
_SET_JOB = jobs.update().where(jobs.c.id == _ID)
_SET_ATTEMPT = attempts.update().where(
    attempts.c.job_id == sa.bindparam("attempt_job"), attempts.c.n == sa.bindparam("attempt_n")
)
# Listing reads many jobs' rows at once, this many ids a query (within every engine's bound
# on parameters, and one query per page rather than per job).
IDS_PER_QUERY = 500
_IDS: sa.BindParameter[list[str]] = sa.bindparam("job_ids", expanding=True)
_ATTEMPTS_OF = (
    sa.select(attempts).where(attempts.c.job_id.in_(_IDS)).order_by(attempts.c.job_id, attempts.c.n)
)
_LAST_OF_KIND = (
    sa.select(events.c.job_id, events.c.data_json)
    .where(events.c.job_id.in_(_IDS), events.c.kind == sa.bindparam("kind"))
    .order_by(events.c.id)
)


def _known(table: sa.Table, values: dict[str, Any]) -> dict[str, Any]:
    """``values``, refused as ``.values()`` refuses them when a name is none of the table's
    columns (given as parameters, SQLAlchemy would ignore it)."""
    unknown = values.keys() - table.c.keys()
    if unknown:
        raise sa.exc.CompileError(f"Unconsumed column names: {', '.join(sorted(unknown))}")
    return values


def _row_job(r: sa.RowMapping) -> Job:
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
        owner=r["owner"],
        lease_owner=r["lease_owner"],
        lease_token=r["lease_token"],
        lease_expires_at=r["lease_expires_at"],
    )


def _row_attempt(r: sa.RowMapping) -> Attempt:
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


def _no_job(job_id: str) -> JobNotFoundError:
    return JobNotFoundError(f"no job {quoted(job_id)}", hint="list jobs with: spotwise jobs")


class Store:
    """Typed access to the job database (``SPOTWISE_DB``, else SQLite in ``SPOTWISE_HOME``),
    opened at its current schema; a database that cannot be opened is refused here, by name."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or spotwise_home()
        url = database_url(self.home)
        self.where = shown(url)
        sqlite = url.get_backend_name() == "sqlite"
        hint = (
            "check SPOTWISE_HOME (or SPOTWISE_DB) and its permissions"
            if sqlite
            else "check SPOTWISE_DB: host, port, user, password and database name, and that"
            " the server accepts connections from this machine"
        )
        try:
            private_dir(self.home)
            self._engine = open_engine(url)
            self._writer = Writer(self._engine)
            with opening(url):
                ensure_schema(self._engine, self.where)
        except (sa.exc.SQLAlchemyError, OSError) as exc:
            raise ControlError(
                f"cannot open the job database {self.where}: {_reason(exc, url)}", hint=hint
            ) from None
        self.accounts = Accounts(self._engine, self._writer)
        self.leases = Leases(self._engine, self._writer)

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        with self._writer.begin() as db:
            yield db

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        with self._engine.connect() as db:
            yield db

    # --- jobs ------------------------------------------------------------------------------
    def create_job(
        self,
        name: str,
        spec: dict[str, Any],
        spec_path: str | None,
        now: float | None = None,
        owner: str | None = None,
    ) -> Job:
        now = time.time() if now is None else now
        for tries_left in reversed(range(ID_TRIES)):
            # (6 random hex digits: among 10,000 jobs of one name, a few ids are drawn twice)
            job_id = f"{name[:24]}-{secrets.token_hex(3)}"
            try:
                with self._tx() as db:
                    db.execute(
                        jobs.insert().values(
                            id=job_id,
                            name=name,
                            spec_json=json.dumps(spec),
                            spec_path=spec_path,
                            state=JobState.PENDING.value,
                            created_at=now,
                            updated_at=now,
                            owner=owner,
                        )
                    )
                    self._event(db, job_id, now, "created", f"job {job_id} created")
                break
            except sa.exc.IntegrityError:
                if not tries_left:
                    raise
        job = self.job(job_id)
        job.dir.mkdir(parents=True, exist_ok=True)
        return job

    def job(self, job_id: str) -> Job:
        """The job with exactly this id, else the one job whose id starts with it (the text
        typed is never a pattern); several such jobs are refused, with their ids."""
        if not could_name_a_job(job_id):
            raise _no_job(job_id)
        with self._read() as db:
            row = db.execute(_JOB, {"job_id": job_id}).mappings().first()
            if row is None:
                ids = (
                    db.execute(
                        sa.select(jobs.c.id)
                        .where(jobs.c.id.startswith(job_id, autoescape=True))
                        .order_by(jobs.c.created_at.desc())
                        .limit(CANDIDATES_SHOWN + 1)
                    )
                    .scalars()
                    .all()
                )
                found = one_id(job_id, ids)
                if found is None:
                    raise _no_job(job_id)
                row = db.execute(_JOB, {"job_id": found}).mappings().one()
        return _row_job(row)

    def jobs(self) -> list[Job]:
        with self._read() as db:
            rows = db.execute(_JOBS).mappings().all()
        return [_row_job(r) for r in rows]

    def unfinished_ids(self) -> list[str]:
        """The ids of the jobs that have not ended (what a server drives), without reading
        their rows."""
        with self._read() as db:
            return list(db.execute(_UNFINISHED).scalars())

    def job_page(
        self,
        limit: int,
        *,
        cursor: str | None = None,
        owner: str | None = None,
        states: Sequence[JobState] = (),
        id_prefix: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """Up to ``limit`` jobs, newest first, after ``cursor`` (the one a previous page
        returned), only ``owner``'s when given, only in ``states`` when given and only those
        whose ids start with ``id_prefix`` (as text) when given; with the cursor of the next
        page (None: this was the last). The filters are the query's own, so a page never holds
        a job it should not, and a cursor stays valid while jobs are added (they come before
        it) or change state."""
        query = sa.select(jobs)
        if owner is not None:
            query = query.where(jobs.c.owner == owner)
        if id_prefix is not None:
            query = query.where(jobs.c.id.startswith(id_prefix, autoescape=True))
        if states:
            query = query.where(jobs.c.state.in_([s.value for s in states]))
        if cursor is not None:
            created_at, job_id = _parse_cursor(cursor)
            query = query.where(
                sa.or_(
                    jobs.c.created_at < created_at,
                    sa.and_(jobs.c.created_at == created_at, jobs.c.id < job_id),
                )
            )
        with self._read() as db:
            rows = db.execute(query.order_by(*_NEWEST_FIRST).limit(limit + 1)).mappings().all()
        page = [_row_job(r) for r in rows[:limit]]
        more = len(rows) > limit
        return page, _cursor(page[-1]) if more and page else None

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
        with self._tx() as db:
            db.execute(_SET_JOB, {**_known(jobs, cols), "job_id": job_id})
            if event is not None:
                self._event(db, job_id, now, *event)

    def request_cancel(self, job_id: str) -> None:
        self.update_job(job_id, cancel_requested=1, event=("cancel", "cancel requested"))

    # --- attempts ----------------------------------------------------------------------------
    def attempts(self, job_id: str) -> list[Attempt]:
        with self._read() as db:
            rows = db.execute(_ATTEMPTS, {"job_id": job_id}).mappings().all()
        return [_row_attempt(r) for r in rows]

    def attempts_by_job(self, job_ids: Sequence[str]) -> dict[str, list[Attempt]]:
        """Every listed job's attempts (in order; ``[]`` for a job without one), a few queries
        for all of them: what a listing of many jobs reads."""
        found: dict[str, list[Attempt]] = {job_id: [] for job_id in job_ids}
        with self._read() as db:
            for chunk in _chunks(job_ids):
                for r in db.execute(_ATTEMPTS_OF, {"job_ids": chunk}).mappings():
                    found[r["job_id"]].append(_row_attempt(r))
        return found

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
        guard: Guard | None = None,
    ) -> Attempt:
        """Record an attempt *before* launching it, so a crash can never leave one unknown
        (and only if ``guard`` passes, in the same transaction)."""
        now = time.time() if now is None else now
        with self._tx() as db:
            # the job's row lock orders two controllers of one job on PostgreSQL
            db.execute(sa.select(jobs.c.id).where(jobs.c.id == job_id).with_for_update())
            if guard is not None:
                guard(db)
            of_job = attempts.c.job_id == job_id
            n = int(
                db.execute(
                    sa.select(sa.func.coalesce(sa.func.max(attempts.c.n), 0) + 1).where(of_job)
                ).scalar_one()
            )
            open_ = db.execute(
                sa.select(attempts.c.n).where(of_job, attempts.c.state != "ended")
            ).first()
            if open_ is not None:
                raise ControlError(f"job {job_id} already has attempt {open_[0]} open")
            db.execute(
                attempts.insert().values(
                    job_id=job_id,
                    n=n,
                    state="launching",
                    provider=provider,
                    market=market,
                    zone=zone,
                    handle_json=json.dumps(handle) if handle else None,
                    started_at=now,
                    usd_per_hour=usd_per_hour,
                    ondemand_usd_per_hour=ondemand_usd_per_hour,
                    time_scale=time_scale,
                )
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
        with self._tx() as db:
            db.execute(
                attempts.delete().where(
                    attempts.c.job_id == job_id, attempts.c.n == n, attempts.c.state == "launching"
                )
            )
            self._event(db, job_id, time.time(), "launch-refused", reason, {"n": n})

    def update_attempt(self, job_id: str, n: int, **fields: Any) -> None:
        if "handle" in fields:
            fields["handle_json"] = json.dumps(fields.pop("handle"))
        with self._tx() as db:
            db.execute(
                _SET_ATTEMPT, {**_known(attempts, fields), "attempt_job": job_id, "attempt_n": n}
            )

    # --- events ----------------------------------------------------------------------------
    def _event(
        self,
        db: sa.Connection,
        job_id: str,
        at: float,
        kind: str,
        message: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        db.execute(
            _ADD_EVENT,
            {
                "job_id": job_id,
                "at": at,
                "kind": kind,
                "message": message,
                "data_json": json.dumps(data or {}),
            },
        )

    def event(
        self,
        job_id: str,
        kind: str,
        message: str,
        data: dict[str, Any] | None = None,
        now: float | None = None,
        guard: Guard | None = None,
    ) -> None:
        """Log one event (only if ``guard`` passes, in the same transaction)."""
        with self._tx() as db:
            if guard is not None:
                guard(db)
            self._event(db, job_id, time.time() if now is None else now, kind, message, data)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        with self._read() as db:
            rows = db.execute(_EVENTS, {"job_id": job_id}).mappings().all()
        return [
            {
                "at": r["at"],
                "kind": r["kind"],
                "message": r["message"],
                "data": json.loads(r["data_json"]),
            }
            for r in rows
        ]

    def last_event_data(self, job_ids: Sequence[str], kind: str) -> dict[str, dict[str, Any]]:
        """The data of each listed job's latest event of ``kind`` (jobs without one are absent),
        a few queries for all of them."""
        found: dict[str, dict[str, Any]] = {}
        with self._read() as db:
            for chunk in _chunks(job_ids):
                for r in db.execute(_LAST_OF_KIND, {"job_ids": chunk, "kind": kind}).mappings():
                    found[r["job_id"]] = json.loads(r["data_json"])
        return found


def _cursor(job: Job) -> str:
    """Where the next page starts: after this job (opaque to callers; exact float text)."""
    raw = json.dumps([repr(job.created_at), job.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _parse_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, job_id = json.loads(raw)
        return float(created_at), str(job_id)
    except (ValueError, TypeError):
        raise ConfigError(
            f"cursor {quoted(cursor)} is not one a listing gave",
            hint="pass the 'next' cursor of the previous page as it came, or none for the first",
        ) from None


def _chunks(job_ids: Sequence[str]) -> Iterator[list[str]]:
    unique = list(dict.fromkeys(job_ids))  # (an id listed twice is read once)
    for start in range(0, len(unique), IDS_PER_QUERY):
        yield unique[start : start + IDS_PER_QUERY]


def _reason(exc: BaseException, url: sa.URL) -> str:
    """The driver's own words, first line, without SQLAlchemy's wrapping or the password."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    text = lines[0] if lines else type(orig).__name__
    return text.replace(url.password, "***") if url.password else text
