"""A process-free double of the ``sim`` provider on an injected clock, for fast controller tests.

Its market is the sim provider's own trace replay (``SimMarket``); its attempts are records
instead of processes. An attempt pays its changeover (``changeover_s`` wall seconds: boot and
restore) and then trains at one second of work per wall second, committing continuously; spot
is taken away at the trace's next unavailable tick (exit 75, the work so far saved, as the
runtime does on a notice), ``terminate`` stops it at once with exit 75, and it exits 0 when the
job's work is done. With these conventions a live job on it follows the simulator's model
exactly, which is what lets a test compare ``spotwise launch`` with ``spotwise simulate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spotwise.control.progress import Committed
from spotwise.control.providers.base import (
    MARKETS,
    AttemptStatus,
    Features,
    Handle,
    LaunchRequest,
    Phase,
    Prices,
    Pricing,
)
from spotwise.control.providers.sim import SimMarket
from spotwise.control.spec import JobSpec, parse_spec
from spotwise.control.store import Job, Store
from spotwise.errors import CapacityError, TransientProviderError


class Clock:
    """Wall time that moves only when the controller sleeps."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@dataclass
class _Attempt:
    market: str
    zone: str
    start: float
    lost_at: float | None  # spot taken away (wall)
    done_before: float  # committed work (wall s) when it started
    stop_at: float | None = None
    ended: tuple[float, int] | None = None  # (when, exit code)


@dataclass
class ClockSim:
    """``name``/``features``/``prices``/``launch``/``find``/``status``/``terminate``."""

    clock: Clock
    zones: tuple[str, ...]
    available: np.ndarray  # zones x ticks
    gap_s: float  # trace tick
    compression: float  # trace seconds per wall second
    work_s: float  # the job's work, wall seconds
    changeover_s: float  # wall seconds from launch to training
    start_tick: int = 0
    spot_usd_per_hour: float = 0.918
    ondemand_usd_per_hour: float = 3.06
    zone_spot_usd_per_hour: tuple[float, ...] = ()  # per zone, instead of spot_usd_per_hour
    poll_s: float = 0.25
    name: str = "sim"
    outage_at: float = math.inf  # from this wall time, the next `failing` status calls raise
    failing: int = 0
    failure: type[Exception] = TransientProviderError
    status_calls: int = 0
    attempts: dict[str, _Attempt] = field(default_factory=dict)
    market: SimMarket | None = None

    def __post_init__(self) -> None:
        self.features = Features(spot=True, zones=self.zones, poll_s=self.poll_s, grace_s=0.0)

    def bind(self, job: Job) -> None:
        """Start the market at the job's creation, as the sim provider does."""
        self.market = SimMarket(
            self.zones,
            self.available,
            self.gap_s,
            self.compression,
            job.created_at,
            self.start_tick * self.gap_s,
        )

    # --- the Provider protocol ------------------------------------------------------------------
    @property
    def prices(self) -> Prices:
        """Fixed prices (per zone where given); spot capacity from the trace at the
        controller's clock."""
        per_zone = self.zone_spot_usd_per_hour or (self.spot_usd_per_hour,) * len(self.zones)
        spot = dict(zip(self.zones, per_zone, strict=True))

        def pricing(market: str, zone: str) -> Pricing:
            usd = spot[zone] if market == "spot" else self.ondemand_usd_per_hour
            return Pricing(usd, self.ondemand_usd_per_hour, self.compression)

        def capacity(zone: str, at_s: float) -> bool:
            assert self.market is not None
            return self.market.is_available(zone, at_s)

        return Prices({(m, z): pricing(m, z) for m in MARKETS for z in self.zones}, capacity)

    def launch(self, req: LaunchRequest) -> Handle:
        assert self.market is not None
        now, p = self.clock(), req.placement
        lost_at = None
        if p.market == "spot":
            if not self.market.is_available(p.zone, now):
                raise CapacityError(f"no spot capacity in {p.zone}")
            lost_at = self.market.loss_wall(p.zone, now)
        self.attempts[req.key] = _Attempt(p.market, p.zone, now, lost_at, self.committed_work())
        return {"key": req.key, "n": req.n, "id": req.key}

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        """The attempts not yet ended (this double holds one job)."""
        now = self.clock()
        live = []
        for key, a in self.attempts.items():
            self._settle(a, now)
            if a.ended is None:
                live.append({"key": key, "n": int(key.rsplit("-", 1)[1]), "id": key})
        return live

    def status(self, handle: Handle) -> AttemptStatus:
        self.status_calls += 1
        if self.failing > 0 and self.clock() >= self.outage_at:
            self.failing -= 1
            raise self.failure("status timed out")
        a = self.attempts[handle["key"]]
        now = self.clock()
        self._settle(a, now)
        running_at = a.start + self.changeover_s
        if a.ended is not None:
            return AttemptStatus(
                Phase.EXITED, exit_code=a.ended[1], ended_at=a.ended[0], running_at=running_at
            )
        phase = Phase.RUNNING if now >= running_at else Phase.STARTING
        return AttemptStatus(phase, running_at=running_at if phase is Phase.RUNNING else None)

    def terminate(self, handle: Handle) -> None:
        a = self.attempts[handle["key"]]
        if a.stop_at is None:
            a.stop_at = self.clock()

    # --- what the controller reads from the run directory ---------------------------------------
    def _worked(self, a: _Attempt, until: float) -> float:
        return min(max(0.0, until - a.start - self.changeover_s), self.work_s - a.done_before)

    def _settle(self, a: _Attempt, now: float) -> None:
        if a.ended is not None:
            return
        finish = a.start + self.changeover_s + self.work_s - a.done_before
        ends = [(finish, 0), *((t, 75) for t in (a.lost_at, a.stop_at) if t is not None)]
        when, code = min(ends, key=lambda e: (e[0], e[1]))
        if now >= when:
            a.ended = (when, code)

    def committed_work(self) -> float:
        now = self.clock()
        total = 0.0
        for a in self.attempts.values():
            self._settle(a, now)
            total = max(total, a.done_before + self._worked(a, a.ended[0] if a.ended else now))
        return total

    def read_progress(self, checkpoint_dir: str) -> Committed:
        """One step per second of trace time: the committed work, counted as the runtime would."""
        return Committed(round(self.committed_work() * self.compression), self.compression)


def job_for(sim: ClockSim, store: Store, **fields: Any) -> tuple[Job, JobSpec]:
    """A job on ``sim`` created at the clock's time, the policy ticking with the trace."""
    doc: dict[str, Any] = {
        "name": "clock",
        "command": "python train.py",
        "market": "auto",
        "policy": "uniform-progress",
        "provider": "sim",
        "zone_cooldown": 0,
        "steps": round(sim.work_s * sim.compression),
        "expected_runtime": sim.work_s,
        "changeover": sim.changeover_s,
        "decision_interval": sim.gap_s / sim.compression,
        "control_plane_timeout": "1h",
    }
    doc.update(fields)
    spec = parse_spec(doc)
    job = store.create_job(spec.name, spec.model_dump(mode="json"), None, now=sim.clock())
    sim.bind(job)
    return job, spec
