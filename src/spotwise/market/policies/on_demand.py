"""On-demand only: the safe, expensive baseline every other policy is measured against."""

from __future__ import annotations

from spotwise.market.policies.base import BasePolicy, Decision, Observation


class OnDemandPolicy(BasePolicy):
    name = "on-demand"

    def decide(self, obs: Observation) -> Decision:
        return Decision.ondemand()
