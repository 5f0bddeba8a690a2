"""What a spot/on-demand policy sees and what it answers: plain values, no I/O, no clock.

The simulator (``spotwise.market.simulate``) and the controller build an :class:`Observation` at
each decision point (a tick boundary) and carry out the :class:`Decision`. Times are seconds since
the job started (``_s``); money is ``usd_per_hour``. The model is the one in
``docs/policies.md``: idle, spot in zone Z, or on-demand; every start pays the changeover delay
``d`` with no progress; going idle is free.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from spotwise.errors import ConfigError


class Market(str, enum.Enum):
    IDLE = "idle"
    SPOT = "spot"
    ONDEMAND = "on-demand"


@dataclass(frozen=True)
class Decision:
    """Where the job runs during the next tick: idle, on-demand, or spot in ``zone`` (an index)."""

    market: Market
    zone: int | None = None

    @classmethod
    def idle(cls) -> Decision:
        return _IDLE

    @classmethod
    def ondemand(cls) -> Decision:
        return _ONDEMAND

    @classmethod
    def spot(cls, zone: int = 0) -> Decision:
        return _SPOT[zone] if 0 <= zone < len(_SPOT) else cls(Market.SPOT, zone)

    def __str__(self) -> str:
        return f"spot[{self.zone}]" if self.market is Market.SPOT else self.market.value


_IDLE = Decision(Market.IDLE)
_ONDEMAND = Decision(Market.ONDEMAND)
_SPOT = tuple(Decision(Market.SPOT, z) for z in range(64))


@dataclass(frozen=True)
class Problem:
    """The job and the market terms: C hours of compute due within R hours, changeover d."""

    compute_h: float
    deadline_h: float
    changeover_h: float = 0.2
    spot_price_usd_per_hour: float = 0.918
    ondemand_price_usd_per_hour: float = 3.06
    nodes: int = 1

    def __post_init__(self) -> None:
        checks = [
            (self.compute_h > 0, "compute_h must be > 0"),
            (self.deadline_h > 0, "deadline_h must be > 0"),
            (self.changeover_h >= 0, "changeover_h must be >= 0"),
            (self.spot_price_usd_per_hour >= 0, "spot price must be >= 0"),
            (self.ondemand_price_usd_per_hour >= 0, "on-demand price must be >= 0"),
            (self.nodes >= 1, "nodes must be >= 1"),
        ]
        for ok, what in checks:
            if not ok:
                raise ConfigError(f"bad job terms: {what}", hint="see spotwise simulate --help")

    # seconds, rounded to the microsecond so that 0.2 h is exactly 720 s
    @property
    def compute_s(self) -> float:
        return round(self.compute_h * 3600.0, 6)

    @property
    def deadline_s(self) -> float:
        return round(self.deadline_h * 3600.0, 6)

    @property
    def changeover_s(self) -> float:
        return round(self.changeover_h * 3600.0, 6)

    @property
    def ondemand_feasible(self) -> bool:
        """Whether on-demand only (one start) meets the deadline: C + d <= R."""
        return self.compute_s + self.changeover_s <= self.deadline_s + 1e-6


@dataclass(frozen=True)
class Observation:
    """The state at a decision point (a tick boundary), after any preemption at that boundary."""

    tick: int  # ticks since the job started
    elapsed_s: float  # t
    progress_s: float  # compute done so far
    market: Market  # where the job is now (IDLE right after a preemption)
    zone: int | None  # spot zone when market is SPOT
    changeover_left_s: float  # unpaid rest of the current changeover (0 when running or idle)
    available: tuple[bool, ...]  # spot available in each zone during the coming tick
    spot_prices: tuple[float, ...]  # per zone, usd_per_hour per node
    ondemand_price: float  # usd_per_hour per node
    compute_s: float  # C
    deadline_s: float  # R
    changeover_s: float  # d
    gap_s: float  # tick length
    preempted: bool = False  # spot was taken away at this boundary

    @property
    def remaining_s(self) -> float:
        """R(t): time left to the deadline."""
        return self.deadline_s - self.elapsed_s

    @property
    def remaining_compute_s(self) -> float:
        """C(t): compute still to do."""
        return self.compute_s - self.progress_s

    @property
    def slack_s(self) -> float:
        return self.remaining_s - self.remaining_compute_s

    @property
    def safety_net(self) -> bool:
        """The Safety Net condition R(t) < C(t) + 2d, or, with ticks longer than d, idling one
        more tick would leave less than C(t) + d."""
        return self.slack_s < self.changeover_s + max(self.changeover_s, self.gap_s) - 1e-9

    def on_track(self, at_s: float) -> bool:
        """Progress at or above the uniform-progress line ep(t) = t*C/R evaluated at ``at_s``."""
        return self.progress_s >= at_s * self.compute_s / self.deadline_s - 1e-9


@runtime_checkable
class Policy(Protocol):
    """A decision rule. ``reset`` starts a run; ``decide`` is called once per tick boundary.

    Policies may keep state between calls, but only from what they were shown: the observations
    so far, ``history`` (availability before the run started, zones x ticks) and
    ``prior_rates_per_h`` (the market advisor's interruption rate per running hour of each
    zone, where one is known: what a job without history starts from). Only
    :class:`~spotwise.market.policies.optimal.OptimalPolicy` is shown the future, through
    ``plan``.
    """

    name: str

    def reset(
        self,
        problem: Problem,
        gap_s: float,
        zones: int,
        history: np.ndarray | None,
        prior_rates_per_h: tuple[float, ...] | None = None,
    ) -> None: ...

    def decide(self, obs: Observation) -> Decision: ...

    def state(self) -> dict[str, Any]:
        """What the policy has learned and committed to since ``reset``, as plain JSON values."""
        ...

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``state()`` (after the same ``reset``), as if never interrupted."""
        ...


class BasePolicy:
    """Common plumbing: remembers the terms of the run and whether the Safety Net has fired."""

    name = "base"
    home_zone = 0  # single-zone policies use the first zone, as in the paper

    def __init__(self) -> None:
        self.committed = False  # on-demand until the end (Safety Net fired)

    def reset(
        self,
        problem: Problem,
        gap_s: float,
        zones: int,
        history: np.ndarray | None,
        prior_rates_per_h: tuple[float, ...] | None = None,
    ) -> None:
        self.problem = problem
        self.gap_s = gap_s
        self.zones = zones
        self.committed = False

    def decide(self, obs: Observation) -> Decision:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        return {"committed": self.committed}

    def load_state(self, state: dict[str, Any]) -> None:
        self.committed = bool(state.get("committed", False))

    def _safety_net(self, obs: Observation) -> bool:
        """Fire (for good) when idle and the Safety Net condition holds; stay fired."""
        if not self.committed and obs.market is Market.IDLE and obs.safety_net:
            self.committed = True
        return self.committed
