"""The PriceSource contract (shipped in :mod:`spotwise.testing`) over every registered price
source: the file formats from files written here, the cloud APIs through their loopback doubles
(moto's EC2 for AWS, recorded-format pages for Azure's Retail Prices API)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from spotwise.market.sources import PRICE_SOURCES, PriceRecord, PriceSource, RowError
from spotwise.market.sources.aws import AwsSpotPriceSource
from spotwise.market.sources.awsjson import AwsCliJsonSource
from spotwise.market.sources.azure import AzureRetailSource
from spotwise.market.sources.csvfile import CsvSource
from spotwise.testing import PriceSourceContract, StaticPriceSource


def _csv(request: pytest.FixtureRequest, tmp: Path) -> PriceSource:
    path = tmp / "prices.csv"
    path.write_text(
        "cloud,region,zone,instance_type,market,usd_per_hour,timestamp\n"
        "aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.918,2026-05-01T12:00:00Z\n"
        "aws,us-east-1,,p3.2xlarge,on-demand,3.06,2026-05-01T12:00:00Z\n"
        "aws,us-east-1,us-east-1b,p3.2xlarge,spot,not-a-price,2026-05-01T12:00:00Z\n"
    )
    return CsvSource(path)


def _aws_json(request: pytest.FixtureRequest, tmp: Path) -> PriceSource:
    path = tmp / "history.json"
    row = {"AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge",
           "ProductDescription": "Linux/UNIX", "SpotPrice": "0.918000",
           "Timestamp": "2026-05-01T12:00:00+00:00"}  # fmt: skip
    path.write_text(json.dumps({"SpotPriceHistory": [row]}))
    return AwsCliJsonSource(path)


def _aws(request: pytest.FixtureRequest, tmp: Path) -> PriceSource:
    request.getfixturevalue("aws_env")
    return AwsSpotPriceSource(regions=["us-east-1"], instance_types=["g4dn.xlarge", "p3.2xlarge"])


def _azure(request: pytest.FixtureRequest, tmp: Path) -> PriceSource:
    request.getfixturevalue("retail_api")
    return AzureRetailSource(skus=["Standard_NC24s_v3"])


STATIC_ROWS = [
    PriceRecord("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "spot", 1.1, 1_770_000_000,
                "static"),
    RowError(2, "unreadable row"),
]  # fmt: skip

SOURCES: dict[str, Callable[[pytest.FixtureRequest, Path], PriceSource]] = {
    "aws": _aws,
    "aws-json": _aws_json,
    "azure": _azure,
    "csv": _csv,
    "static": lambda request, tmp: StaticPriceSource(STATIC_ROWS),
}


class TestPriceSources(PriceSourceContract):
    @pytest.fixture(params=sorted(SOURCES))
    def source(self, request: pytest.FixtureRequest, tmp_path: Path) -> PriceSource:
        return SOURCES[request.param](request, tmp_path)


def test_every_registered_price_source_runs_the_contract() -> None:
    assert set(PRICE_SOURCES.names()) <= set(SOURCES), "add the source to SOURCES"
