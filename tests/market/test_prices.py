"""Price history store and CSV ingest: real data slices, bad rows, time zones, idempotence."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from spotwise.errors import IngestError
from spotwise.market.catalog import load_catalog
from spotwise.market.prices import (
    _LATEST,
    PriceStore,
    catalog_with_history,
    default_db_path,
    ingest,
)
from spotwise.market.sources import PriceRecord, aws_region_of_zone_id, parse_timestamp
from spotwise.market.sources.csvfile import CsvSource

PRICES = Path(__file__).resolve().parents[2] / "data" / "public" / "prices"
FIXED_NOW = 1_800_000_000.0  # 2027-01-15: after every real price


def head(src: Path, dst: Path, lines: int) -> Path:
    with src.open() as f:
        dst.write_text("".join(itertools.islice(f, lines)))
    return dst


@pytest.fixture()
def store(tmp_path):
    with PriceStore(tmp_path / "prices.db") as s:
        yield s


def test_default_db_lives_in_spotwise_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    assert default_db_path() == tmp_path / "home" / "prices.db"
    with PriceStore() as s:
        assert s.count() == 0
    assert (tmp_path / "home" / "prices.db").exists()


def test_aws_history_dump_round_trips(store, tmp_path):
    src = head(PRICES / "aws_p2_p3_spot_price_history.csv", tmp_path / "aws.csv", 201)
    report = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert (report.records, report.stored, report.errors) == (200, 200, [])
    first = store.history(instance_type="p2.16xlarge", zone="eu-west-1a", limit=1)[0]
    # 2019-12-22T13:41:55.000Z,eu-west-1,eu-west-1a,p2.16xlarge,Linux/UNIX,4.665600
    assert first == PriceRecord(
        "aws", "eu-west-1", "eu-west-1a", "p2.16xlarge", "spot", 4.6656, 1577022115, first.source
    )


def test_reingest_is_idempotent_and_corrections_update(store, tmp_path):
    src = head(PRICES / "aws_p2_p3_spot_price_history.csv", tmp_path / "aws.csv", 51)
    ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    again = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert (again.records, again.stored, store.count()) == (50, 0, 50)
    lines = src.read_text().splitlines()
    lines[1] = lines[1].replace("4.665600", "4.000000")
    src.write_text("\n".join(lines) + "\n")
    fixed = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert (fixed.stored, store.count()) == (1, 50)
    assert store.history(limit=1)[0].usd_per_hour == 4.0


def test_malformed_rows_are_reported_by_line_and_the_rest_ingested(store, tmp_path):
    src = tmp_path / "bad.csv"
    src.write_text(
        "timestamp,region,availability_zone,instance_type,product_description,"
        "spot_price_usd_per_hour\n"
        "2020-01-01T00:00:00Z,us-east-1,us-east-1a,p3.2xlarge,Linux/UNIX,0.918\n"
        "2020-01-01T01:00:00Z,us-east-1,us-east-1a,p3.2xlarge,Linux/UNIX,cheap\n"
        "not-a-time,us-east-1,us-east-1a,p3.2xlarge,Linux/UNIX,0.9\n"
        "2020-01-01T02:00:00Z,us-east-1,us-east-1a,p3.2xlarge\n"
        "2020-01-01T03:00:00Z,us-east-1,us-east-1a,p3.2xlarge,Linux/UNIX,-1\n"
        "2020-01-01T04:00:00Z,us-east-1,us-east-1a,p3.2xlarge,Windows,3.1\n"
        "2020-01-01T05:00:00Z,us-east-1,us-east-1a,p3.2xlarge,Linux/UNIX,0.93\n"
    )
    report = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert report.records == 2 and store.count() == 2
    assert [(e.line, e.message.split()[0]) for e in report.errors] == [
        (3, "price"), (4, "bad"), (5, "expected"), (6, "price")
    ]  # fmt: skip


def test_prices_in_the_future_are_rejected(store, tmp_path):
    src = tmp_path / "future.csv"
    src.write_text(
        "cloud,region,zone,instance_type,market,usd_per_hour,timestamp\n"
        "aws,us-east-1,,p3.2xlarge,on-demand,3.06,2026-01-01T00:00:00Z\n"
        "aws,us-east-1,,p3.2xlarge,on-demand,3.06,2031-01-01T00:00:00Z\n"
    )
    report = ingest(store, CsvSource(src), now=lambda: 1_790_000_000.0)
    assert report.records == 1
    [err] = report.errors
    assert err.line == 3 and "future" in err.message


def test_time_zones_are_converted_to_utc():
    assert parse_timestamp("2026-04-02T11:17:42-05:00") == parse_timestamp("2026-04-02T16:17:42Z")
    assert parse_timestamp("2026-04-02T16:17:42") == parse_timestamp("2026-04-02T16:17:42+00:00")
    assert parse_timestamp("2006-01-02T15:04:05.999999999Z") == 1136214245


def test_zone_ids_name_their_region():
    assert aws_region_of_zone_id("use1-az2") == "us-east-1"
    assert aws_region_of_zone_id("apse2-az1") == "ap-southeast-2"
    assert aws_region_of_zone_id("cac1-az4") == "ca-central-1"
    with pytest.raises(IngestError):
        aws_region_of_zone_id("us-east-1a")


def test_cross_section_by_zone_id(store, tmp_path):
    src = head(PRICES / "aws_gpu_spot_prices_2022-05-31_cross_section.csv", tmp_path / "x.csv", 40)
    report = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert report.records > 0 and not report.errors
    # the file's first rows are zones use1-az2 .. of us-east-1 and others, each in its region
    for record in store.history():
        assert record.region == aws_region_of_zone_id(record.zone)
    assert {r.region for r in store.history(zone="use1-az2")} == {"us-east-1"}


def test_gcp_snapshot_rows_price_vms_with_their_gpus(store, tmp_path):
    report = ingest(store, CsvSource(PRICES / "gcp_gpu_catalog_snapshots.csv"),
                    now=lambda: FIXED_NOW)  # fmt: skip
    assert not report.errors
    last = parse_timestamp("2026-04-28T04:38:43Z")
    [od] = store.history(
        instance_type="a2-highgpu-1g", zone="", region="us-central1", market="on-demand", since=last
    )
    assert od.usd_per_hour == pytest.approx(3.67339, rel=1e-5)
    spot = store.history(instance_type="a2-highgpu-1g", zone="us-central1-a", market="spot")
    assert len(spot) == 16  # one per snapshot


def test_skypilot_file_needs_a_cloud(store, tmp_path):
    src = tmp_path / "catalog.csv"
    src.write_text("InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region\n")
    with pytest.raises(IngestError, match="which cloud"):
        ingest(store, CsvSource(src))


def test_unknown_format_and_all_bad_rows(store, tmp_path):
    src = tmp_path / "x.csv"
    src.write_text("a,b\n1,2\n")
    with pytest.raises(IngestError, match="unknown CSV format"):
        ingest(store, CsvSource(src))
    src.write_text("cloud,region,zone,instance_type,market,usd_per_hour,timestamp\n"
                   "aws,us-east-1,,p3.2xlarge,reserved,1,2020-01-01T00:00:00Z\n")  # fmt: skip
    with pytest.raises(IngestError, match="no usable rows"):
        ingest(store, CsvSource(src))


def test_latest_matches_full_scan_and_respects_time(store, tmp_path):
    src = head(PRICES / "aws_p2_p3_spot_price_history.csv", tmp_path / "aws.csv", 3000)
    ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    types = [("aws", "p3.2xlarge"), ("aws", "p2.16xlarge")]

    def place(r: PriceRecord) -> tuple[str, str, str]:
        return (r.region, r.zone, r.instance_type)

    fast = sorted(store.latest(types, at=int(FIXED_NOW)), key=place)
    slow = sorted(store.latest_full_scan(types, at=int(FIXED_NOW)), key=place)
    assert fast == slow and fast
    early = parse_timestamp("2020-01-01T00:00:00Z")
    assert all(r.ts <= early for r in store.latest(types, at=early))
    # one seek per place: the small places table drives, prices is only ever SEARCHed
    plan = store.query_plan(_LATEST, (0, "aws", "p3.2xlarge"))
    assert plan.startswith("SEARCH p USING PRIMARY KEY") and "SCAN" not in plan


def test_newer_history_overrides_the_catalog(store, tmp_path):
    src = tmp_path / "new.csv"
    src.write_text(
        "cloud,region,zone,instance_type,market,usd_per_hour,timestamp\n"
        "aws,us-east-1,use1-az1,p3.16xlarge,spot,7.5,2026-06-01T00:00:00Z\n"
        "aws,us-east-1,use1-az1,p3.16xlarge,spot,9.9,2020-06-01T00:00:00Z\n"
    )
    ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    catalog = load_catalog()
    offers = catalog.select(gpu="V100", count=8, cloud="aws")
    live = catalog_with_history(catalog, store, offers, at=int(FIXED_NOW))
    assert live.price("aws", "us-east-1", "p3.16xlarge", "spot", zone="use1-az1") == 7.5
    stale = catalog_with_history(catalog, store, offers, at=parse_timestamp("2021-01-01T00:00Z"))
    assert stale.price("aws", "us-east-1", "p3.16xlarge", "spot", zone="use1-az1") == (
        catalog.price("aws", "us-east-1", "p3.16xlarge", "spot", zone="use1-az1")
    )


SPOTWISE_HEADER = "cloud,region,zone,instance_type,market,usd_per_hour,timestamp"
ROW = "aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.9,2026-01-01T00:00:00Z"


def test_utf8_with_a_byte_order_mark_from_excel(store, tmp_path, caplog):
    src = tmp_path / "excel.csv"
    src.write_bytes(f"{SPOTWISE_HEADER}\r\n{ROW}\r\n".encode("utf-8-sig"))
    assert src.read_bytes()[:3] == b"\xef\xbb\xbf"
    report = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert (report.records, report.errors) == (1, [])
    assert store.history(instance_type="p3.2xlarge")[0].zone == "us-east-1a"
    assert "Latin-1" not in caplog.text  # UTF-8, BOM or not, needs no warning


def test_latin1_file_is_read_with_a_warning(store, tmp_path, caplog):
    src = tmp_path / "latin.csv"
    src.write_bytes(f"{SPOTWISE_HEADER}\naws,sa-east-1,São Paulo a,p3.2xlarge,spot,1.2,"
                    "2026-01-01T00:00:00Z\n".encode("latin-1"))  # fmt: skip
    with pytest.raises(UnicodeDecodeError):
        src.read_text(encoding="utf-8")
    report = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert (report.records, report.errors) == (1, [])
    assert store.history(instance_type="p3.2xlarge")[0].zone == "São Paulo a"
    assert "latin.csv is not valid UTF-8; reading it as Latin-1" in caplog.text


def test_invalid_utf8_late_in_a_big_file_still_means_latin1(store, tmp_path):
    src = tmp_path / "late.csv"
    rows = [ROW.replace("0.9", f"0.{i + 1}").replace("01T00", f"01T{i % 24:02d}") for i in range(9)]
    body = f"{SPOTWISE_HEADER}\n" + "\n".join(rows) + "\naws,us-east-1,Zoné,p3.2xlarge,spot,1,2026"
    src.write_bytes(body.encode("latin-1") + b"-01-02\n")
    report = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert report.records == 10 and report.errors == []
    assert {r.zone for r in store.history(instance_type="p3.2xlarge")} == {"us-east-1a", "Zoné"}


AWS_HISTORY = (
    "timestamp,region,availability_zone,instance_type,product_description,spot_price_usd_per_hour"
)
AWS_ZONE_IDS = (
    "availability_zone_id,instance_type,product_description,spot_price_usd_per_hour,timestamp"
)
SKYPILOT = "InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region,snapshot_utc"


@pytest.mark.parametrize(
    ("header", "good", "bad", "message"),
    [
        (
            SPOTWISE_HEADER,
            ROW,
            "aws,us-east-1,us-east-1a,,spot,0.9,2026-01-01",
            "empty instance_type",
        ),
        (SPOTWISE_HEADER, ROW, "aws, ,us-east-1a,p3.2xlarge,spot,0.9,2026-01-01", "empty region"),
        (SPOTWISE_HEADER, ROW, ",us-east-1,,,spot,0.9,2026-01-01", "empty cloud, instance_type"),
        (
            AWS_HISTORY,
            "2026-01-01T00:00:00Z,us-east-1,us-east-1a,p3.2xlarge,Linux/UNIX,0.9",
            "2026-01-01T00:00:00Z,us-east-1,,p3.2xlarge,Linux/UNIX,0.9",
            "empty availability_zone",
        ),
        (
            AWS_ZONE_IDS,
            "use1-az2,p3.2xlarge,Linux/UNIX,0.9,2026-01-01",
            "use1-az2,,Linux/UNIX,0.9,2026-01-01",
            "empty instance_type",
        ),
        (
            SKYPILOT,
            "Standard_NC6s_v3,V100,1,3.06,0.9,eastus,2026-01-01",
            ",V100,1,3.06,0.9,eastus,2026-01-01",
            "empty InstanceType",
        ),
    ],
    ids=[
        "spotwise-type",
        "spotwise-blank-region",
        "spotwise-two",
        "aws-zone",
        "aws-zone-id",
        "skypilot-type",
    ],
)
def test_rows_with_empty_key_fields_are_rejected_with_their_line(
    store, tmp_path, header, good, bad, message
):
    src = tmp_path / "azure.csv"  # the name tells the SkyPilot-format case its cloud
    src.write_text(f"{header}\n{good}\n{bad}\n")
    report = ingest(store, CsvSource(src), now=lambda: FIXED_NOW)
    assert [(e.line, e.message) for e in report.errors] == [(3, message)]
    assert report.records >= 1 and report.records == store.count()  # the good row is stored
    assert all(r.instance_type.strip() and r.region.strip() for r in store.history())
