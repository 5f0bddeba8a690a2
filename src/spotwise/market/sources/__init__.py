"""Where price history comes from: one small protocol, one module per source, a registry.

A ``PriceSource`` yields :class:`PriceRecord` rows (and :class:`RowError` for rows it could not
read, with their line numbers) for :func:`spotwise.market.prices.ingest` to store. A registered
source class also offers ``from_query(query)``: the sources :class:`SourceQuery` asks for, so
``spotwise prices ingest --source NAME`` can open any of them, a plugin's too.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol, runtime_checkable

from spotwise.errors import ConfigError, IngestError
from spotwise.registry import Entry, Registry


@dataclass(frozen=True)
class PriceRecord:
    """One observed hourly price; ``ts`` is Unix seconds (UTC) since it became effective."""

    cloud: str
    region: str
    zone: str  # "" when the price is regional
    instance_type: str
    market: str  # "spot" | "on-demand"
    usd_per_hour: float
    ts: int
    source: str
    line: int = field(default=0, compare=False)  # where it came from, for error reports


@dataclass(frozen=True)
class RowError:
    """A row a source could not use; ingest reports it and goes on with the rest."""

    line: int  # 1-based line (or item number for API pages)
    message: str
    origin: str = ""


@runtime_checkable
class PriceSource(Protocol):
    name: str

    def fetch(self) -> Iterator[PriceRecord | RowError]:
        """Yield records (and unreadable rows) in any order; may do network I/O."""
        ...


@dataclass(frozen=True)
class SourceQuery:
    """What ``prices ingest`` was asked for; each source reads the fields it understands (a file
    source its ``paths``, an API source its ``regions``, ``instance_types`` and ``since``)."""

    paths: tuple[Path, ...] = ()
    regions: tuple[str, ...] = ()
    instance_types: tuple[str, ...] = ()
    since: datetime | None = None
    cloud: str | None = None  # of SkyPilot-format CSVs, whose rows do not say

    def need_paths(self, source: str) -> tuple[Path, ...]:
        """The files a file source reads, or a clear error when none were given."""
        if not self.paths:
            raise ConfigError(
                f"the {source!r} price source reads files, and none were given",
                hint=f"spotwise prices ingest --source {source} FILE...",
            )
        return self.paths


def open_sources(name: str, query: SourceQuery) -> list[PriceSource]:
    """The sources registered as ``name`` (one per file for a file source) for ``query``."""
    return list(PRICE_SOURCES.load(name).from_query(query))


PRICE_SOURCES: Registry[PriceSource] = Registry(
    "price source",
    {
        "csv": "spotwise.market.sources.csvfile:CsvSource",
        "aws": Entry("spotwise.market.sources.aws:AwsSpotPriceSource", extra="s3"),
        "azure": "spotwise.market.sources.azure:AzureRetailSource",
        "aws-json": "spotwise.market.sources.awsjson:AwsCliJsonSource",
    },
    group="spotwise.price_sources",
)


@functools.lru_cache(maxsize=65536)  # snapshot dumps repeat one time per snapshot
def parse_timestamp(text: str) -> int:
    """ISO-8601 (with 'Z', an offset, or none = UTC, as AWS and SkyPilot dumps are) -> Unix s."""
    raw = text.strip()
    if not raw:
        raise IngestError("empty timestamp")
    if raw.endswith("Z"):
        raw = raw[:-1] + "+00:00"
    # Python 3.10 accepts at most 6 fractional digits; AWS sometimes sends 9.
    raw = re.sub(r"(\.\d{6})\d+", r"\1", raw)
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise IngestError(
            f"bad timestamp {text!r}", hint="use ISO-8601, e.g. 2020-01-31T12:00:00Z"
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp())


_DIRECTIONS = {
    "e": "east", "w": "west", "n": "north", "s": "south", "c": "central",
    "ne": "northeast", "nw": "northwest", "se": "southeast", "sw": "southwest",
}  # fmt: skip


def aws_region_of_zone_id(zone_id: str) -> str:
    """'use1-az2' -> 'us-east-1' (zone *ids* name their region by a fixed abbreviation)."""
    match = re.fullmatch(r"([a-z]{2})([a-z]{1,2})(\d+)-az\d+", zone_id)
    if not match or match.group(2) not in _DIRECTIONS:
        raise IngestError(f"not an AWS availability-zone id: {zone_id!r}")
    country, direction, number = match.groups()
    return f"{country}-{_DIRECTIONS[direction]}-{number}"
