"""Buy or rent: yearly cost of a GPU-hour need on owned hardware vs on-demand, reserved and spot.

Owned hardware costs, per box and year: ``F = price / lifetime + price * ops_share`` whether used
or not, plus power ``P * u`` where ``P = kW * PUE * 8760 * usd_per_kwh`` and ``u`` is the share
of hours the box is busy. A used GPU-hour therefore costs ``(F + P*u) / (gpus * 8760 * u)``, and it
equals a cloud price ``c`` (per GPU-hour) at the break-even utilisation

    u* = F / (gpus * 8760 * c - P)

Above ``u*`` buying is cheaper. If the denominator is not positive, power alone costs more than
renting and buying never pays; ``u* > 1`` means it cannot pay even when busy all year.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spotwise.errors import ConfigError

HOURS_PER_YEAR = 8760.0


@dataclass(frozen=True)
class Hardware:
    price_usd: float
    gpus: int
    power_kw: float  # whole box at load
    lifetime_years: float = 4.0
    utilisation: float = 0.6  # share of the year the box does useful work
    usd_per_kwh: float = 0.12
    pue: float = 1.4  # data-centre overhead on power
    ops_share_per_year: float = 0.08  # space, support, admin as a share of the price per year

    def validate(self) -> None:
        if self.price_usd <= 0 or self.gpus < 1 or self.lifetime_years <= 0:
            raise ConfigError("hardware price, GPU count and lifetime must be positive")
        if not 0 < self.utilisation <= 1:
            raise ConfigError(
                f"utilisation must be in (0, 1], got {self.utilisation}",
                hint="0.6 means busy 60% of the hours in a year",
            )
        if self.power_kw < 0 or self.usd_per_kwh < 0 or self.pue < 1 or self.ops_share_per_year < 0:
            raise ConfigError("power, electricity price and ops share cannot be negative; PUE >= 1")

    @property
    def fixed_usd_per_year(self) -> float:
        return self.price_usd / self.lifetime_years + self.price_usd * self.ops_share_per_year

    @property
    def power_usd_per_year_at_full_load(self) -> float:
        return self.power_kw * self.pue * HOURS_PER_YEAR * self.usd_per_kwh

    def usd_per_gpu_hour(self, utilisation: float | None = None) -> float:
        u = self.utilisation if utilisation is None else utilisation
        yearly = self.fixed_usd_per_year + self.power_usd_per_year_at_full_load * u
        return yearly / (self.gpus * HOURS_PER_YEAR * u)

    def boxes_for(self, gpu_hours_per_year: float) -> int:
        """Boxes needed so that none is busier than the planned utilisation."""
        return math.ceil(gpu_hours_per_year / (self.gpus * HOURS_PER_YEAR * self.utilisation))

    def busy_share(self, gpu_hours_per_year: float) -> float:
        """Share of the year the boxes actually work for that need."""
        boxes = self.boxes_for(gpu_hours_per_year)
        return gpu_hours_per_year / (boxes * self.gpus * HOURS_PER_YEAR)

    def break_even_utilisation(self, cloud_usd_per_gpu_hour: float) -> float:
        """Utilisation above which owning beats renting at that price (inf: never)."""
        margin = self.gpus * HOURS_PER_YEAR * cloud_usd_per_gpu_hour
        margin -= self.power_usd_per_year_at_full_load
        return math.inf if margin <= 0 else self.fixed_usd_per_year / margin


@dataclass(frozen=True)
class Option:
    name: str  # "buy", "on-demand", "reserved", "spot"
    usd_per_gpu_hour: float
    usd_per_year: float
    break_even_utilisation: float | None  # for cloud options: where buying starts to pay
    note: str = ""


def compare(
    gpu_hours_per_year: float,
    hardware: Hardware,
    *,
    on_demand_usd_per_gpu_hour: float,
    reserved_usd_per_gpu_hour: float | None = None,
    spot_usd_per_gpu_hour: float | None = None,
    spot_note: str = "",
) -> list[Option]:
    """Yearly cost of ``gpu_hours_per_year`` each way, cheapest first."""
    hardware.validate()
    if gpu_hours_per_year <= 0:
        raise ConfigError("the yearly GPU-hour need must be positive", hint="--gpu-hours 20000")
    boxes = hardware.boxes_for(gpu_hours_per_year)
    busy = hardware.busy_share(gpu_hours_per_year)
    own_year = boxes * (
        hardware.fixed_usd_per_year + hardware.power_usd_per_year_at_full_load * busy
    )
    options = [
        Option(
            "buy",
            own_year / gpu_hours_per_year,
            own_year,
            None,
            f"{boxes} box(es) of {hardware.gpus} GPUs, busy {busy:.0%} of the year",
        )
    ]
    rented = [
        ("on-demand", on_demand_usd_per_gpu_hour, ""),
        ("reserved", reserved_usd_per_gpu_hour, "1-year term"),
        ("spot", spot_usd_per_gpu_hour, spot_note),
    ]
    for name, price, note in rented:
        if price is None:
            continue
        if price <= 0:
            raise ConfigError(f"{name} price must be positive, got {price}")
        options.append(
            Option(
                name,
                price,
                price * gpu_hours_per_year,
                hardware.break_even_utilisation(price),
                note,
            )
        )
    return sorted(options, key=lambda o: o.usd_per_year)
