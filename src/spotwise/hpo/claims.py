"""Who is working on which trial: a lease per trial, in the study's own database.

Optuna's heartbeat machinery answers a stale trial by failing it (and
``RetryHeartbeatStaleTrialCallback`` re-creates it under a new number): the study then holds a
FAIL and a second number for one piece of work, and the trial's intermediate values live on a
copy. spotwise keeps the trial itself: every running trial has a lease (holder, token, expiry)
that its worker renews while it trains -- the heartbeat -- and once the lease has expired
another worker takes it over with one conditional UPDATE, so exactly one worker continues the
trial (same number, same params, same intermediate values) from its checkpoint. The table sits
beside Optuna's in any SQLAlchemy database (SQLite file, PostgreSQL...).

The rule is the batch boards' (:mod:`spotwise.leases`): a trial is taken when its lease expired,
renewed only under its own token while live, handed back by expiring it now. Here each decision
is the ``WHERE`` of one conditional ``UPDATE``, which the database applies atomically (a read and
then a write would let two workers both take a trial under PostgreSQL's READ COMMITTED).
"""

from __future__ import annotations

import time

from spotwise.leases import Clock, granted
from spotwise.registry import require

TABLE = "spotwise_trial_leases"
# the row of the lease on starting a trial (no Optuna trial id is negative): one worker at a time
# asks the study for its next trial, so concurrent asks never make one trial too many
CREATING = -1


class TrialLeases:
    def __init__(self, url: str, *, clock: Clock = time.time) -> None:
        sa = require("sqlalchemy", "hpo", "resumable sweeps")
        self._sa = sa
        self.clock = clock
        self.engine = sa.create_engine(url)
        meta = sa.MetaData()
        self.table = sa.Table(
            TABLE, meta,
            sa.Column("trial_id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("holder", sa.String(200), nullable=False),
            sa.Column("token", sa.String(32), nullable=False),
            sa.Column("expires_at", sa.Float, nullable=False),
        )  # fmt: skip
        try:
            meta.create_all(self.engine)
        except sa.exc.DatabaseError:
            # another worker created it between create_all's check and its CREATE
            if not sa.inspect(self.engine).has_table(TABLE):
                raise

    def take(self, trial_id: int, holder: str, ttl_s: float, *, new: bool = False) -> str | None:
        """Lease ``trial_id``; ``new`` for a trial this worker just created (no lease yet). A
        live lease of another worker is never taken. Returns the lease token, or None."""
        sa, t = self._sa, self.table
        now = self.clock()
        lease = granted(trial_id, holder, now, ttl_s)
        row = {"holder": holder, "token": lease.token, "expires_at": lease.expires_at}
        with self.engine.begin() as db:
            if new:
                try:
                    db.execute(t.insert().values(trial_id=trial_id, **row))
                except sa.exc.IntegrityError:
                    return None
                return lease.token
            changed = db.execute(  # can_take: the stored lease expired
                t.update().where(t.c.trial_id == trial_id, t.c.expires_at <= now).values(**row)
            ).rowcount
        return lease.token if changed == 1 else None

    def take_creation(self, holder: str, ttl_s: float) -> str | None:
        """The lease on starting a trial (row ``CREATING``): made by the first worker that
        asks, then taken once its holder handed it back or let it expire."""
        return self.take(CREATING, holder, ttl_s, new=True) or self.take(CREATING, holder, ttl_s)

    def renew(self, trial_id: int, token: str, ttl_s: float) -> bool:
        """Extend our lease (the heartbeat); False if it expired and was taken over."""
        t = self.table
        now = self.clock()
        with self.engine.begin() as db:
            changed = db.execute(  # renewed: still this grant, still live
                t.update()
                .where(t.c.trial_id == trial_id, t.c.token == token, t.c.expires_at > now)
                .values(expires_at=now + ttl_s)
            ).rowcount
        return bool(changed == 1)

    def release(self, trial_id: int, token: str) -> None:
        """Hand the trial back now (a notice came): the next worker need not wait for expiry."""
        t = self.table
        with self.engine.begin() as db:
            db.execute(
                t.update()
                .where(t.c.trial_id == trial_id, t.c.token == token)
                .values(expires_at=self.clock())
            )

    def holders(self) -> dict[int, tuple[str, float]]:
        """trial id -> (holder, expires_at) of every trial's lease."""
        t = self.table
        with self.engine.connect() as db:
            rows = db.execute(
                self._sa.select(t.c.trial_id, t.c.holder, t.c.expires_at).where(
                    t.c.trial_id != CREATING
                )
            ).all()
        return {int(r[0]): (str(r[1]), float(r[2])) for r in rows}

    def close(self) -> None:
        self.engine.dispose()
