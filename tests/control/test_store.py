from __future__ import annotations

import pytest

from spotwise.control.store import JobState, Store
from spotwise.errors import ControlError, JobNotFoundError


def test_jobs_attempts_and_events_persist_across_connections():
    store = Store()
    job = store.create_job("demo", {"command": ["x"]}, None, now=100.0)
    a = store.open_attempt(
        job.id,
        provider="sim",
        market="spot",
        zone="z1",
        usd_per_hour=1.0,
        ondemand_usd_per_hour=3.0,
        time_scale=600.0,
        now=100.0,
    )
    store.update_job(job.id, state=JobState.RUNNING, message="go")
    store.close()
    again = Store()
    assert again.job(job.id).state is JobState.RUNNING
    assert again.job(job.id[:8]).id == job.id  # unique prefix
    [attempt] = again.attempts(job.id)
    assert (attempt.n, attempt.state, attempt.handle) == (a.n, "launching", None)
    # billed from launch: 6 wall seconds x 600 = 1 simulated hour
    assert attempt.cost_usd(106.0) == pytest.approx(1.0)
    assert attempt.ondemand_cost_usd(106.0) == pytest.approx(3.0)
    kinds = [e["kind"] for e in again.events(job.id)]
    assert kinds[:2] == ["created", "attempt"]


def test_never_two_open_attempts():
    store = Store()
    job = store.create_job("demo", {}, None)
    store.open_attempt(
        job.id,
        provider="local",
        market="on-demand",
        zone="",
        usd_per_hour=0,
        ondemand_usd_per_hour=0,
        time_scale=1,
    )
    with pytest.raises(ControlError, match="already has attempt 1 open"):
        store.open_attempt(
            job.id,
            provider="local",
            market="on-demand",
            zone="",
            usd_per_hour=0,
            ondemand_usd_per_hour=0,
            time_scale=1,
        )


def test_unknown_job():
    with pytest.raises(JobNotFoundError, match="spotwise jobs"):
        Store().job("nope")
