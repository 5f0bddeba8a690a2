"""The Provider protocol: launch / status / terminate one attempt, plus features as data.

A provider knows machines, not jobs: the controller decides what to run and where, the provider
only carries it out and reports back in these plain values. Vendor failures are translated into
``ProviderError`` subclasses here at the edge: ``TransientProviderError`` (retry, never a
preemption), ``ProviderUnavailableError`` (daemon down, command missing) and ``CapacityError``
(no machine of that kind right now).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Placement:
    market: str  # "spot" | "on-demand"
    zone: str = ""


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a provider needs to start attempt ``n`` of a job."""

    job_id: str
    n: int
    argv: tuple[str, ...]
    workdir: Path
    env: dict[str, str]
    log_path: Path
    attempt_dir: Path
    placement: Placement
    grace_s: float = 30.0

    @property
    def key(self) -> str:
        """A name unique to this attempt, used to find it again after a controller crash."""
        return f"spotwise-{self.job_id}-{self.n}"


class Phase(str, enum.Enum):
    STARTING = "starting"  # provisioning / queued: billed (cloud) but not training yet
    RUNNING = "running"
    EXITED = "exited"  # the command ended with ``exit_code``
    LOST = "lost"  # the machine went away (killed, vanished) with no exit code


@dataclass(frozen=True)
class AttemptStatus:
    phase: Phase
    exit_code: int | None = None
    ended_at: float | None = None  # wall time, when the provider knows it
    running_at: float | None = None
    restarts: int = 0  # times the provider relaunched it by itself (SLURM requeue)
    detail: str = ""


@dataclass(frozen=True)
class Pricing:
    """What one attempt costs: ``usd_per_hour`` over billed hours = wall seconds x time_scale."""

    usd_per_hour: float = 0.0
    ondemand_usd_per_hour: float = 0.0
    time_scale: float = 1.0
    # False when the provider knows this placement has no capacity right now (the sim's trace);
    # True when it has some or cannot tell (a cloud: only a launch finds out)
    available: bool = True


@dataclass(frozen=True)
class Features:
    spot: bool = False  # can run on an interruptible market
    self_requeue: bool = False  # relaunches a preempted attempt itself (SLURM --requeue)
    zones: tuple[str, ...] = field(default_factory=tuple)
    poll_s: float = 0.1  # how often the controller should ask for status
    grace_s: float = 30.0  # notice-to-kill time the training process gets (SPOTWISE_GRACE_S)


Handle = dict[str, Any]  # JSON-serializable, stored with the attempt


@runtime_checkable
class Provider(Protocol):
    name: str
    features: Features

    def check(self) -> None:
        """Raise ``ProviderUnavailableError`` when the provider cannot be reached at all."""

    def pricing(self, placement: Placement) -> Pricing: ...

    def launch(self, req: LaunchRequest) -> Handle: ...

    def find(self, req: LaunchRequest) -> Handle | None:
        """The handle of attempt ``req`` if it was launched (a crash may have lost it)."""

    def status(self, handle: Handle) -> AttemptStatus: ...

    def terminate(self, handle: Handle) -> None:
        """Stop the attempt (notice first, so it can save) and free its machine; idempotent."""
