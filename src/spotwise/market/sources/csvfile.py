"""Price history from CSV dumps; the format is recognised from the header.

Formats read:

* AWS ``DescribeSpotPriceHistory`` dumps: ``timestamp,region,availability_zone,instance_type,
  product_description,spot_price_usd_per_hour``;
* AWS cross-sections by zone id: ``availability_zone_id,instance_type,product_description,
  spot_price_usd_per_hour,timestamp`` (the region follows from the id);
* SkyPilot-format catalogs and dated snapshots of them (``snapshot_utc,...,InstanceType,...,Price,
  SpotPrice,Region[,AvailabilityZone]``): one on-demand and one spot price per row;
* spotwise's own: ``cloud,region,zone,instance_type,market,usd_per_hour,timestamp``.

Only Linux prices are kept from AWS dumps (other operating systems add licence fees).

Files are read as UTF-8, with or without the byte-order mark that Excel's "CSV UTF-8" writes;
a file that is not valid UTF-8 is read as Latin-1 (every byte is a character there, so nothing
is lost) with a warning. A row whose key fields (instance type, region, ...) are empty would
be stored under a key nobody can ask for, so it is rejected with its line number.
"""

from __future__ import annotations

import codecs
import csv
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotwise.echo import printable, shown
from spotwise.errors import IngestError
from spotwise.market.catalog import GPU_MEMORY_GB, canonical_gpu, gcp_attached_type, gcp_vm_gpus
from spotwise.market.sources import (
    PriceRecord,
    RowError,
    SourceQuery,
    aws_region_of_zone_id,
    parse_timestamp,
)

log = logging.getLogger(__name__)

GCP_N1_GPUS = frozenset({"K80", "P4", "P100", "T4", "V100"})  # attached to N1 hosts
LINUX = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
MAX_CELL = 1024  # characters of one cell: names, prices and times are a few dozen

_AWS_HISTORY = {"timestamp", "region", "availability_zone", "instance_type",
                "product_description", "spot_price_usd_per_hour"}  # fmt: skip
_AWS_ZONE_IDS = {"availability_zone_id", "instance_type", "product_description",
                 "spot_price_usd_per_hour", "timestamp"}  # fmt: skip
_SKYPILOT = {"InstanceType", "Price", "Region"}
_SPOTWISE = {"cloud", "region", "zone", "instance_type", "market", "usd_per_hour", "timestamp"}
# Columns that must not be empty, per format ("" zones are regional prices, so allowed there).
_AWS_HISTORY_KEYS = ("region", "availability_zone", "instance_type")
_AWS_ZONE_ID_KEYS = ("availability_zone_id", "instance_type")
_SPOTWISE_KEYS = ("cloud", "region", "instance_type", "market")
_SKYPILOT_KEYS = ("Region",)  # InstanceType: empty on GCP's GPU-only rows; see skypilot_row


@dataclass(frozen=True)
class SkyRow:
    """One SkyPilot-format catalog row, normalised (hardware facts plus both prices)."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpus: int
    gpu_mem_gb: float
    vcpus: float
    ram_gb: float
    host_included: bool
    on_demand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    ts: int | None  # snapshot time, when the file has one


def _num(text: str | None) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


def skypilot_row(row: Mapping[str, str], cloud: str) -> SkyRow | None:
    """Normalise one row; None for rows that are not whole-GPU offers (CPU-only, fractional)."""
    itype = (row.get("InstanceType") or "").strip()
    acc = (row.get("AcceleratorName") or "").strip()
    info = row.get("GpuInfo") or ""
    mib = re.search(r"SizeInMiB'?\"?:\s*(\d+)", info)
    mem = int(mib.group(1)) / 1024 if mib else None
    host_included = True
    if cloud == "gcp" and not itype:
        if acc not in GCP_N1_GPUS:
            return None  # GPU-only rows of GPUs that come inside a2/a3/g2 VMs: priced there
        count = int(float(row.get("AcceleratorCount") or 0))
        itype, gpu, host_included = gcp_attached_type(acc, count), acc, False
    elif cloud == "gcp" and (vm := gcp_vm_gpus(itype)):
        if row.get("_gpus_priced") != "1":
            return None  # host-only price: see combine_gcp_rows
        gpu, count = vm
    else:
        if not itype:
            raise IngestError("empty InstanceType")
        if not acc:
            return None
        raw_count = float(row.get("AcceleratorCount") or 0)
        if raw_count < 1 or raw_count != int(raw_count):
            return None  # fractional GPUs (Azure NV A10 v5, AWS g6f) are not training machines
        gpu, count = canonical_gpu(acc, mem), int(raw_count)
    if not itype or count < 1:
        return None
    region = (row.get("Region") or "").strip()
    if not region:
        raise IngestError("row has no Region")
    snapshot = row.get("snapshot_utc")
    return SkyRow(
        cloud=cloud, region=region, zone=(row.get("AvailabilityZone") or "").strip(),
        instance_type=itype, gpu=gpu, gpus=count,
        gpu_mem_gb=mem if mem else GPU_MEMORY_GB.get(gpu, 0.0),
        vcpus=_num(row.get("vCPUs")) or 0.0, ram_gb=_num(row.get("MemoryGiB")) or 0.0,
        host_included=host_included, on_demand_usd_per_hour=_num(row.get("Price")),
        spot_usd_per_hour=_num(row.get("SpotPrice")),
        ts=parse_timestamp(snapshot) if snapshot else None,
    )  # fmt: skip


def combine_gcp_rows(rows: list[dict[str, str]]) -> None:
    """Add the GPU price to GCP VMs with built-in GPUs (a2, a3, a4, g2), in place.

    SkyPilot's GCP catalog prices those VMs' vCPUs and memory on the VM row and the GPUs on a
    separate GPU-only row of the same zone and snapshot (a2-highgpu-1g: 0.739 + A100 x1 2.934 =
    3.673 $/h in us-central1). A VM row without its GPU row is left unpriced (dropped later).
    """
    gpu_rows = {
        (r.get("snapshot_utc", ""), r.get("AvailabilityZone", ""), r["AcceleratorName"],
         int(float(r["AcceleratorCount"] or 0))): r
        for r in rows
        if not (r.get("InstanceType") or "").strip() and r.get("AcceleratorName")
    }  # fmt: skip
    for r in rows:
        vm = gcp_vm_gpus((r.get("InstanceType") or "").strip())
        if vm is None:
            continue
        key = (r.get("snapshot_utc", ""), r.get("AvailabilityZone", ""), vm[0], vm[1])
        gpu = gpu_rows.get(key)
        for col in ("Price", "SpotPrice"):
            host, acc = _num(r.get(col)), _num(gpu.get(col)) if gpu else None
            r[col] = "" if host is None or acc is None else f"{host + acc:.6g}"
        r["_gpus_priced"] = "1"


def detect_encoding(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """``utf-8-sig`` (which also reads UTF-8 without a BOM) if the whole file decodes as UTF-8,
    else ``latin-1``. Decided before parsing, so no row is read under the wrong encoding."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with path.open("rb") as f:
        try:
            while chunk := f.read(chunk_bytes):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return "latin-1"
    return "utf-8-sig"


def empty_keys(row: Mapping[str, str | None], keys: tuple[str, ...]) -> list[str]:
    """The key columns of ``row`` that are empty or blank."""
    return [k for k in keys if not (row.get(k) or "").strip()]


def infer_cloud(path: Path, header: list[str]) -> str | None:
    name = path.name.lower()
    for cloud in ("gcp", "azure", "lambda", "aws"):
        if cloud in name:
            return cloud
    if "Generation" in header:
        return "azure"
    return None


class CsvSource:
    """Records from one CSV file; malformed rows become RowError with their line number."""

    @classmethod
    def from_query(cls, query: SourceQuery) -> list[CsvSource]:
        return [cls(path, cloud=query.cloud) for path in query.need_paths("csv")]

    def __init__(self, path: str | Path, cloud: str | None = None, default_ts: int | None = None):
        self.path = Path(path)
        self.cloud = cloud
        self.default_ts = default_ts  # for catalogs without a snapshot time
        self.name = f"csv:{self.path.name}"

    def fetch(self) -> Iterator[PriceRecord | RowError]:
        try:
            encoding = detect_encoding(self.path)
            handle = self.path.open(newline="", encoding=encoding)
        except OSError as exc:
            raise IngestError(f"cannot read {self.path}: {exc.strerror}") from exc
        if encoding == "latin-1":
            log.warning(
                "%s is not valid UTF-8; reading it as Latin-1 (save it as UTF-8 if "
                "names look wrong)",
                self.path.name,
            )
        with handle:
            cells = _bounded(csv.reader(handle))
            first = next(cells, None)
            header = first[1] if first is not None and not isinstance(first, RowError) else []
            parse, cloud, keys = self._parser(header)
            rows: Iterator[tuple[int, dict[str, str]] | RowError] = (
                item if isinstance(item, RowError) else (item[0], _as_dict(header, item[1]))
                for item in cells
            )
            if cloud == "gcp":  # GPU prices sit on other rows of the file: read it whole
                listed = list(rows)
                combine_gcp_rows(
                    [i[1] for i in listed if not isinstance(i, RowError) and None not in i[1]]
                )
                rows = iter(listed)
            for item in rows:
                if isinstance(item, RowError):
                    yield RowError(item.line, item.message, self.path.name)
                    continue
                line, row = item
                try:
                    if None in row or any(v is None for v in row.values()):
                        raise IngestError(f"expected {len(header)} fields")
                    if empty := empty_keys(row, keys):
                        raise IngestError(f"empty {', '.join(empty)}")
                    yield from parse(row, line)
                except (IngestError, ValueError) as exc:
                    message = printable(str(exc).splitlines()[0], 200)
                    yield RowError(line, message, self.path.name)

    def _parser(
        self, header: list[str]
    ) -> tuple[
        Callable[[Mapping[str, str], int], Iterator[PriceRecord]], str | None, tuple[str, ...]
    ]:
        """The row parser for this header, the cloud it implies and its key columns."""
        cols = set(header)
        if cols >= _AWS_HISTORY:
            return self._aws_history, "aws", _AWS_HISTORY_KEYS
        if cols >= _AWS_ZONE_IDS:
            return self._aws_zone_ids, "aws", _AWS_ZONE_ID_KEYS
        if cols >= _SPOTWISE:
            return self._spotwise, None, _SPOTWISE_KEYS
        if cols >= _SKYPILOT:
            cloud = self.cloud or infer_cloud(self.path, header)
            if cloud is None:
                raise IngestError(
                    f"{printable(self.path.name, 80)}: a SkyPilot-format file, but which cloud?",
                    hint="pass --cloud aws|gcp|azure|lambda",
                )
            return (lambda row, line: self._skypilot(row, cloud, line)), cloud, _SKYPILOT_KEYS
        raise IngestError(
            f"{printable(self.path.name, 80)}: unknown CSV format "
            f"(header: {printable(','.join(header[:8]), 120)})",
            hint="columns cloud,region,zone,instance_type,market,usd_per_hour,timestamp work",
        )

    def _aws(
        self, region: str, zone: str, row: Mapping[str, str], line: int
    ) -> Iterator[PriceRecord]:
        if row["product_description"] not in LINUX:
            return
        yield PriceRecord(
            "aws", region, zone, row["instance_type"], "spot",
            _price(row["spot_price_usd_per_hour"]), parse_timestamp(row["timestamp"]), self.name,
            line,
        )  # fmt: skip

    def _aws_history(self, row: Mapping[str, str], line: int) -> Iterator[PriceRecord]:
        yield from self._aws(row["region"], row["availability_zone"], row, line)

    def _aws_zone_ids(self, row: Mapping[str, str], line: int) -> Iterator[PriceRecord]:
        zone = row["availability_zone_id"]
        yield from self._aws(aws_region_of_zone_id(zone), zone, row, line)

    def _spotwise(self, row: Mapping[str, str], line: int) -> Iterator[PriceRecord]:
        if row["market"] not in ("spot", "on-demand"):
            raise IngestError(f"market must be spot or on-demand, got {row['market']!r}")
        yield PriceRecord(
            row["cloud"], row["region"], row["zone"], row["instance_type"], row["market"],
            _price(row["usd_per_hour"]), parse_timestamp(row["timestamp"]), self.name, line,
        )  # fmt: skip

    def _skypilot(self, row: Mapping[str, str], cloud: str, line: int) -> Iterator[PriceRecord]:
        sky = skypilot_row(row, cloud)
        if sky is None:
            return
        ts = sky.ts if sky.ts is not None else self.default_ts
        if ts is None:
            raise IngestError("catalog row without snapshot_utc", hint="pass a --as-of time")
        # on-demand prices are regional on every cloud; spot ones may be per zone
        if sky.on_demand_usd_per_hour is not None:
            yield PriceRecord(cloud, sky.region, "", sky.instance_type, "on-demand",
                              _check(sky.on_demand_usd_per_hour), ts, self.name, line)  # fmt: skip
        if sky.spot_usd_per_hour is not None:
            yield PriceRecord(cloud, sky.region, sky.zone, sky.instance_type, "spot",
                              _check(sky.spot_usd_per_hour), ts, self.name, line)  # fmt: skip


def _bounded(reader: Any) -> Iterator[tuple[int, list[str]] | RowError]:
    """``(line, cells)`` per record, or a RowError for a record with a cell longer than
    ``MAX_CELL`` (or one the csv module refuses: over its 128 KiB field limit), after which
    reading goes on with the next record."""
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield RowError(reader.line_num, f"unreadable row ({printable(str(exc), 120)})")
            continue
        line = reader.line_num
        if not cells:
            continue  # a blank line, as DictReader skips it
        long = max(cells, key=len)
        if len(long) > MAX_CELL:
            yield RowError(
                line, f"a cell of {len(long):,} characters (at most {MAX_CELL:,}): {shown(long)}"
            )
            continue
        yield line, cells


def _as_dict(header: list[str], cells: list[str]) -> dict[str, str]:
    """One record as DictReader makes it: missing cells None, extra ones under the key None
    (both refused per row by ``fetch``)."""
    row: dict[Any, Any] = dict(zip(header, cells, strict=False))
    for name in header[len(cells) :]:
        row[name] = None
    if len(cells) > len(header):
        row[None] = cells[len(header) :]
    return row


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise IngestError(f"price {text!r} is not a number") from exc
    return _check(value)


def _check(value: float) -> float:
    if not value >= 0 or value == float("inf"):
        raise IngestError(f"price {value!r} is not a non-negative number")
    return value
