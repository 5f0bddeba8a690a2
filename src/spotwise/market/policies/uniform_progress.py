"""Uniform Progress ("Can't Be Late", NSDI'24), as the authors' simulator reads the paper.

The expected-progress line is ep(t) = t*C/R. Rules, in order:

- Safety Net: idle and R(t) < C(t) + 2d -> on-demand until the end.
- Idle: spot if available (even when behind: "taking risks"); else on-demand if progress is
  below ep(t); else stay idle.
- On spot: stay until preempted ("exploitation").
- On on-demand (hysteresis): leave for spot only when spot is available, progress >= ep(t + 2d)
  and the Safety Net condition does not hold; never leave on-demand for idle.
"""

from __future__ import annotations

from spotwise.market.policies.base import BasePolicy, Decision, Market, Observation


class UniformProgressPolicy(BasePolicy):
    name = "uniform-progress"

    def decide(self, obs: Observation) -> Decision:
        home = self.home_zone
        if self._safety_net(obs):
            return Decision.ondemand()
        if obs.market is Market.SPOT:
            return Decision.spot(obs.zone or 0)
        if obs.market is Market.ONDEMAND:
            leave = (
                obs.available[home]
                and obs.on_track(obs.elapsed_s + 2 * obs.changeover_s)
                and not obs.safety_net
            )
            return Decision.spot(home) if leave else Decision.ondemand()
        if obs.available[home]:
            return Decision.spot(home)
        if not obs.on_track(obs.elapsed_s):
            return Decision.ondemand()
        return Decision.idle()
