"""Azure virtual-machine prices from the public Retail Prices REST API (no account needed).

Format (https://prices.azure.com/api/retail/prices): pages of ``{"Items": [...],
"NextPageLink": url | null, "Count": n}``; each item has ``armSkuName``, ``armRegionName``,
``retailPrice``, ``unitOfMeasure``, ``type``, ``skuName``/``meterName`` (spot SKUs end in
"Spot"), ``productName`` ("... Windows" for Windows meters), ``isPrimaryMeterRegion`` and
``effectiveStartDate``. Kept: USD, Linux, pay-as-you-go ("Consumption"), hourly, primary meter
region; dropped: Windows, Low Priority, DevTest and reservation rows.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from spotwise import settings
from spotwise.errors import IngestError
from spotwise.market.sources import PriceRecord, RowError, SourceQuery, parse_timestamp

DEFAULT_URL = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"


def catalog_gpu_skus() -> list[str]:
    from spotwise.market.catalog import load_catalog

    return sorted({o.instance_type for o in load_catalog().offers if o.cloud == "azure"})


def build_filter(skus: Sequence[str], regions: Sequence[str] = ()) -> str:
    """OData ``$filter`` for VM consumption prices of the given SKUs (and regions)."""
    parts = ["serviceName eq 'Virtual Machines'", "priceType eq 'Consumption'"]
    if skus:
        parts.append("(" + " or ".join(f"armSkuName eq '{s}'" for s in skus) + ")")
    if regions:
        parts.append("(" + " or ".join(f"armRegionName eq '{r}'" for r in regions) + ")")
    return " and ".join(parts)


def parse_item(item: dict[str, Any], number: int, origin: str) -> PriceRecord | RowError | None:
    """One API item -> record; None for rows that are not Linux pay-as-you-go hourly VMs."""
    try:
        sku_name = item.get("skuName", "")
        meter = item.get("meterName", "")
        if (
            item.get("serviceName") != "Virtual Machines"
            or item.get("type") != "Consumption"
            or "Windows" in item.get("productName", "")
            or "Low Priority" in sku_name
            or "Low Priority" in meter
            or not item.get("isPrimaryMeterRegion", True)
        ):
            return None
        if item.get("unitOfMeasure") != "1 Hour":
            return RowError(number, f"unit {item.get('unitOfMeasure')!r} is not '1 Hour'", origin)
        if item.get("currencyCode", "USD") != "USD":
            return RowError(number, f"currency {item['currencyCode']!r} is not USD", origin)
        price = float(item["retailPrice"])
        if price < 0:
            return RowError(number, f"negative price {price}", origin)
        market = "spot" if sku_name.endswith("Spot") or meter.endswith("Spot") else "on-demand"
        return PriceRecord(
            "azure", item["armRegionName"], "", item["armSkuName"], market, price,
            parse_timestamp(item["effectiveStartDate"]), origin, number,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, IngestError) as exc:
        return RowError(number, f"unreadable item: {exc!s}".splitlines()[0], origin)


class AzureRetailSource:
    """All pages of the Retail Prices API for GPU VM SKUs, following ``NextPageLink``."""

    name = "azure:retail-prices"

    @classmethod
    def from_query(cls, query: SourceQuery) -> list[AzureRetailSource]:
        return [cls(skus=query.instance_types or None, regions=query.regions)]

    def __init__(
        self,
        *,
        base_url: str | None = None,
        skus: Sequence[str] | None = None,
        regions: Sequence[str] = (),
        timeout_s: float = 30.0,
        max_pages: int = 10_000,
    ) -> None:
        self.base_url = base_url or settings.AZURE_PRICES_URL.text() or DEFAULT_URL
        if urllib.parse.urlsplit(self.base_url).scheme not in ("http", "https"):
            raise IngestError(f"the Azure prices URL must be http(s): {self.base_url!r}")
        self.skus = list(skus) if skus is not None else None
        self.regions = list(regions)
        self.timeout_s = timeout_s
        self.max_pages = max_pages
        self.pages = 0

    def first_url(self) -> str:
        skus = self.skus if self.skus is not None else catalog_gpu_skus()
        query = {"api-version": API_VERSION, "currencyCode": "USD",
                 "$filter": build_filter(skus, self.regions)}  # fmt: skip
        return f"{self.base_url}?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}"

    def fetch(self) -> Iterator[PriceRecord | RowError]:
        url: str | None = self.first_url()
        number = 0
        while url:
            if self.pages >= self.max_pages:
                raise IngestError(f"more than {self.max_pages} pages", hint="narrow the filter")
            page = self._get(url)
            self.pages += 1
            items = page.get("Items")
            if not isinstance(items, list):
                raise IngestError(
                    f"page {self.pages} has no 'Items' list: not a Retail Prices reply"
                )
            for item in items:
                number += 1
                parsed = parse_item(item, number, self.name)
                if parsed is not None:
                    yield parsed
            url = page.get("NextPageLink")

    def _get(self, url: str) -> dict[str, Any]:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise IngestError(f"refusing to follow a non-HTTP NextPageLink: {url!r}")
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                data = json.load(reply)
        except urllib.error.HTTPError as exc:
            raise IngestError(
                f"Azure Retail Prices API answered HTTP {exc.code} for page {self.pages + 1}",
                hint="retry later; a 429 means throttling",
            ) from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise IngestError(
                f"cannot reach the Azure Retail Prices API: {exc}",
                hint=f"check the network or {settings.AZURE_PRICES_URL.name}",
            ) from exc
        except json.JSONDecodeError as exc:
            raise IngestError(f"page {self.pages + 1} is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise IngestError(f"page {self.pages + 1} is not a JSON object")
        return data
