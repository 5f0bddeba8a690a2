"""The advisor's interruption rates as the policy's prior: a job with no history starts in the
zone the market says holds spot longest, the simulator and the driver's stored state carry the
same prior, and without one the built-in prior keeps the zones in their given order."""

from __future__ import annotations

import numpy as np
import pytest

from spotwise.errors import ConfigError
from spotwise.market.policies import Decision, Market, Problem, make_policy
from spotwise.market.policies.driver import PolicyDriver
from spotwise.market.simulate import Markets, simulate_run

PROBLEM = Problem(compute_h=8, deadline_h=12, changeover_h=0.2)
GAP_S = 600.0


def _first(prior: tuple[float, ...] | None) -> Decision:
    """The first decision of a fresh spotwise policy with spot up in both zones."""
    driver = PolicyDriver(
        make_policy("spotwise"), PROBLEM, GAP_S, ("a", "b"), prior_rates_per_h=prior
    )
    return driver.decide(0, 0.0, Market.IDLE, None, 0.0, (True, True), (0.918, 0.918), 3.06)


def test_the_first_decision_goes_to_the_zone_the_advisor_rates_least_interrupted() -> None:
    assert _first(None) == Decision.spot(0)  # nothing tells them apart: the given order
    assert _first((3.0, 0.05)) == Decision.spot(1)  # b holds spot ~20 h, a ~20 min
    assert _first((0.05, 3.0)) == Decision.spot(0)


def test_the_simulator_hands_the_markets_prior_to_the_policy() -> None:
    avail = np.ones((2, 200), bool)
    runs = {
        prior: simulate_run(
            make_policy("spotwise"),
            PROBLEM,
            Markets(GAP_S, avail, ("a", "b"), prior_rates_per_h=prior),
            0,
            record=True,
        )
        for prior in (None, (3.0, 0.05))
    }
    assert runs[None].timeline is not None and runs[None].timeline.zone[0] == 0
    assert runs[(3.0, 0.05)].timeline is not None and runs[(3.0, 0.05)].timeline.zone[0] == 1
    assert all(r.deadline_met for r in runs.values())


def test_a_restored_driver_keeps_its_prior_and_decides_the_same() -> None:
    prior = (3.0, 0.05)
    driver = PolicyDriver(
        make_policy("spotwise"), PROBLEM, GAP_S, ("a", "b"), prior_rates_per_h=prior
    )
    args = (Market.IDLE, None, 0.0, (True, True), (0.918, 0.918), 3.06)
    driver.decide(0, 0.0, *args)
    doc = driver.to_json()
    assert doc["prior_rates_per_h"] == list(prior)
    restored = PolicyDriver.from_json(doc)
    assert restored.prior_rates_per_h == prior
    later = (Market.SPOT, 1, 0.0, (True, False), (0.918, 0.918), 3.06)
    assert restored.decide(1, 0.0, *later) == driver.decide(1, 0.0, *later)


def test_a_prior_that_does_not_fit_the_zones_is_refused() -> None:
    with pytest.raises(ConfigError, match="one rate per zone"):
        PolicyDriver(make_policy("spotwise"), PROBLEM, GAP_S, ("a", "b"), prior_rates_per_h=(1.0,))
