"""Spot and on-demand price history: one SQLite file, ingest from any PriceSource.

The table's primary key is (cloud, instance_type, market, region, zone, ts), so re-ingesting the
same dump changes nothing, and "latest price of these types" reads one index range per type. A
second index on (cloud, region, zone, instance_type, ts) serves place-first questions. Times are
stored as Unix seconds (UTC); sources convert whatever zone their timestamps carry.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from spotwise import settings
from spotwise.errors import IngestError, MarketError
from spotwise.market.catalog import Catalog, Offer
from spotwise.market.sources import PriceRecord, PriceSource, RowError

SCHEMA_VERSION = 1
FUTURE_TOLERANCE_S = 300  # clocks drift; more than this ahead is a wrong timestamp

_SCHEMA = """
CREATE TABLE IF NOT EXISTS prices (
    cloud TEXT NOT NULL,
    instance_type TEXT NOT NULL,
    market TEXT NOT NULL CHECK (market IN ('spot', 'on-demand')),
    region TEXT NOT NULL,
    zone TEXT NOT NULL,
    ts INTEGER NOT NULL,
    usd_per_hour REAL NOT NULL CHECK (usd_per_hour >= 0),
    source TEXT NOT NULL,
    PRIMARY KEY (cloud, instance_type, market, region, zone, ts)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS prices_by_place ON prices (cloud, region, zone, instance_type, ts);
CREATE TABLE IF NOT EXISTS places (
    cloud TEXT NOT NULL,
    instance_type TEXT NOT NULL,
    market TEXT NOT NULL,
    region TEXT NOT NULL,
    zone TEXT NOT NULL,
    PRIMARY KEY (cloud, instance_type, market, region, zone)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_UPSERT = """
INSERT INTO prices (cloud, instance_type, market, region, zone, ts, usd_per_hour, source)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (cloud, instance_type, market, region, zone, ts) DO UPDATE
SET usd_per_hour = excluded.usd_per_hour, source = excluded.source
WHERE usd_per_hour != excluded.usd_per_hour
"""

_COLUMNS = "cloud, region, zone, instance_type, market, usd_per_hour, ts, source"

# Newest row per place of one type: one index seek per place (places is small), instead of
# reading every row of the type.
_LATEST = """
SELECT p.cloud, p.region, p.zone, p.instance_type, p.market, x.usd_per_hour, x.ts, x.source
FROM places AS p CROSS JOIN prices AS x  -- CROSS JOIN: places drive the loop
  ON (x.cloud, x.instance_type, x.market, x.region, x.zone)
   = (p.cloud, p.instance_type, p.market, p.region, p.zone)
 AND x.ts = (SELECT MAX(ts) FROM prices AS y
             WHERE (y.cloud, y.instance_type, y.market, y.region, y.zone)
                 = (p.cloud, p.instance_type, p.market, p.region, p.zone) AND y.ts <= ?)
WHERE p.cloud = ? AND p.instance_type = ?
"""


def default_db_path() -> Path:
    home = str(settings.home())
    return Path(home) / "prices.db"


def _utc(ts: int) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Summary:
    cloud: str
    market: str
    rows: int
    instance_types: int
    first: str
    last: str


class PriceStore:
    """Price history in one SQLite file (``$SPOTWISE_HOME/prices.db`` by default)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path)
            # WAL: readers (advise) never wait for an ingest; a bigger page cache keeps
            # out-of-order inserts off the disk.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA cache_size=-65536")
            self._db.executescript(_SCHEMA)
            self._db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            self._db.commit()
        except (OSError, sqlite3.Error) as exc:
            raise MarketError(
                f"cannot open the price database {self.path}: {exc}",
                hint="check the path and permissions, or set SPOTWISE_HOME",
            ) from exc

    def __enter__(self) -> PriceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def upsert(self, records: Sequence[PriceRecord]) -> int:
        """Store records in one transaction; returns how many rows were new or changed."""
        before = self._db.total_changes
        rows = sorted(  # in key order, so the B-tree is appended to rather than split at random
            (r.cloud, r.instance_type, r.market, r.region, r.zone, r.ts, r.usd_per_hour, r.source)
            for r in records
        )
        places = sorted({row[:5] for row in rows})
        with self._db:
            self._db.executemany(_UPSERT, rows)
            changed = self._db.total_changes - before
            self._db.executemany("INSERT OR IGNORE INTO places VALUES (?, ?, ?, ?, ?)", places)
        return changed

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM prices").fetchone()[0])

    def summary(self) -> list[Summary]:
        rows = self._db.execute(
            "SELECT cloud, market, COUNT(*), COUNT(DISTINCT instance_type), MIN(ts), MAX(ts) "
            "FROM prices GROUP BY cloud, market ORDER BY cloud, market"
        ).fetchall()
        return [Summary(c, m, n, t, _utc(lo), _utc(hi)) for c, m, n, t, lo, hi in rows]

    def history(
        self,
        *,
        instance_type: str | None = None,
        cloud: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        market: str | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int | None = None,
    ) -> list[PriceRecord]:
        """Records matching the filters, oldest first."""
        where, args = _where(
            cloud=cloud, instance_type=instance_type, region=region, zone=zone, market=market
        )
        if since is not None:
            where.append("ts >= ?")
            args.append(since)
        if until is not None:
            where.append("ts <= ?")
            args.append(until)
        sql = f"SELECT {_COLUMNS} FROM prices"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY ts, region, zone"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [PriceRecord(*row) for row in self._db.execute(sql, args)]

    def latest(
        self, types: Iterable[tuple[str, str]], *, at: int | None = None
    ) -> list[PriceRecord]:
        """The newest record (at or before ``at``) of every place and market of each
        (cloud, instance_type): one index seek per place."""
        at = int(time.time()) if at is None else at
        out: list[PriceRecord] = []
        for cloud, itype in sorted(set(types)):
            out.extend(PriceRecord(*row) for row in self._db.execute(_LATEST, (at, cloud, itype)))
        return out

    def latest_full_scan(
        self, types: Iterable[tuple[str, str]], *, at: int | None = None
    ) -> list[PriceRecord]:
        """The same answer as :meth:`latest` by reading the whole table (benchmark baseline)."""
        at = int(time.time()) if at is None else at
        wanted = set(types)
        best: dict[tuple[str, str, str, str, str], tuple] = {}
        for row in self._db.execute(f"SELECT {_COLUMNS} FROM prices NOT INDEXED"):
            if (row[0], row[3]) in wanted and row[6] <= at:
                key = row[:5]
                if key not in best or row[6] > best[key][6]:
                    best[key] = row
        return [PriceRecord(*row) for row in best.values()]

    def query_plan(self, sql: str, args: Sequence[object] = ()) -> str:
        return " / ".join(r[-1] for r in self._db.execute("EXPLAIN QUERY PLAN " + sql, args))


def _where(**filters: str | None) -> tuple[list[str], list[object]]:
    where: list[str] = []
    args: list[object] = []
    for column, value in filters.items():
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    return where, args


@dataclass
class IngestReport:
    source: str
    records: int = 0  # usable records read
    stored: int = 0  # new or changed rows
    errors: list[RowError] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def unchanged(self) -> int:
        return self.records - self.stored

    @property
    def rows_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def ingest(
    store: PriceStore,
    source: PriceSource,
    *,
    now: Callable[[], float] = time.time,
    batch_size: int = 20_000,
    progress: Callable[[int], None] | None = None,
) -> IngestReport:
    """Read everything ``source`` yields into ``store``.

    Malformed rows and prices dated in the future are reported (with line numbers) and skipped;
    the rest is stored. Re-running the same source stores nothing new.
    """
    report = IngestReport(source.name)
    started = time.perf_counter()
    horizon = int(now()) + FUTURE_TOLERANCE_S
    batch: list[PriceRecord] = []
    for item in source.fetch():
        if isinstance(item, RowError):
            report.errors.append(item)
            continue
        if item.ts > horizon:
            report.errors.append(
                RowError(item.line, f"price dated in the future ({_utc(item.ts)})", source.name)
            )
            continue
        batch.append(item)
        if len(batch) >= batch_size:
            report.stored += store.upsert(batch)
            report.records += len(batch)
            batch.clear()
            if progress:
                progress(report.records)
    if batch:
        report.stored += store.upsert(batch)
        report.records += len(batch)
        if progress:
            progress(report.records)
    report.seconds = time.perf_counter() - started
    if report.records == 0 and report.errors:
        first = report.errors[0]
        raise IngestError(
            f"{source.name}: no usable rows; {len(report.errors)} errors, first at line "
            f"{first.line}: {first.message}",
            hint="check the file format (see docs/market.md)",
        )
    return report


def _as_of(text: str) -> int:
    """Catalog 'as_of' ('2026-04-28', '2025') -> Unix seconds at the start of that day."""
    parts = [int(p) for p in text.split("-")[:3]] if text else [1970]
    year, month, day = [*parts, 1, 1][:3]
    return int(datetime(year, month, day, tzinfo=timezone.utc).timestamp())


def catalog_with_history(
    catalog: Catalog,
    store: PriceStore,
    offers: Iterable[Offer],
    *,
    at: int | None = None,
    full_scan: bool = False,
) -> Catalog:
    """``catalog`` with the store's latest prices for the types in ``offers`` laid over it,
    where the history is newer than the catalog's own price for that type.

    ``full_scan=True`` reads the whole table instead of the index (the benchmark's baseline).
    """
    offers = list(offers)
    oldest: dict[tuple[str, str], int] = {}
    for o in offers:
        key = (o.cloud, o.instance_type)
        oldest[key] = min(oldest.get(key, 2**62), _as_of(o.as_of))
    updates = [
        (r.cloud, r.region, r.zone, r.instance_type, r.market, r.usd_per_hour,
         _utc(r.ts)[:10])
        for r in (store.latest_full_scan if full_scan else store.latest)(oldest, at=at)
        if r.ts > oldest[(r.cloud, r.instance_type)]
    ]  # fmt: skip
    return catalog.with_prices(updates) if updates else catalog
