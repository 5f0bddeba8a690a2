"""Buy-vs-rent arithmetic: costs per GPU-hour and the break-even utilisation."""

from __future__ import annotations

import math

import pytest

from spotwise.errors import ConfigError
from spotwise.market.roi import HOURS_PER_YEAR, Hardware, compare

BOX = Hardware(price_usd=200_000, gpus=8, power_kw=5.0, lifetime_years=4, utilisation=0.5,
               usd_per_kwh=0.10, pue=1.5, ops_share_per_year=0.1)  # fmt: skip


def test_cost_per_gpu_hour_by_hand():
    fixed = 200_000 / 4 + 20_000  # 70,000 a year
    power_full = 5.0 * 1.5 * HOURS_PER_YEAR * 0.10  # 6,570 a year
    assert BOX.usd_per_gpu_hour(0.5) == pytest.approx(
        (fixed + power_full * 0.5) / (8 * HOURS_PER_YEAR * 0.5)
    )


@pytest.mark.parametrize("price", [1.5, 2.5, 4.0])
def test_break_even_is_where_owning_costs_the_cloud_price(price):
    u = BOX.break_even_utilisation(price)
    assert BOX.usd_per_gpu_hour(u) == pytest.approx(price)
    assert BOX.usd_per_gpu_hour(min(u * 1.2, 1.0)) < price or u * 1.2 > 1


def test_never_breaks_even_when_power_costs_more_than_renting():
    assert math.isinf(BOX.break_even_utilisation(0.05))


def test_compare_orders_options_and_sizes_the_fleet():
    options = compare(50_000, BOX, on_demand_usd_per_gpu_hour=3.0,
                      reserved_usd_per_gpu_hour=2.0, spot_usd_per_gpu_hour=1.2)  # fmt: skip
    assert [o.name for o in options] == sorted(
        [o.name for o in options], key=lambda n: {o.name: o.usd_per_year for o in options}[n]
    )
    buy = next(o for o in options if o.name == "buy")
    assert BOX.boxes_for(50_000) == 2 and "2 box(es)" in buy.note
    assert buy.usd_per_year == pytest.approx(2 * 70_000 + 6_570 * 2 * BOX.busy_share(50_000))
    spot = next(o for o in options if o.name == "spot")
    assert spot.usd_per_year == pytest.approx(60_000)


def test_bad_hardware_and_need():
    with pytest.raises(ConfigError, match="utilisation"):
        compare(1000, Hardware(1000, 8, 1, utilisation=1.5), on_demand_usd_per_gpu_hour=1)
    with pytest.raises(ConfigError, match="positive"):
        compare(0, BOX, on_demand_usd_per_gpu_hour=1)
