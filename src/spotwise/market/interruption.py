"""How often a spot placement is interrupted: a rate per running hour, with its evidence.

Method (docs/market.md has the long form):

* **Prior** from the AWS Spot Instance Advisor band of (region, type): the band's "chance of
  interruption in a month" ``p`` (band midpoints, >20% taken as 30%) becomes an hourly Poisson rate
  ``-ln(1 - p) / 730``. Read literally these rates are far below what the availability traces
  show, so the build scales every band rate by one factor: trace interruptions divided by the
  interruptions the bands predict over the same (region, type, hours). The bands then rank
  places and the traces set the scale. Clouds without such a feed get the mean scaled prior.
* **Evidence** from availability traces: every tick boundary where capacity goes from available to
  not is one interruption; hours spent available are the exposure.
* **Estimate**: the Gamma-Poisson posterior mean ``(prior * W + events) / (W + exposure_h)`` with a
  prior weight ``W`` of one week (168 h) of observation. Little trace time leaves the prior in
  charge; weeks of trace time overrule it.

The build script computes the rows; at run time :class:`InterruptionModel` only looks them up.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

from spotwise.errors import MarketError

HOURS_PER_MONTH = 730.0
PRIOR_WEIGHT_H = 168.0  # one week of observation
# Spot Instance Advisor bands (index -> assumed monthly interruption probability).
BAND_MONTHLY_PROBABILITY = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.30}


def rate_from_monthly_probability(p: float) -> float:
    """Hourly Poisson rate whose chance of at least one event in a month is ``p``."""
    if not 0 <= p < 1:
        raise MarketError(f"monthly interruption probability must be in [0, 1), got {p}")
    return -math.log1p(-p) / HOURS_PER_MONTH


def band_rate(band: int) -> float:
    return rate_from_monthly_probability(BAND_MONTHLY_PROBABILITY[band])


def trace_evidence(counts: Sequence[int], gap_s: float, nodes: int = 1) -> tuple[int, float]:
    """(interruptions, available hours) in an availability trace (n_t >= nodes is available)."""
    events = 0
    available_ticks = 0
    previous = False
    for n in counts:
        up = n >= nodes
        available_ticks += up
        events += previous and not up
        previous = up
    return events, available_ticks * gap_s / 3600.0


def posterior_rate(prior_rate_per_h: float, events: int, exposure_h: float) -> float:
    return (prior_rate_per_h * PRIOR_WEIGHT_H + events) / (PRIOR_WEIGHT_H + exposure_h)


@dataclass(frozen=True)
class RateRow:
    cloud: str
    region: str  # "" for a cloud-wide default
    zone: str  # "" for a regional estimate
    instance_type: str  # "" for a default over types
    prior_rate_per_h: float
    events: int
    exposure_h: float
    rate_per_h: float
    source: str


@dataclass(frozen=True)
class RateEstimate:
    rate_per_h: float
    source: str  # which row answered: "trace zone", "advisor+trace region", "default"...

    @property
    def mean_hours_between(self) -> float:
        return math.inf if self.rate_per_h <= 0 else 1.0 / self.rate_per_h


_FIELDS = list(RateRow.__dataclass_fields__)


def write_rates(rows: Iterable[RateRow], out: io.TextIOBase | io.StringIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_FIELDS)
    for r in rows:
        writer.writerow(
            [r.cloud, r.region, r.zone, r.instance_type, f"{r.prior_rate_per_h:.6g}", r.events,
             f"{r.exposure_h:.4g}", f"{r.rate_per_h:.6g}", r.source]
        )  # fmt: skip


def read_rates(text: str) -> list[RateRow]:
    return [
        RateRow(
            cloud=r["cloud"], region=r["region"], zone=r["zone"], instance_type=r["instance_type"],
            prior_rate_per_h=float(r["prior_rate_per_h"]), events=int(r["events"]),
            exposure_h=float(r["exposure_h"]), rate_per_h=float(r["rate_per_h"]),
            source=r["source"],
        )
        for r in csv.DictReader(io.StringIO(text))
    ]  # fmt: skip


class InterruptionModel:
    """Looks up the most specific estimate: zone+type, region+type, region, cloud default."""

    def __init__(self, rows: Iterable[RateRow]) -> None:
        self._rows = {(r.cloud, r.region, r.zone, r.instance_type): r for r in rows}

    @classmethod
    def fixed(cls, rate_per_h: float) -> InterruptionModel:
        """Every spot placement on every cloud interrupted at the same rate (tests, what-ifs)."""
        return cls(
            RateRow(c, "", "", "", rate_per_h, 0, 0.0, rate_per_h, "fixed")
            for c in ("aws", "gcp", "azure", "lambda")
        )

    def zones(self, cloud: str) -> dict[str, list[str]]:
        """Region -> the zones of ``cloud`` with a zone-level estimate (places to rank)."""
        out: dict[str, list[str]] = {}
        for c, region, zone, _ in sorted(self._rows):
            if c == cloud and zone and zone not in out.get(region, []):
                out.setdefault(region, []).append(zone)
        return out

    def rate(self, cloud: str, region: str, zone: str, instance_type: str) -> RateEstimate:
        for key in (
            (cloud, region, zone, instance_type),
            (cloud, region, "", instance_type),
            (cloud, region, "", ""),
            (cloud, "", "", ""),
        ):
            row = self._rows.get(key)
            if row is not None:
                return RateEstimate(row.rate_per_h, row.source)
        raise MarketError(
            f"no interruption estimate for {cloud} (not even a default)",
            hint="rebuild the package data with scripts/build_catalog.py",
        )


@functools.lru_cache(maxsize=1)
def load_interruption_model() -> InterruptionModel:
    """The shipped estimates (spotwise/data/catalog/interruption.csv)."""
    ref = resources.files("spotwise") / "data" / "catalog" / "interruption.csv"
    return InterruptionModel(read_rates(ref.read_text(encoding="utf-8")))
