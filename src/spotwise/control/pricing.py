"""Hourly prices and interruption rates for attempts, from the market catalog and the
interruption model (the one place that knows prices)."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spotwise.errors import ConfigError, MarketError

if TYPE_CHECKING:
    from spotwise.market.interruption import InterruptionModel


@functools.lru_cache(maxsize=1)
def _catalog():
    from spotwise.market.catalog import load_catalog

    return load_catalog()


def region_of(zone: str) -> str:
    """``us-east-1a`` -> ``us-east-1``, ``us-central1-a`` -> ``us-central1`` (AWS and GCP
    zone names end in one letter)."""
    return re.sub(r"(?<=\d)-?[a-z]$", "", zone)


def catalog_usd_per_hour(instance_type: str, zone: str, market: str, cloud: str = "aws") -> float:
    """The catalog's price of ``instance_type`` in the zone's region (cheapest zone for spot)."""
    try:
        return float(_catalog().price(cloud, region_of(zone), instance_type, market))
    except MarketError as exc:
        raise ConfigError(
            f"no {market} price for {instance_type} in {region_of(zone)}: {exc.message}",
            hint="set resources.instance_type to a catalog type (spotwise gpus --json), or give "
            "the sim provider spot_usd_per_hour / ondemand_usd_per_hour",
        ) from exc


def interruption_rate_per_h(
    model: InterruptionModel, instance_type: str | None, zone: str, cloud: str = "aws"
) -> float:
    """The interruption model's estimate for spot ``instance_type`` in ``zone``, the one the
    advisor ranks placements with: the zone's own row, else its region's, else the cloud's
    default (zones it does not know then rank by price alone)."""
    return model.rate(cloud, region_of(zone), zone, instance_type or "").rate_per_h


def zone_interruption_rates(
    model: InterruptionModel, instance_type: str | None, zones: Sequence[str]
) -> tuple[float, ...]:
    """``interruption_rate_per_h`` of each zone: what the advisor ranks a job's zones by and
    the policy's prior, in ``spotwise launch`` and ``spotwise simulate`` alike."""
    return tuple(interruption_rate_per_h(model, instance_type, z) for z in zones)
