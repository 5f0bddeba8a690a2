from __future__ import annotations

import numpy as np
import pytest

from spotwise.control.providers.sim import SimMarket, SimProvider
from spotwise.errors import ConfigError


def _market(compression=10.0, start_s=0.0):
    avail = np.array([[1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 0, 0]], dtype=bool)
    return SimMarket(
        ("a", "b"), avail, gap_s=100.0, compression=compression, epoch=1000.0, start_s=start_s
    )


def test_compressed_clock_maps_wall_time_to_ticks():
    m = _market()
    assert m.tick(1000.0) == 0 and m.tick(1009.99) == 0 and m.tick(1010.0) == 1
    assert m.wall_of_tick(2) == pytest.approx(1020.0)
    assert m.is_available("a", 1000.0) and not m.is_available("a", 1021.0)
    assert not m.is_available("b", 1000.0) and m.is_available("b", 1015.0)


def test_loss_time_is_the_next_unavailable_tick():
    m = _market()
    assert m.loss_wall("a", 1000.0) == pytest.approx(1020.0)
    assert m.loss_wall("a", 1031.0) == pytest.approx(1080.0)  # wraps around: tick 8 = tick 2
    assert m.loss_wall("b", 1012.0) == pytest.approx(1040.0)
    shifted = _market(start_s=300.0)  # replay starts at tick 3
    assert shifted.loss_wall("a", 1000.0) == pytest.approx(1000.0 + (8 - 3) * 10.0)


def test_shipped_trace_and_catalog_prices():
    p = SimProvider(
        {"zones": ["us-east-1d", "us-west-2a"], "time_compression": 300},
        epoch=0.0,
        instance_type="p3.2xlarge",
    )
    assert p.features.zones == ("us-east-1d", "us-west-2a")
    from spotwise.control.providers.base import Placement

    spot = p.prices.of(Placement("spot", "us-east-1d"))
    assert 0 < spot.usd_per_hour < spot.ondemand_usd_per_hour
    assert spot.ondemand_usd_per_hour == pytest.approx(3.06)
    assert spot.time_scale == 300


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"zones": ["mars-1a"]}, "unknown zone"),
        ({"trace": "nope"}, "no trace"),
        ({"speed": 3}, "unknown option"),
        ({"time_compression": 0}, "time_compression"),
    ],
)
def test_bad_sim_options(options, needle):
    with pytest.raises(ConfigError, match=needle):
        SimProvider(options, epoch=0.0, instance_type=None)
