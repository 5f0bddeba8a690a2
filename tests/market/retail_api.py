"""A loopback Azure Retail Prices API serving recorded-format pages (real field names and
shapes), for the Azure price source's tests and its contract case."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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


@contextmanager
def serving() -> Iterator[ThreadingHTTPServer]:
    """The API on an ephemeral port; ``server.seen`` records each query, ``server.mode`` set to
    ``"500"`` or ``"html"`` makes it misbehave."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RetailHandler)
    server.seen = []  # type: ignore[attr-defined]
    server.mode = "ok"  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def url_of(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/api/retail/prices"
