"""The aws provider's placement choice: a pure function of resources, pinned options, catalog
rows and an interruption model (tables built here, so each expectation follows from them)."""

from __future__ import annotations

from typing import Any

import pytest

from spotwise.control.providers.aws_placement import choose_placement
from spotwise.errors import ConfigError
from spotwise.market.catalog import Catalog, Offer
from spotwise.market.interruption import InterruptionModel, RateRow

HW = {  # instance type -> (gpu, gpus, vcpus)
    "g4dn.xlarge": ("T4", 1, 4),
    "g4dn.8xlarge": ("T4", 1, 32),
    "g4dn.12xlarge": ("T4", 4, 48),
    "p3.2xlarge": ("V100", 1, 8),
}


def _offer(region: str, itype: str, market: str, usd: float, zone: str = "") -> Offer:
    gpu, gpus, vcpus = HW[itype]
    return Offer("aws", region, zone, itype, market, usd, gpu, gpus, 16.0, vcpus, 64.0)


CATALOG = Catalog(
    [
        _offer("us-east-1", "g4dn.xlarge", "on-demand", 0.526),
        _offer("us-east-1", "g4dn.xlarge", "spot", 0.22),
        _offer("us-west-2", "g4dn.xlarge", "on-demand", 0.526),
        _offer("us-west-2", "g4dn.xlarge", "spot", 0.16),
        _offer("us-east-1", "g4dn.8xlarge", "spot", 0.70),
        _offer("us-east-1", "g4dn.12xlarge", "spot", 1.20),
        # spot priced per zone *id*: one regional offer at the mean (0.5 + 0.7) / 2 = 0.6
        _offer("us-east-1", "p3.2xlarge", "spot", 0.50, zone="use1-az1"),
        _offer("us-east-1", "p3.2xlarge", "spot", 0.70, zone="use1-az2"),
        # a named zone with its own price beats the regional one there
        _offer("eu-west-1", "p3.2xlarge", "spot", 0.90),
        _offer("eu-west-1", "p3.2xlarge", "spot", 0.40, zone="eu-west-1b"),
        Offer("gcp", "us-central1", "", "n1-t4", "spot", 0.01, "T4", 1, 16.0, 4, 15.0),
    ]
)
MODEL = InterruptionModel(
    [
        RateRow("aws", "", "", "", 0.05, 0, 0.0, 0.05, "default"),
        RateRow("aws", "us-east-1", "us-east-1a", "g4dn.xlarge", 0.30, 0, 0.0, 0.30, "zone"),
        RateRow("aws", "us-east-1", "us-east-1c", "g4dn.xlarge", 0.02, 0, 0.0, 0.02, "zone"),
        RateRow("aws", "us-east-1", "use1-az9", "g4dn.xlarge", 0.01, 0, 0.0, 0.01, "zone id"),
        RateRow("aws", "us-west-2", "", "g4dn.xlarge", 3.0, 0, 0.0, 3.0, "stormy"),
        RateRow("gcp", "", "", "", 0.0, 0, 0.0, 0.0, "default"),
    ]
)
AC = ("us-east-1a", "us-east-1c")  # us-east-1's zones the model knows, in name order
OPEN = {"gpu": None, "gpu_count": 0, "cpus": 1, "instance_type": None, "region": None, "zones": ()}


@pytest.mark.parametrize(
    ("given", "want"),
    [
        # cheapest by expected cost, not by price: us-west-2 is cheaper per hour but stormy;
        # us-east-1's zones ranked by their interruption rate (the zone id row is no zone)
        ({"gpu": "T4"}, ("g4dn.xlarge", "us-east-1", ("us-east-1c", "us-east-1a"), True)),
        # a region pin keeps the advice inside it
        ({"gpu": "T4", "region": "us-west-2"}, ("g4dn.xlarge", "us-west-2", ("us-west-2a",), True)),
        # more CPUs than the small type has: the next type with enough (no zone estimates for
        # it, so its zones tie and go in name order)
        ({"gpu": "T4", "cpus": 16}, ("g4dn.8xlarge", "us-east-1", AC, True)),
        ({"gpu": "T4", "gpu_count": 4}, ("g4dn.12xlarge", "us-east-1", AC, True)),
        # zones pinned: only those, in the order written
        (
            {"gpu": "T4", "region": "us-east-1", "zones": ("us-east-1b", "us-east-1a")},
            ("g4dn.xlarge", "us-east-1", ("us-east-1b", "us-east-1a"), True),
        ),
        # an instance type pinned without a region: the advisor picks its region
        ({"instance_type": "p3.2xlarge"}, ("p3.2xlarge", "eu-west-1", ("eu-west-1b",), True)),
        # everything pinned: no ranking, the catalog is not even consulted
        (
            {"instance_type": "p9.huge", "region": "us-east-1"},
            ("p9.huge", "us-east-1", ("us-east-1a",), False),
        ),
        (
            {"gpu": "T4", "instance_type": "g4dn.xlarge", "region": "us-west-2",
             "zones": ("us-west-2c",)},
            ("g4dn.xlarge", "us-west-2", ("us-west-2c",), False),
        ),
    ],
)  # fmt: skip
def test_the_choice_follows_resources_pins_and_the_advisor(given: dict[str, Any], want: tuple):
    got = choose_placement(**{**OPEN, **given}, market="spot", catalog=CATALOG, model=MODEL)
    assert (got.instance_type, got.region, got.zones, got.advised) == want
    if got.advised:  # the winner is the best of what the advisor ranked, and says so
        best = got.ranked[0]
        assert (best.instance_type, best.region, best.zone) == (*want[:2], want[2][0])
        assert all(p.expected_cost_usd >= best.expected_cost_usd for p in got.ranked)
        assert got.to_event()["expected_cost_usd"] == best.expected_cost_usd
        assert want[0] in got.message() and want[2][0] in got.message()


def test_zone_id_prices_become_their_regional_mean():
    got = choose_placement(
        **{**OPEN, "gpu": "V100", "region": "us-east-1"},
        market="spot",
        catalog=CATALOG,
        model=MODEL,
    )
    assert got.instance_type == "p3.2xlarge"
    assert [round(p.usd_per_hour, 9) for p in got.ranked] == [0.6, 0.6]  # us-east-1a, -1c
    assert got.zones == ("us-east-1a", "us-east-1c")


def test_a_deadline_ranks_the_ones_that_meet_it_first():
    # 10 h of work: stormy us-west-2 (3 interruptions/h) cannot finish in 20 h; pinned there
    # it is still the answer (the user said so) but marked as missing the deadline
    fast = choose_placement(
        **{**OPEN, "gpu": "T4"}, market="spot", catalog=CATALOG, model=MODEL,
        compute_hours=10.0, deadline_hours=20.0,
    )  # fmt: skip
    assert fast.region == "us-east-1" and fast.ranked[0].meets_deadline
    slow = choose_placement(
        **{**OPEN, "gpu": "T4", "region": "us-west-2"}, market="spot", catalog=CATALOG,
        model=MODEL, compute_hours=10.0, deadline_hours=20.0,
    )  # fmt: skip
    assert slow.region == "us-west-2" and not slow.ranked[0].meets_deadline


def test_on_demand_ranks_on_demand_prices():
    got = choose_placement(
        **{**OPEN, "gpu": "T4"}, market="on-demand", catalog=CATALOG, model=MODEL
    )
    assert {p.market for p in got.ranked} == {"on-demand"}
    assert got.ranked[0].usd_per_hour == 0.526


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"gpu": "T4", "gpu_count": 16}, ["resources:", "16 x T4", "resources.gpu_count"]),
        ({"gpu": "T4", "cpus": 64}, ["resources:", ">= 64 CPUs", "resources.cpus"]),
        ({"gpu": "V100", "region": "us-west-2"}, ["in us-west-2", "provider.aws.region"]),
        ({"gpu": "T5"}, ["resources.gpu", "'T5'", "did you mean T4"]),
        ({}, ["resources.gpu is not set", "provider.aws.instance_type"]),
        ({"instance_type": "p9.huge"}, ["instance type p9.huge"]),
        ({"gpu": "T4", "zones": ("us-east-1a",)}, ["provider.aws.zones", "provider.aws.region"]),
    ],
)
def test_a_request_no_aws_offer_meets_names_the_setting(given: dict[str, Any], words: list[str]):
    with pytest.raises(ConfigError) as info:
        choose_placement(**{**OPEN, **given}, market="spot", catalog=CATALOG, model=MODEL)
    text = str(info.value)
    for word in words:
        assert word in text, text


def test_regions_let_the_advisor_rank_zones_across_them():
    # us-west-2 is cheaper per hour but stormy: its zone ranks after us-east-1's two, and the
    # job keeps all three (one region alone would drop it); pinned as regions, not region
    got = choose_placement(
        **{**OPEN, "gpu": "T4", "regions": ("us-west-2", "us-east-1")},
        market="spot",
        catalog=CATALOG,
        model=MODEL,
    )
    assert got.instance_type == "g4dn.xlarge"
    assert got.zones == ("us-east-1c", "us-east-1a", "us-west-2a")
    assert got.regions == ("us-east-1", "us-west-2") and got.region == "us-east-1"
    costs = [p.expected_cost_usd for p in got.ranked]
    assert costs == sorted(costs) and {p.region for p in got.ranked} == set(got.regions)
    assert got.pins() == {
        "instance_type": "g4dn.xlarge",
        "region": None,
        "regions": ["us-east-1", "us-west-2"],
        "zones": ["us-east-1c", "us-east-1a", "us-west-2a"],
    }
    # what it pinned is what a later controller gets back, without ranking again
    again = choose_placement(
        **{**OPEN, **got.pins(), "region": None}, market="spot", catalog=CATALOG, model=MODEL
    )
    assert (again.zones, again.regions, again.advised) == (got.zones, got.regions, False)
