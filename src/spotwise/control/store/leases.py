"""Job leases: which ``spotwise server`` replica drives each job, until when, and under which
fencing token (``Store.leases``).

A replica drives a job only while it holds the job's lease: ``acquire`` takes a lease nobody
holds or whose expiry has passed, and raises the job's token; ``renew`` extends the leases a
replica still holds; ``release`` gives one back. Each is one conditional ``UPDATE`` (a
compare-and-set on the job's row), so two replicas racing for a job on PostgreSQL (READ
COMMITTED re-checks the condition on the row it waited for) or SQLite (one writer at a time)
never both win. Expiries are the database's own clock, so the replicas' clocks need not agree.

A :class:`Lease` is also the fence of the controller driving under it: called inside the store
transaction that records a launch or a terminate, it refuses (:class:`LeaseLost`, rolling the
record back) unless the lease is still this one and has more than ``margin_s`` left. A replica
that stalled past its expiry and wakes up can therefore never launch or terminate a machine of
a job another replica adopted (whose token is higher), and one that passes has at least
``margin_s`` to make the provider call before anyone else may take the job.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from spotwise.control.store.engine import Writer
from spotwise.control.store.models import JobState
from spotwise.control.store.schema import jobs
from spotwise.errors import ControlError

DEFAULT_LEASE_S = 15.0  # a dead replica's jobs are adopted within this, plus one scan
RENEWALS_PER_LEASE = 3  # renewed every lease/3: two renewals may fail before it lapses
IDS_PER_RENEWAL = 500  # (within every engine's bound on parameters)
_TERMINAL = [s.value for s in JobState if s.terminal]


class LeaseLost(ControlError):
    """This replica no longer holds the job's lease: another may drive it now."""


class _EpochNow(FunctionElement[float]):
    """The database's clock, in seconds since the epoch (the unit of every time column)."""

    type = sa.Float()
    inherit_cache = True


@compiles(_EpochNow)
def _epoch_now_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(_EpochNow, "postgresql")
def _epoch_now_postgresql(element: Any, compiler: Any, **kw: Any) -> str:
    return "CAST(extract(epoch FROM clock_timestamp()) AS double precision)"


def replica_id() -> str:
    """This process's name as a lease owner: the host (a pod's name), the pid, and a random
    suffix (a restarted container keeps its host name and may get the same pid)."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"


# (built once: checked before every launch, terminate and attempt a server records)
_HELD = (
    jobs.update()
    .where(
        jobs.c.id == sa.bindparam("held_job"),
        jobs.c.lease_owner == sa.bindparam("held_by"),
        jobs.c.lease_token == sa.bindparam("held_token"),
        jobs.c.lease_expires_at > _EpochNow() + sa.bindparam("held_margin_s", type_=sa.Float),
    )
    .values(lease_token=jobs.c.lease_token)
)


@dataclass(frozen=True)
class Lease:
    """A job's lease as its holder knows it; calling it on a transaction is the fence."""

    job_id: str
    owner: str
    token: int
    margin_s: float

    def __call__(self, db: sa.Connection) -> None:
        """Refuse the transaction unless this lease still holds, for ``margin_s`` more at least.

        A no-op ``UPDATE`` rather than a read: on PostgreSQL it locks the job's row until the
        transaction ends, so no take-over can commit between the check and the record."""
        held = db.execute(
            _HELD,
            {
                "held_job": self.job_id,
                "held_by": self.owner,
                "held_token": self.token,
                "held_margin_s": self.margin_s,
            },
        ).rowcount
        if held != 1:
            raise LeaseLost(
                f"job {self.job_id}: this server ({self.owner}) no longer holds its lease "
                f"(token {self.token}); another replica drives it"
            )


class Leases:
    """Acquire, renew and release job leases in an open store (one statement each)."""

    def __init__(self, engine: sa.Engine, writer: Writer) -> None:
        self._engine = engine
        # PostgreSQL: each statement commits by itself, so a replica frozen right after one
        # holds no row lock that would hold up another's take-over (SQLite: one host, and
        # BEGIN IMMEDIATE as every write)
        postgres = engine.dialect.name == "postgresql"
        self._writer = (
            Writer(engine, engine.execution_options(isolation_level="AUTOCOMMIT"))
            if postgres
            else writer
        )

    def acquire(self, job_id: str, owner: str, lease_s: float) -> Lease | None:
        """Take the job's lease if nobody holds it or its holder let it expire (the token goes
        up by one); None if another replica holds it, or the job has ended."""
        with self._writer.begin() as db:
            token = db.execute(
                jobs.update()
                .where(
                    jobs.c.id == job_id,
                    jobs.c.state.not_in(_TERMINAL),
                    sa.or_(jobs.c.lease_owner.is_(None), jobs.c.lease_expires_at <= _EpochNow()),
                )
                .values(
                    lease_owner=owner,
                    lease_expires_at=_EpochNow() + lease_s,
                    lease_token=jobs.c.lease_token + 1,
                )
                .returning(jobs.c.lease_token)
            ).scalar()
        if token is None:
            return None
        return Lease(job_id, owner, int(token), margin_s=lease_s / RENEWALS_PER_LEASE)

    def renew(self, owner: str, job_ids: Iterable[str], lease_s: float) -> set[str]:
        """Extend ``owner``'s leases of ``job_ids`` to ``lease_s`` from now; the ids whose lease
        it still held (the others were taken by another replica: drop them). A lease that
        lapsed but that nobody took is still this owner's, token unchanged, and is renewed."""
        ids = list(job_ids)
        renewed: set[str] = set()
        with self._writer.begin() as db:
            for start in range(0, len(ids), IDS_PER_RENEWAL):
                chunk = ids[start : start + IDS_PER_RENEWAL]
                renewed.update(
                    db.execute(
                        jobs.update()
                        .where(jobs.c.lease_owner == owner, jobs.c.id.in_(chunk))
                        .values(lease_expires_at=_EpochNow() + lease_s)
                        .returning(jobs.c.id)
                    ).scalars()
                )
        return renewed

    def release(self, lease: Lease) -> None:
        """Give the lease back (the job's end, or a server stopping): another replica may adopt
        the job at its next scan, without waiting for the expiry."""
        with self._writer.begin() as db:
            db.execute(
                jobs.update()
                .where(
                    jobs.c.id == lease.job_id,
                    jobs.c.lease_owner == lease.owner,
                    jobs.c.lease_token == lease.token,
                )
                .values(lease_owner=None, lease_expires_at=0.0)
            )

    def adoptable(self) -> list[str]:
        """Jobs that have not ended and that no replica holds (never leased, released, or
        expired), oldest first: what a replica's scan tries to acquire."""
        with self._engine.connect() as db:
            return list(
                db.execute(
                    sa.select(jobs.c.id)
                    .where(
                        jobs.c.state.not_in(_TERMINAL),
                        sa.or_(
                            jobs.c.lease_owner.is_(None), jobs.c.lease_expires_at <= _EpochNow()
                        ),
                    )
                    .order_by(jobs.c.created_at)
                ).scalars()
            )
