"""``fake``: an in-memory provider for unit tests; attempts are records, not processes.

Its options script what the "cloud" does, so a controller test states the scenario in the job
file: each launch takes the next entry of ``exits`` (an exit code, or ``"lost"`` for a machine
that vanishes) after ``boot_s`` + its ``run_s`` of the injected clock; zones listed in ``full``
refuse spot launches with ``CapacityError``. ``terminate`` behaves like a machine whose training
process saves on the notice: a running attempt ends with exit 75, a booting one is lost.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from spotwise.control.providers.base import (
    MARKETS,
    AttemptStatus,
    Features,
    Handle,
    LaunchRequest,
    Options,
    Phase,
    Prices,
    Pricing,
    parse_options,
)
from spotwise.errors import CapacityError, ProviderError
from spotwise.exitcode import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from spotwise.control.resources import Resources

_IDS = itertools.count(1)


class FakeOptions(Options):
    zones: list[str] = Field(default_factory=lambda: ["fake-a", "fake-b"], min_length=1)
    spot: bool = True
    self_requeue: bool = False
    boot_s: float = Field(default=0.0, ge=0)
    run_s: float | list[float] = 0.0  # one for all attempts, or one per launch
    exits: list[int | Literal["lost"]] = Field(default=[0], min_length=1)
    full: list[str] = Field(default_factory=list)  # zones with no spot capacity
    spot_usd_per_hour: float = Field(default=0.3, ge=0)
    ondemand_usd_per_hour: float = Field(default=1.0, ge=0)
    grace_s: float = Field(default=1.0, ge=0)


@dataclass
class _Machine:
    req: LaunchRequest
    id: str
    launched_at: float
    run_s: float
    outcome: int | Literal["lost"]
    stopped_at: float | None = None


class FakeProvider:
    name = "fake"
    Options = FakeOptions

    def __init__(
        self,
        options: dict[str, Any],
        *,
        epoch: float,
        instance_type: str | None,
        preflight: bool = False,
        resources: Resources | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.opts = parse_options(self.Options, self.name, options)
        unknown = sorted(set(self.opts.full) - set(self.opts.zones))
        if unknown:
            raise ProviderError(f"provider.fake.full: {unknown} are not among the zones")
        zones = tuple(self.opts.zones)
        self.features = Features(
            zones=zones,
            spot=self.opts.spot,
            self_requeue=self.opts.self_requeue,
            poll_s=0.01,
            grace_s=self.opts.grace_s,
            platform="none",
        )
        od = self.opts.ondemand_usd_per_hour
        rate = {"spot": self.opts.spot_usd_per_hour if self.opts.spot else od, "on-demand": od}
        self.prices = Prices({(m, z): Pricing(rate[m], od) for m in MARKETS for z in zones})
        self.clock = clock
        self.launches: list[LaunchRequest] = []  # every launch, for tests to inspect
        self._machines: dict[str, _Machine] = {}

    def launch(self, req: LaunchRequest) -> Handle:
        if req.placement.market == "spot" and (
            req.placement.zone in self.opts.full or not self.opts.spot
        ):
            raise CapacityError(f"no spot capacity in {req.placement.zone}")
        i = len(self.launches)
        runs = self.opts.run_s if isinstance(self.opts.run_s, list) else [self.opts.run_s]
        self.launches.append(req)
        m = _Machine(
            req,
            f"fake-{next(_IDS)}",
            self.clock(),
            max(0.0, runs[min(i, len(runs) - 1)]),
            self.opts.exits[min(i, len(self.opts.exits) - 1)],
        )
        self._machines[m.id] = m
        return {"n": req.n, "id": m.id}

    def _machine(self, handle: Handle) -> _Machine:
        try:
            return self._machines[handle["id"]]
        except KeyError:
            raise ProviderError(f"fake machine {handle.get('id')!r} does not exist") from None

    def status(self, handle: Handle) -> AttemptStatus:
        m = self._machine(handle)
        running_at = m.launched_at + self.opts.boot_s
        end_at = running_at + m.run_s
        now = self.clock()
        if m.stopped_at is not None and m.stopped_at < end_at:
            if m.stopped_at < running_at:
                return AttemptStatus(Phase.LOST, ended_at=m.stopped_at, detail="terminated")
            return AttemptStatus(
                Phase.EXITED, EXIT_INTERRUPTED, ended_at=m.stopped_at, running_at=running_at
            )
        if now < running_at:
            return AttemptStatus(Phase.STARTING)
        if now < end_at:
            return AttemptStatus(Phase.RUNNING, running_at=running_at)
        if m.outcome == "lost":
            return AttemptStatus(
                Phase.LOST, ended_at=end_at, running_at=running_at, detail="machine reclaimed"
            )
        return AttemptStatus(Phase.EXITED, m.outcome, ended_at=end_at, running_at=running_at)

    def terminate(self, handle: Handle) -> None:
        m = self._machine(handle)
        if m.stopped_at is None:
            m.stopped_at = self.clock()

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        return [
            {"n": m.req.n, "id": m.id} for m in self._machines.values() if m.req.job_id == job_id
        ]
