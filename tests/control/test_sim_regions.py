"""The sim provider's zones from several regions of a trace, and the advisor's ranking over
them from the shipped catalog prices and interruption estimates (what a job's policy plans
over): pure, no processes."""

from __future__ import annotations

import pytest

from spotwise.control.decisions import ranked_zones, zone_offers
from spotwise.control.pricing import region_of, zone_interruption_rates
from spotwise.control.providers import Placement, make_provider
from spotwise.errors import ConfigError
from spotwise.market.interruption import load_interruption_model
from spotwise.market.policies import Problem


def test_a_sim_job_spans_the_regions_it_names_and_the_advisor_ranks_across_them():
    p = make_provider("sim", {"regions": ["us-west-2", "us-east-2"]}, epoch=0.0)
    zones = p.features.zones
    assert zones == ("us-east-2a", "us-east-2b", "us-west-2a", "us-west-2b", "us-west-2c")
    spot = [p.prices.of(Placement("spot", z)).usd_per_hour for z in zones]
    assert len({spot[0], spot[2]}) == 2  # each zone at its own region's catalog price
    rates = zone_interruption_rates(load_interruption_model(), "p3.2xlarge", zones)
    ranked = ranked_zones(
        zone_offers(zones, spot, rates, [], 0.0),
        Problem(compute_h=8, deadline_h=12, changeover_h=0.2),
        emergency_save=True,
    )
    assert sorted(r.zone for r in ranked) == sorted(zones)
    assert {region_of(r.zone) for r in ranked[:3]} == {"us-east-2", "us-west-2"}
    costs = [r.expected_cost_usd for r in ranked]
    assert costs == sorted(costs)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (
            {"regions": ["us-east-1", "eu-west-1"]},
            ["provider.sim.regions", "['eu-west-1']", "us-east-1, us-east-2, us-west-2"],
        ),
        (
            {"regions": ["us-east-1"], "zones": ["us-east-1a", "us-west-2a"]},
            ["provider.sim.zones", "['us-west-2a']", "provider.sim.regions"],
        ),
        ({"zones": ["us-east-1z"]}, ["provider.sim.zones", "us-east-1z", "us-east-1a"]),
    ],
)
def test_a_region_or_zone_the_trace_lacks_names_the_key_and_the_valid_names(options, words):
    with pytest.raises(ConfigError) as info:
        make_provider("sim", options, epoch=0.0)
    for word in words:
        assert word in str(info.value), str(info.value)
