"""The lease rule that the work-splitting boards share: batch shards and sweep trials.

A lease grants one piece of work (a key: a shard, a trial) to one holder until a wall-clock
expiry, under a token unique to that grant. Anyone may take it when nobody holds it or its
expiry has passed (the holder died, or handed it back by expiring it now); only the grant's own
token renews it, and only while it is still live: a lapsed lease may already be someone else's,
and renewing it would take it back from them. These are pure decisions on the lease as the board
stored it and a ``now`` from an injected clock; each board applies them inside its own atomic
step (a SQLite write transaction, a conditional object-store write, a conditional SQL
``UPDATE`` whose ``WHERE`` spells the same rule), which is where storage stays.

The server's job leases (:mod:`spotwise.control.store.leases`) are another thing and do not use
this: their expiry is the database's clock (replicas' clocks need not agree), their token is a
counter that rises with each take-over (a fence that orders grants, not a random name), and a
replica renews its lapsed lease as long as no other took it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace

Clock = Callable[[], float]  # wall-clock seconds (time.time); workers' clocks must agree


@dataclass(frozen=True)
class Lease:
    key: int  # the work it grants: a shard number, a trial id
    holder: str  # who holds it: worker name, host and pid
    token: str  # unique per grant: a renewal under anyone else's token fails
    expires_at: float  # wall-clock seconds
    etag: str = ""  # the object store's version of the stored lease (object-store boards only)


def granted(key: int, holder: str, now: float, ttl_s: float) -> Lease:
    """A new grant of ``key`` to ``holder`` for ``ttl_s`` from ``now``, under a fresh token."""
    return Lease(key, holder, secrets.token_hex(8), now + ttl_s)


def can_take(expires_at: float | None, now: float) -> bool:
    """Whether a lease stored with this expiry (None: no lease stored) may be granted anew."""
    return expires_at is None or expires_at <= now


def renewed(lease: Lease, stored: Lease | None, now: float, ttl_s: float) -> Lease | None:
    """``lease`` extended to ``ttl_s`` from ``now`` if the board still stores this very grant,
    live; else None: it was lost (taken over, or lapsed and so takeable)."""
    if stored is None or stored.token != lease.token or can_take(stored.expires_at, now):
        return None
    return replace(lease, expires_at=now + ttl_s)
