"""Market: GPU catalog, spot price history, interruption estimates and the cost advisor.

Pure: no providers, no torch. The advisor is a function of plain values (job, offers,
interruption model); the catalog and the interruption estimates ship as package data.
"""

from __future__ import annotations

from spotwise.market.advisor import (
    JobRequest,
    Placement,
    advise,
    advise_from_catalog,
    expected_wall_hours,
    matching_offers,
)
from spotwise.market.catalog import Catalog, InstanceType, Offer, load_catalog
from spotwise.market.interruption import InterruptionModel, RateEstimate, load_interruption_model

__all__ = [
    "Catalog",
    "InstanceType",
    "InterruptionModel",
    "JobRequest",
    "Offer",
    "Placement",
    "RateEstimate",
    "advise",
    "advise_from_catalog",
    "expected_wall_hours",
    "load_catalog",
    "load_interruption_model",
    "matching_offers",
]
