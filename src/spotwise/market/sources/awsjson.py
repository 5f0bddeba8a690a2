"""Spot price history as the AWS CLI prints it: ``aws ec2 describe-spot-price-history`` JSON.

What an AWS user has at hand without boto3 or credentials on the machine that runs spotwise:
``{"SpotPriceHistory": [{"AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge",
"ProductDescription": "Linux/UNIX", "SpotPrice": "0.918000", "Timestamp": "..."}, ...]}``
(or the list alone, from ``--query SpotPriceHistory``). The region is the zone's name without
its letter (``us-east-1a``, Local Zone ``us-west-2-lax-1a``: ``us-west-2``); only Linux prices
are kept, as from the CSV dumps and the API.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spotwise.echo import printable, shown
from spotwise.errors import IngestError
from spotwise.market.sources import PriceRecord, RowError, SourceQuery, parse_timestamp
from spotwise.market.sources.aws import LINUX_PRODUCTS

MAX_FILE_BYTES = 1 << 30  # a year of every GPU type in every region is ~200 MB of JSON
MAX_CELL = 1024  # characters of one field: zone, type, price and time are a few dozen
_REGION = re.compile(r"([a-z]{2}(?:-gov)?-[a-z]+-\d+)")
_FIELDS = ("AvailabilityZone", "InstanceType", "ProductDescription", "SpotPrice", "Timestamp")


def looks_like_json(path: Path) -> bool:
    """Whether the file starts (after blanks) with ``{`` or ``[``: a CSV header does not."""
    try:
        with path.open("rb") as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return False
    return head[:1] in (b"{", b"[")


def region_of_zone(zone: str) -> str:
    match = _REGION.match(zone)
    if not match:
        raise IngestError(f"AvailabilityZone {shown(zone)} is not an AWS zone name")
    return match.group(1)


class AwsCliJsonSource:
    """Records from one ``describe-spot-price-history`` JSON file; items it cannot use become
    RowError with their position in the list."""

    @classmethod
    def from_query(cls, query: SourceQuery) -> list[AwsCliJsonSource]:
        return [cls(path) for path in query.need_paths("aws-json")]

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"aws-json:{printable(self.path.name, 80)}"

    def fetch(self) -> Iterator[PriceRecord | RowError]:
        for n, item in enumerate(self._items(), 1):
            try:
                record = self._record(item, n)
            except (IngestError, ValueError) as exc:
                message = exc.message if isinstance(exc, IngestError) else str(exc)
                yield RowError(n, f"item {n}: {printable(message, 200)}", self.name)
                continue
            if record is not None:
                yield record

    def _items(self) -> list[Any]:
        where = printable(str(self.path))
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                raise IngestError(
                    f"{where}: larger than {MAX_FILE_BYTES >> 20:,} MiB",
                    hint="fetch fewer regions or a shorter --start-time per file",
                )
            with self.path.open(encoding="utf-8-sig") as f:
                doc = json.load(f)
        except OSError as exc:
            raise IngestError(f"cannot read {where}: {exc.strerror}") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, deep nesting
            raise IngestError(
                f"{where}: not JSON ({printable(str(exc), 120)})",
                hint="save the output of aws ec2 describe-spot-price-history --output json",
            ) from None
        items = doc.get("SpotPriceHistory") if isinstance(doc, dict) else doc
        if not isinstance(items, list):
            raise IngestError(
                f"{where}: JSON without a SpotPriceHistory list",
                hint="save the output of aws ec2 describe-spot-price-history --output json",
            )
        return items

    def _record(self, item: Any, n: int) -> PriceRecord | None:
        if not isinstance(item, dict):
            raise IngestError(f"expected an object, got {shown(item)}")
        missing = [k for k in _FIELDS if not isinstance(item.get(k), str)]
        if missing:
            raise IngestError(f"no {', '.join(missing)} (text) in the item")
        long = [k for k in _FIELDS if len(item[k]) > MAX_CELL]
        if long:
            raise IngestError(f"{', '.join(long)} longer than {MAX_CELL:,} characters")
        if item["ProductDescription"] not in LINUX_PRODUCTS:
            return None
        zone = item["AvailabilityZone"]
        try:
            price = float(item["SpotPrice"])
        except ValueError:
            raise IngestError(f"SpotPrice {shown(item['SpotPrice'])} is not a number") from None
        if not 0 <= price < float("inf"):
            raise IngestError(f"SpotPrice {shown(item['SpotPrice'])} is not a price")
        return PriceRecord(
            "aws", region_of_zone(zone), zone, item["InstanceType"], "spot", price,
            parse_timestamp(item["Timestamp"]), self.name, n,
        )  # fmt: skip
