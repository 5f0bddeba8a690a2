"""Azure Retail Prices API ingest against recorded-format pages served on loopback HTTP."""

from __future__ import annotations

import urllib.parse

import pytest

from spotwise.errors import IngestError
from spotwise.market.prices import PriceStore, ingest
from spotwise.market.sources import parse_timestamp
from spotwise.market.sources.azure import AzureRetailSource, build_filter

NOW = 1_800_000_000.0


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
