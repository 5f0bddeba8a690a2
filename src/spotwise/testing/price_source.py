"""The PriceSource contract: what ``prices ingest`` relies on from every source of prices.

Subclass :class:`PriceSourceContract` and define a ``source`` fixture returning a source whose
data (a file, a loopback API) holds at least one usable price. ``ingest`` relies on these
promises: rows are :class:`~spotwise.market.sources.PriceRecord` (or :class:`RowError` with
the line it came from), with a cloud, a known market, a finite non-negative price and a Unix
time; reading twice yields the same records, so re-ingesting stores nothing new.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from spotwise.market.sources import PriceRecord, PriceSource, RowError

MARKETS = ("spot", "on-demand")


class StaticPriceSource:
    """An in-memory source of given rows: the smallest source there is, and a stand-in for an
    API in tests of the code that stores and ranks prices."""

    def __init__(self, rows: Sequence[PriceRecord | RowError], name: str = "static") -> None:
        self.rows = list(rows)
        self.name = name

    def fetch(self) -> Iterator[PriceRecord | RowError]:
        yield from self.rows


def _records(source: PriceSource) -> list[PriceRecord]:
    rows = list(source.fetch())
    for row in rows:
        assert isinstance(row, (PriceRecord, RowError)), f"{source.name} yielded {row!r}"
        if isinstance(row, RowError):
            assert row.line >= 1 and row.message
    return [row for row in rows if isinstance(row, PriceRecord)]


class PriceSourceContract:
    """Needs a ``source`` fixture: a source with at least one usable price."""

    def test_is_a_price_source(self, source: PriceSource) -> None:
        assert isinstance(source, PriceSource)
        assert isinstance(source.name, str) and source.name

    def test_records_are_complete_and_sane(self, source: PriceSource) -> None:
        records = _records(source)
        assert records, f"{source.name} yielded no usable price"
        for r in records:
            assert r.cloud and r.region and r.instance_type, r
            assert r.market in MARKETS, r
            assert math.isfinite(r.usd_per_hour) and r.usd_per_hour >= 0, r
            assert isinstance(r.ts, int) and r.ts > 0, r
            assert isinstance(r.zone, str) and r.source

    def test_reading_again_yields_the_same_records(self, source: PriceSource) -> None:
        assert sorted(_records(source), key=repr) == sorted(_records(source), key=repr)
