"""What the store holds, as plain dataclasses: a job, its attempts, its state; users, tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from spotwise.settings import home as spotwise_home  # where the store's callers find it


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
    owner: str | None = None  # the user who submitted it through the server (None: local)
    lease_owner: str | None = None  # the server replica driving it (None: nobody; leases.py)
    lease_token: int = 0  # its fencing token, raised by every take-over
    lease_expires_at: float = 0.0  # (the database's clock)

    @property
    def dir(self) -> Path:
        return spotwise_home() / "jobs" / self.id

    @property
    def log_path(self) -> Path:
        return self.dir / "job.log"


@dataclass(frozen=True)
class User:
    """Someone who may call ``spotwise server``; ``role`` is admin, user or viewer."""

    name: str
    role: str
    created_at: float
    notify: dict[str, Any] | None = None  # webhooks for all their jobs (job file's notify)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "created_at": self.created_at,
            "notify": self.notify,
        }


@dataclass(frozen=True)
class Token:
    """An API token as listed: who it is for and whether it still works (never its secret)."""

    id: str
    user: str
    name: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None

    def state(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "name": self.name,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "state": self.state(now),
        }
