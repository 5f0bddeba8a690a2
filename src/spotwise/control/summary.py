"""The ``spotwise status --json`` document of a job, and of many at once for a listing."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from typing import Any

from spotwise.control.decisions import Reason
from spotwise.control.ownership import controller_alive
from spotwise.control.store import Attempt, Job, Store


def job_summary(store: Store, job: Job, now: float | None = None) -> dict[str, Any]:
    """The ``spotwise status --json`` document."""
    return job_summaries(store, [job], now)[0]


def job_summaries(
    store: Store, jobs: Sequence[Job], now: float | None = None
) -> list[dict[str, Any]]:
    """``job_summary`` of each job, reading the store a few times for all of them (not per job:
    a listing of thousands of jobs must answer in well under a second)."""
    now = time.time() if now is None else now
    ids = [job.id for job in jobs]
    attempts = store.attempts_by_job(ids)
    placements = store.last_event_data(ids, "placement")
    return [_summary(job, attempts[job.id], placements.get(job.id), now) for job in jobs]


def _shown_spec(stored: dict[str, Any]) -> dict[str, Any]:
    """What a listing shows of a job's stored spec, read as stored (validating 10,000 specs
    would dominate a listing, and a job recorded by an older spotwise must still be listed)."""
    provider = stored.get("provider")
    budget = stored.get("budget_usd")
    return {
        "command": shlex.join(str(w) for w in stored.get("command") or []),
        "provider": provider.get("name") if isinstance(provider, dict) else None,
        "market": stored.get("market"),
        "budget_usd": float(budget) if isinstance(budget, (int, float)) else None,
    }


def _summary(
    job: Job, attempts: list[Attempt], placement: dict[str, Any] | None, now: float
) -> dict[str, Any]:
    shown = _shown_spec(job.spec)
    cost = sum(a.cost_usd(now) for a in attempts)
    ondemand = sum(a.ondemand_cost_usd(now) for a in attempts)
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "message": job.message,
        "command": shown["command"],
        "provider": shown["provider"],
        "market": shown["market"],
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "attempts": [a.as_dict(now) for a in attempts],
        "preemptions": sum(
            a.reason in (Reason.PREEMPTED.value, Reason.LOST.value) for a in attempts
        ),
        "switches": sum(a.reason == Reason.SWITCHED.value for a in attempts),
        "policy": _policy_summary(job.policy),
        "errors": job.errors_used,
        "cost_usd": round(cost, 6),
        "ondemand_cost_usd": round(ondemand, 6),
        "savings_usd": round(ondemand - cost, 6),
        "budget_usd": shown["budget_usd"],
        "log": str(job.log_path),
        "controller_alive": controller_alive(job),
        "placement": placement,  # where the provider chose to run, and why (aws advises one)
    }


def _policy_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job's policy in ``status --json``: name, last boundary decided and its decision."""
    if doc is None:
        return None
    return {
        "name": doc["policy"],
        "tick": doc["tick"],
        "gap_s": doc["gap_s"],
        "zones": doc["zones"],
        "decision": doc["decision"],
    }
