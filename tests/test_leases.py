"""The lease rule the batch boards and the sweep's trial leases share, on an injected clock:
take only what nobody holds live, renew only one's own live grant."""

from __future__ import annotations

from spotwise.leases import Lease, can_take, granted, renewed


def test_a_lease_is_takeable_when_absent_or_expired_never_while_live() -> None:
    lease = granted(3, "w0", now=100.0, ttl_s=10.0)
    assert (lease.key, lease.holder, lease.expires_at) == (3, "w0", 110.0)
    assert can_take(None, 100.0)
    assert not can_take(lease.expires_at, 109.9)
    assert can_take(lease.expires_at, 110.0)  # handed back by expiring it now
    assert granted(3, "w0", 100.0, 10.0).token != lease.token  # a token names one grant


def test_only_the_grants_own_live_lease_is_renewed() -> None:
    mine = granted(1, "w0", now=0.0, ttl_s=10.0)
    assert renewed(mine, mine, now=5.0, ttl_s=10.0) == Lease(1, "w0", mine.token, 15.0)
    assert renewed(mine, mine, now=10.0, ttl_s=10.0) is None, "lapsed: maybe someone's already"
    theirs = granted(1, "w1", now=11.0, ttl_s=10.0)
    assert renewed(mine, theirs, now=12.0, ttl_s=10.0) is None, "taken over"
    assert renewed(mine, None, now=5.0, ttl_s=10.0) is None, "finished or gone"
