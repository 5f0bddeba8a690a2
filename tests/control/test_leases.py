"""Job leases on SQLite and PostgreSQL: taken over only once expired, with a higher token; a
controller fenced by a stale lease can neither launch nor terminate a machine."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from spotwise.control.controller import Controller
from spotwise.control.providers.process import lock_held
from spotwise.control.store import JobState, Store
from spotwise.control.store.leases import LeaseLost
from spotwise.control.submission import submit

from .conftest import make_spec

LONG_S = 600.0  # a lease that outlasts the test however loaded the machine (nobody renews it)


def _kinds(store: Store, job_id: str, kind: str) -> list[str]:
    return [e["message"] for e in store.events(job_id) if e["kind"] == kind]


def test_a_lease_is_taken_over_only_after_it_expires_and_with_a_higher_token(store_db):
    store = Store()
    job = store.create_job("leased", {}, None)
    a = store.leases.acquire(job.id, "replica-a", 1.0)
    assert a is not None and a.token == 1
    assert store.leases.acquire(job.id, "replica-b", 1.0) is None  # held
    before_renewal = time.time()
    assert store.leases.renew("replica-a", [job.id], 1.0) == {job.id}
    while (b := store.leases.acquire(job.id, "replica-b", 30.0)) is None:
        assert time.time() < before_renewal + 30, "the lapsed lease was never taken over"
        time.sleep(0.02)
    taken_after = time.time() - before_renewal
    assert taken_after >= 1.0 - 0.01, taken_after  # (julianday('now') has ms resolution)
    assert b.token == 2 and store.job(job.id).lease_owner == "replica-b"

    assert store.leases.renew("replica-a", [job.id], 30.0) == set()  # a learns it lost it
    with pytest.raises(LeaseLost, match="no longer holds its lease"):
        store.event(job.id, "launch", "by a", guard=a)
    store.event(job.id, "launch", "by b", guard=b)
    assert _kinds(store, job.id, "launch") == ["by b"]  # the refused record was rolled back
    with pytest.raises(LeaseLost):  # b's own lease, with less left than the margin asked
        store.event(job.id, "launch", "late", guard=dataclasses.replace(b, margin_s=60.0))

    store.leases.release(a)  # a stale release changes nothing
    assert store.job(job.id).lease_owner == "replica-b"
    store.leases.release(b)
    assert job.id in store.leases.adoptable()
    again = store.leases.acquire(job.id, "replica-b", 30.0)  # at once after a release
    assert again is not None and again.token == 3
    with pytest.raises(LeaseLost):  # the same owner's older token is stale too
        store.event(job.id, "launch", "old token", guard=b)
    assert job.id not in store.leases.adoptable()

    store.leases.release(again)
    store.update_job(job.id, state=JobState.SUCCEEDED)
    assert store.leases.acquire(job.id, "replica-a", 30.0) is None  # an ended job is never leased
    assert store.leases.adoptable() == []


def test_a_stale_fence_can_neither_launch_nor_terminate(store_db, tmp_path: Path):
    """Replica a's controller wakes up after b took the job over: its launch is refused before
    any attempt or machine exists, and so is its terminate of the machine b launched."""
    store = Store()
    job = submit(store, make_spec(tmp_path, command="sleep 60"))
    a = store.leases.acquire(job.id, "replica-a", LONG_S)
    assert a is not None
    store.leases.release(a)  # (as good as expired: the fence checks owner and token)
    b = store.leases.acquire(job.id, "replica-b", LONG_S)
    assert b is not None and b.token == a.token + 1
    stale = Controller(store, job.id, fence=a)
    owner = Controller(store, job.id, fence=b)

    with pytest.raises(LeaseLost):
        stale.tick()
    assert store.attempts(job.id) == [] and _kinds(store, job.id, "launch") == []

    deadline = time.time() + 60
    while store.job(job.id).state is not JobState.RUNNING:
        assert owner.tick() is None and time.time() < deadline
        time.sleep(0.05)
    [attempt] = store.attempts(job.id)
    assert _kinds(store, job.id, "launch") == ["attempt 1: launching"]
    machine = Path(attempt.handle["dir"]) / "lock"
    assert lock_held(machine)

    store.request_cancel(job.id)
    with pytest.raises(LeaseLost):
        stale.tick()
    assert lock_held(machine) and _kinds(store, job.id, "terminate") == []  # left to b

    while (state := owner.tick()) is None:  # b cancels it: its terminate passes the fence
        assert time.time() < deadline
        time.sleep(0.05)
    assert state is JobState.CANCELLED and not lock_held(machine)
    assert _kinds(store, job.id, "terminate") == [f"attempt 1: terminating {attempt.handle['id']}"]
