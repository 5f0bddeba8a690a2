"""One policy object across one job: the single adapter between a policy and whoever drives it.

The simulator (replaying a trace) and the controller (watching a real job) both hand a
:class:`PolicyDriver` the plain facts at each tick boundary; it builds the :class:`Observation`
the same way for both, asks the policy once per boundary, and remembers the answer. Everything it
holds is JSON (:meth:`PolicyDriver.to_json`): the controller writes it to the job store after
every decision, so a controller killed and restarted continues with the same learned beliefs and
the same committed state instead of a cold prior. Nothing is pickled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from spotwise.errors import ConfigError
from spotwise.market.policies.base import Decision, Market, Observation, Policy, Problem


class PolicyDriver:
    """``policy`` reset for ``problem`` on ``zones`` (names; the policy's zone indices point
    into them) with ``gap_s``-long ticks and, where known, the advisor's interruption rate of
    each zone (``prior_rates_per_h``, the policy's prior). Names and rates are stored with the
    state, so a driver restored by a later controller means the same zone by the same index
    and starts from the same prior even if the advisor's estimates have moved since."""

    def __init__(
        self,
        policy: Policy,
        problem: Problem,
        gap_s: float,
        zones: Sequence[str],
        history: np.ndarray | None = None,
        *,
        name: str | None = None,
        prior_rates_per_h: Sequence[float] | None = None,
    ) -> None:
        self.policy = policy
        self.name = name or policy.name
        self.problem = problem
        self.gap_s = gap_s
        self.zones = tuple(zones)
        self.prior_rates_per_h = (
            None if prior_rates_per_h is None else tuple(float(r) for r in prior_rates_per_h)
        )
        if self.prior_rates_per_h is not None and (
            len(self.prior_rates_per_h) != len(self.zones)
            or any(not r >= 0 for r in self.prior_rates_per_h)
        ):
            raise ConfigError(
                f"prior interruption rates {list(self.prior_rates_per_h)} do not fit zones "
                f"{list(self.zones)}",
                hint="give one rate per zone (per running hour, >= 0)",
            )
        self.tick = -1  # last boundary decided
        self.decision: Decision | None = None
        policy.reset(problem, gap_s, len(self.zones), history, self.prior_rates_per_h)

    def decide(
        self,
        tick: int,
        progress_s: float,
        market: Market,
        zone: int | None,
        changeover_left_s: float,
        available: tuple[bool, ...],
        spot_prices: tuple[float, ...],
        ondemand_price: float,
        preempted: bool = False,
    ) -> Decision:
        """The policy's decision at boundary ``tick`` (elapsed time = tick x gap)."""
        p = self.problem
        self.decision = self.policy.decide(
            Observation(
                tick=tick,
                elapsed_s=tick * self.gap_s,
                progress_s=progress_s,
                market=market,
                zone=zone,
                changeover_left_s=changeover_left_s,
                available=available,
                spot_prices=spot_prices,
                ondemand_price=ondemand_price,
                compute_s=p.compute_s,
                deadline_s=p.deadline_s,
                changeover_s=p.changeover_s,
                gap_s=self.gap_s,
                preempted=preempted,
            )
        )
        self.tick = tick
        return self.decision

    # --- persistence ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "policy": self.name,
            "problem": dataclasses.asdict(self.problem),
            "gap_s": self.gap_s,
            "zones": list(self.zones),
            "prior_rates_per_h": None
            if self.prior_rates_per_h is None
            else list(self.prior_rates_per_h),
            "tick": self.tick,
            "decision": None if d is None else {"market": d.market.value, "zone": d.zone},
            "state": self.policy.state(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PolicyDriver:
        """The driver :meth:`to_json` described, its policy restored to the same state."""
        from spotwise.market.policies import make_policy

        try:
            driver = cls(
                make_policy(doc["policy"]),
                Problem(**doc["problem"]),
                float(doc["gap_s"]),
                tuple(str(z) for z in doc["zones"]),
                name=doc["policy"],
                prior_rates_per_h=doc.get("prior_rates_per_h"),
            )
            driver.policy.load_state(doc["state"])
            driver.tick = int(doc["tick"])
            d = doc["decision"]
            driver.decision = None if d is None else Decision(Market(d["market"]), d["zone"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"the stored policy state is unreadable ({exc!r})",
                hint="it was written by another spotwise version; resubmit the job",
            ) from exc
        return driver
