"""AWS DescribeSpotPriceHistory ingest with the real boto3 over loopback HTTP.

Two endpoints: the shared moto server (the EC2 API as moto implements it), and a small EC2
Query-protocol server here that pages real rows from the shared price dump with NextToken, since
moto answers in one page.
"""

from __future__ import annotations

import csv
import itertools
import threading
import urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from spotwise.errors import IngestError
from spotwise.market.prices import PriceStore, ingest
from spotwise.market.sources import PRICE_SOURCES, parse_timestamp
from spotwise.market.sources.aws import AwsSpotPriceSource

DUMP = (
    Path(__file__).resolve().parents[2]
    / "data"
    / "public"
    / "prices"
    / ("aws_p2_p3_spot_price_history.csv")
)
NOW = 1_800_000_000.0


def test_registry_names_the_sources():
    assert PRICE_SOURCES.load("aws") is AwsSpotPriceSource
    assert set(PRICE_SOURCES.names()) == {"aws", "aws-json", "azure", "csv"}


def test_moto_endpoint_regions_are_listed_then_each_queried(aws_env, tmp_path):
    every = AwsSpotPriceSource(instance_types=["g4dn.xlarge"])._regions()
    assert len(every) >= 15 and {"us-east-1", "eu-west-1", "ap-northeast-1"} <= set(every)
    source = AwsSpotPriceSource(
        regions=["us-east-1", "eu-west-1"],
        instance_types=["p3.2xlarge", "g4dn.xlarge"],
    )
    with PriceStore(tmp_path / "p.db") as store:
        report = ingest(store, source, now=lambda: NOW)
        rows = store.history()
    assert {r.region for r in rows} == {"us-east-1", "eu-west-1"}
    assert all(r.zone.startswith(r.region) for r in rows)
    assert {r.instance_type for r in rows} <= {"p3.2xlarge", "g4dn.xlarge"}
    # moto stamps every price 2006-01-02T15:04:05.999999999Z at $0.00001
    assert {(r.ts, r.usd_per_hour) for r in rows} == {(1136214245, 0.00001)}
    assert report.records == len(rows) > 0 and not report.errors


def _rows(region: str, types: set[str]) -> list[dict[str, str]]:
    with DUMP.open() as f:
        reader = csv.DictReader(f)
        return [r for r in itertools.islice(reader, 4000)
                if r["region"] == region and r["instance_type"] in types]  # fmt: skip


class _Ec2Handler(BaseHTTPRequestHandler):
    """DescribeSpotPriceHistory in the EC2 Query protocol (form POST in, XML out)."""

    page_size = 7
    seen: list[dict[str, list[str]]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        form = urllib.parse.parse_qs(body)
        self.server.seen.append(form)  # type: ignore[attr-defined]
        region = self.server.region  # type: ignore[attr-defined]
        if form["Action"] == ["DescribeRegions"]:
            xml = (f"<DescribeRegionsResponse><regionInfo><item><regionName>{region}</regionName>"
                   "</item></regionInfo></DescribeRegionsResponse>")  # fmt: skip
            return self._reply(xml)
        types = {v[0] for k, v in form.items() if k.startswith("InstanceType.")}
        rows = _rows(region, types)
        start = int(form.get("NextToken", ["0"])[0])
        page = rows[start : start + self.page_size]
        items = "".join(
            f"<item><instanceType>{r['instance_type']}</instanceType>"
            f"<productDescription>{escape(r['product_description'])}</productDescription>"
            f"<spotPrice>{r['spot_price_usd_per_hour']}</spotPrice>"
            f"<timestamp>{r['timestamp']}</timestamp>"
            f"<availabilityZone>{r['availability_zone']}</availabilityZone></item>"
            for r in page
        )
        token = (f"<nextToken>{start + self.page_size}</nextToken>"
                 if start + self.page_size < len(rows) else "")  # fmt: skip
        self._reply(
            '<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            f"<requestId>r-{start}</requestId><spotPriceHistorySet>{items}</spotPriceHistorySet>"
            f"{token}</DescribeSpotPriceHistoryResponse>"
        )

    def _reply(self, xml: str, status: int = 200) -> None:
        data = xml.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass


@pytest.fixture()
def paging_ec2(aws_env):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ec2Handler)
    server.seen = []  # type: ignore[attr-defined]
    server.region = "eu-west-1"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_every_page_is_followed(paging_ec2, tmp_path):
    url = f"http://127.0.0.1:{paging_ec2.server_address[1]}"
    types = {"p2.16xlarge", "p3.2xlarge"}
    expected = _rows("eu-west-1", types)
    assert len(expected) > 3 * _Ec2Handler.page_size  # the test needs several pages
    source = AwsSpotPriceSource(
        instance_types=sorted(types), endpoint_url=url, page_size=_Ec2Handler.page_size,
        start=datetime(2019, 12, 1, tzinfo=timezone.utc),
    )  # fmt: skip
    with PriceStore(tmp_path / "p.db") as store:
        report = ingest(store, source, now=lambda: NOW)
        stored = store.history()
    assert source.pages == -(-len(expected) // _Ec2Handler.page_size)
    assert report.records == len(expected) == len(stored)
    assert {(r.zone, r.instance_type, r.ts, r.usd_per_hour) for r in stored} == {
        (e["availability_zone"], e["instance_type"], parse_timestamp(e["timestamp"]),
         float(e["spot_price_usd_per_hour"])) for e in expected
    }  # fmt: skip
    spot_calls = [f for f in paging_ec2.seen if f["Action"] == ["DescribeSpotPriceHistory"]]
    assert [f.get("NextToken") for f in spot_calls][1:3] == [["7"], ["14"]]
    assert spot_calls[0]["ProductDescription.1"] == ["Linux/UNIX"]
    assert spot_calls[0]["StartTime"][0].startswith("2019-12-01T00:00:00")


def test_unreachable_endpoint_is_an_ingest_error(aws_env, tmp_path):
    source = AwsSpotPriceSource(regions=["us-east-1"], instance_types=["p3.2xlarge"],
                                endpoint_url="http://127.0.0.1:9")  # fmt: skip
    with PriceStore(tmp_path / "p.db") as store, pytest.raises(IngestError, match="cannot reach"):
        ingest(store, source)


def test_missing_credentials_is_an_ingest_error(aws_env, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    source = AwsSpotPriceSource(regions=["us-east-1"], instance_types=["p3.2xlarge"])
    with PriceStore(tmp_path / "p.db") as store, pytest.raises(IngestError, match="credentials"):
        ingest(store, source)
