"""Greedy: spot whenever it is available, wait otherwise; on-demand only through the Safety Net.

Once on spot the job stays until preempted. The Safety Net (idle and R(t) < C(t) + 2d) switches
to on-demand for good, which is what makes greedy safe and also what makes it expensive: it
spends its slack waiting early and then pays on-demand for everything that is left.
"""

from __future__ import annotations

from spotwise.market.policies.base import BasePolicy, Decision, Market, Observation


class GreedyPolicy(BasePolicy):
    name = "greedy"

    def decide(self, obs: Observation) -> Decision:
        if self._safety_net(obs):
            return Decision.ondemand()
        if obs.market is Market.SPOT:
            return Decision.spot(obs.zone or 0)
        if obs.available[self.home_zone]:
            return Decision.spot(self.home_zone)
        return Decision.idle()
