"""AWS spot price history through ``DescribeSpotPriceHistory`` (boto3, paginated, per region).

Endpoints follow the SDK's own conventions, so ``AWS_ENDPOINT_URL`` (or ``endpoint_url=``) points
the whole thing at a loopback emulator in tests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from spotwise.errors import IngestError
from spotwise.market.sources import PriceRecord, RowError, SourceQuery
from spotwise.registry import require

log = logging.getLogger(__name__)
LINUX_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")


def catalog_gpu_types() -> list[str]:
    """The AWS instance types with GPUs or accelerators in the shipped catalog."""
    from spotwise.market.catalog import load_catalog

    return sorted({o.instance_type for o in load_catalog().offers if o.cloud == "aws"})


class AwsSpotPriceSource:
    """Spot prices of GPU types in every (or the given) region, all pages of each."""

    name = "aws:DescribeSpotPriceHistory"

    @classmethod
    def from_query(cls, query: SourceQuery) -> list[AwsSpotPriceSource]:
        since = query.since
        return [cls(regions=query.regions, instance_types=query.instance_types, start=since)]

    def __init__(
        self,
        *,
        regions: Sequence[str] | None = None,
        instance_types: Sequence[str] | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        endpoint_url: str | None = None,
        page_size: int = 1000,
    ) -> None:
        self.regions = list(regions) if regions else None
        self.instance_types = list(instance_types) if instance_types else None
        self.start, self.end = start, end
        self.endpoint_url = endpoint_url
        self.page_size = page_size
        self.pages = 0  # pages read, for reports and tests
        self._session: Any = None

    def _client(self, region: str) -> Any:
        if self._session is None:  # one session per source: credentials are not cached globally
            boto3 = require("boto3", "s3", "AWS spot price ingest")
            self._session = boto3.session.Session()
        return self._session.client("ec2", region_name=region, endpoint_url=self.endpoint_url)

    def _regions(self) -> list[str]:
        if self.regions:
            return self.regions
        reply = self._call(lambda: self._client("us-east-1").describe_regions(), "us-east-1")
        return sorted(r["RegionName"] for r in reply["Regions"])

    def fetch(self) -> Iterator[PriceRecord | RowError]:
        types = self.instance_types or catalog_gpu_types()
        for region in self._regions():
            yield from self._region(region, types)

    def _region(self, region: str, types: list[str]) -> Iterator[PriceRecord | RowError]:
        params: dict[str, Any] = {
            "InstanceTypes": types,
            "ProductDescriptions": list(LINUX_PRODUCTS),
            "PaginationConfig": {"PageSize": self.page_size},
        }
        if self.start:
            params["StartTime"] = self.start
        if self.end:
            params["EndTime"] = self.end
        paginator = self._client(region).get_paginator("describe_spot_price_history")
        pages = self._call(lambda: iter(paginator.paginate(**params)), region)
        item_no = 0
        while True:
            page = self._call(lambda: next(pages, None), region)
            if page is None:
                return
            self.pages += 1
            for item in page.get("SpotPriceHistory", []):
                item_no += 1
                try:
                    if item["ProductDescription"] not in LINUX_PRODUCTS:
                        continue
                    yield PriceRecord(
                        "aws", region, item["AvailabilityZone"], item["InstanceType"], "spot",
                        float(item["SpotPrice"]), int(item["Timestamp"].timestamp()), self.name,
                        item_no,
                    )  # fmt: skip
                except (KeyError, ValueError, AttributeError) as exc:
                    yield RowError(item_no, f"unreadable item in {region}: {exc!r}", self.name)

    @staticmethod
    def _call(fn: Any, region: str) -> Any:
        """Translate SDK failures into IngestError at the edge (credentials never logged)."""
        botocore_exceptions = require("botocore.exceptions", "s3", "AWS spot price ingest")
        try:
            return fn()
        except botocore_exceptions.NoCredentialsError as exc:
            raise IngestError(
                "no AWS credentials for DescribeSpotPriceHistory",
                hint="configure a profile or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            ) from exc
        except botocore_exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "?")
            raise IngestError(
                f"AWS refused DescribeSpotPriceHistory in {region}: {code}",
                hint="the credentials need ec2:DescribeSpotPriceHistory (and ec2:DescribeRegions)",
            ) from exc
        except botocore_exceptions.BotoCoreError as exc:
            raise IngestError(
                f"cannot reach the EC2 API in {region}: {exc}",
                hint="check the network or AWS_ENDPOINT_URL",
            ) from exc
