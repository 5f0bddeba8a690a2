"""Azure Retail Prices API ingest against recorded-format pages served on loopback HTTP."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spotwise.errors import IngestError
from spotwise.market.prices import PriceStore, ingest
from spotwise.market.sources import parse_timestamp
from spotwise.market.sources.azure import URL_ENV, AzureRetailSource, build_filter

NOW = 1_800_000_000.0


def item(sku: str, size: str, region: str, price: float, *, spot: bool = False, **over):
    """One item with the public API's field names and shapes."""
    suffix = " Spot" if spot else ""
    base = {
        "currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
        "armRegionName": region, "location": {"eastus": "US East", "westeurope": "EU West"}[region],
        "effectiveStartDate": "2024-03-01T00:00:00Z", "meterId": f"m-{sku}-{region}{suffix}",
        "meterName": f"{size}{suffix}", "productId": "DZH318Z0BQ4K",
        "skuId": f"DZH318Z0BQ4K/{len(sku):04d}", "productName": "Virtual Machines NCSv3 Series",
        "skuName": f"{size}{suffix}", "serviceName": "Virtual Machines",
        "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute", "unitOfMeasure": "1 Hour",
        "type": "Consumption", "isPrimaryMeterRegion": True, "armSkuName": sku,
    }  # fmt: skip
    base.update(over)
    return base


PAGES = [
    [
        item("Standard_NC24s_v3", "NC24s v3", "eastus", 12.24),
        item("Standard_NC24s_v3", "NC24s v3", "eastus", 2.2620, spot=True),
        item("Standard_NC24s_v3", "NC24s v3", "eastus", 12.24 + 1.472,
             productName="Virtual Machines NCSv3 Series Windows"),
        item("Standard_NC24s_v3", "NC24s v3 Low Priority", "eastus", 2.448),
    ],
    [
        item("Standard_NC24s_v3", "NC24s v3", "westeurope", 13.46,
             effectiveStartDate="2024-03-01T00:00:00+01:00"),
        item("Standard_NC24s_v3", "NC24s v3", "westeurope", 2.488, spot=True),
        item("Standard_NC24s_v3", "NC24s v3", "westeurope", 80000.0, type="Reservation",
             unitOfMeasure="1 Hour", reservationTerm="1 Year"),
        item("Standard_NC24s_v3", "NC24s v3", "westeurope", 9.0, type="DevTestConsumption"),
    ],
    [
        item("Standard_ND96asr_v4", "ND96asr v4", "eastus", 27.197),
        {k: v for k, v in item("Standard_ND96asr_v4", "ND96asr v4", "eastus", 5.98, spot=True)
         .items() if k != "retailPrice"},
        item("Standard_ND96asr_v4", "ND96asr v4", "westeurope", 30.0, currencyCode="EUR"),
        item("Standard_ND96asr_v4", "ND96asr v4", "westeurope", 6.2, spot=True,
             isPrimaryMeterRegion=False),
    ],
]  # fmt: skip


class _RetailHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        self.server.seen.append(query)  # type: ignore[attr-defined]
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "500":
            return self._send(500, b'{"error": "boom"}')
        if mode == "html":
            return self._send(200, b"<html>maintenance</html>")
        skip = int(query.get("$skip", ["0"])[0])
        page = skip // 4
        rest = {k: v[0] for k, v in query.items() if k != "$skip"}
        next_link = (
            f"http://127.0.0.1:{self.server.server_address[1]}{url.path}?"
            + urllib.parse.urlencode({**rest, "$skip": skip + 4})
            if page + 1 < len(PAGES)
            else None
        )
        body = {"BillingCurrency": "USD", "CustomerEntityId": "Default",
                "CustomerEntityType": "Retail", "Items": PAGES[page],
                "NextPageLink": next_link, "Count": len(PAGES[page])}  # fmt: skip
        self._send(200, json.dumps(body).encode())

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def retail_api(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RetailHandler)
    server.seen = []  # type: ignore[attr-defined]
    server.mode = "ok"  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(URL_ENV, f"http://127.0.0.1:{server.server_address[1]}/api/retail/prices")
    yield server
    server.shutdown()
    server.server_close()


def test_all_pages_followed_and_only_linux_payg_kept(retail_api, tmp_path):
    source = AzureRetailSource(skus=["Standard_NC24s_v3", "Standard_ND96asr_v4"])
    with PriceStore(tmp_path / "p.db") as store:
        report = ingest(store, source, now=lambda: NOW)
        rows = {(r.region, r.instance_type, r.market): r for r in store.history()}
    assert source.pages == 3
    assert set(rows) == {
        ("eastus", "Standard_NC24s_v3", "on-demand"), ("eastus", "Standard_NC24s_v3", "spot"),
        ("westeurope", "Standard_NC24s_v3", "on-demand"),
        ("westeurope", "Standard_NC24s_v3", "spot"), ("eastus", "Standard_ND96asr_v4", "on-demand"),
    }  # fmt: skip
    assert rows[("eastus", "Standard_NC24s_v3", "spot")].usd_per_hour == 2.262
    assert rows[("eastus", "Standard_NC24s_v3", "on-demand")].zone == ""
    west = rows[("westeurope", "Standard_NC24s_v3", "on-demand")]
    assert west.ts == parse_timestamp("2024-02-29T23:00:00Z")  # +01:00 converted to UTC
    # item 10 lacks retailPrice, item 11 is priced in EUR: reported, the rest stored
    errors = [(e.line, e.message.split()[0]) for e in report.errors]
    assert errors == [(10, "unreadable"), (11, "currency")]
    first = retail_api.seen[0]
    assert first["api-version"] and "armSkuName eq 'Standard_NC24s_v3'" in first["$filter"][0]
    assert [q.get("$skip") for q in retail_api.seen] == [None, ["4"], ["8"]]


def test_reingest_is_idempotent(retail_api, tmp_path):
    with PriceStore(tmp_path / "p.db") as store:
        ingest(store, AzureRetailSource(skus=["Standard_NC24s_v3"]), now=lambda: NOW)
        again = ingest(store, AzureRetailSource(skus=["Standard_NC24s_v3"]), now=lambda: NOW)
        assert again.stored == 0 and store.count() == 5


@pytest.mark.parametrize(("mode", "match"), [("500", "HTTP 500"), ("html", "not JSON")])
def test_server_trouble_is_an_ingest_error(retail_api, tmp_path, mode, match):
    retail_api.mode = mode
    with PriceStore(tmp_path / "p.db") as store, pytest.raises(IngestError, match=match):
        ingest(store, AzureRetailSource(skus=["Standard_NC24s_v3"]))


def test_unreachable_and_bad_urls():
    with pytest.raises(IngestError, match="cannot reach"):
        list(AzureRetailSource(base_url="http://127.0.0.1:9/x", skus=["a"]).fetch())
    with pytest.raises(IngestError, match="http"):
        AzureRetailSource(base_url="file:///etc/passwd")


def test_filter_defaults_to_the_catalog_gpu_skus():
    text = AzureRetailSource(base_url="http://127.0.0.1:1/p").first_url()
    assert "Standard_ND96asr_v4" in urllib.parse.unquote(text)
    assert build_filter(["A"], ["eastus"]) == (
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
        "(armSkuName eq 'A') and (armRegionName eq 'eastus')"
    )
