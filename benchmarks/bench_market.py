"""Market benchmark: price ingest throughput, and advise latency over a >= 1M-row price store.

1. Ingest every CSV in data/public/prices into a fresh store; report rows/s, against reading
   the same files with the bare ``csv`` module (no parsing of values, no database) in the run.
2. Grow a store to ``--rows`` (default 1,000,000) price rows: the real history plus copies of
   the real AWS p2/p3 series shifted back in time by whole spans (same places, types and prices;
   no invented values), then time the latest-price lookup behind ``spotwise advise`` for
   8 x V100, 48 h with the index, with the same GROUP BY forced to scan the table, and with a naive
   Python full scan; and the whole advise (overlay + ranking) indexed vs Python scan. p50/p95 over
   ``--repeats`` runs (fewer for the scans), and the ratios.

    .venv/bin/python benchmarks/bench_market.py [--rows 1000000] [--repeats 30]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("SPOTWISE_PLATFORM", "none")

from spotwise.market.advisor import JobRequest, advise_from_catalog, matching_offers
from spotwise.market.catalog import load_catalog
from spotwise.market.interruption import load_interruption_model
from spotwise.market.prices import _LATEST, PriceStore, catalog_with_history, ingest
from spotwise.market.sources import PriceRecord
from spotwise.market.sources.csvfile import CsvSource

ROOT = Path(__file__).resolve().parents[1]
PRICES = ROOT / "data" / "public" / "prices"


def bench_ingest(db: Path) -> None:
    files = sorted(PRICES.glob("*.csv"))
    raw_rows, raw_s = 0, 0.0
    for path in files:
        t = time.perf_counter()
        with path.open(newline="") as f:
            raw_rows += sum(1 for _ in csv.reader(f)) - 1
        raw_s += time.perf_counter() - t
    total_records, total_s = 0, 0.0
    with PriceStore(db) as store:
        for path in files:
            report = ingest(store, CsvSource(path))
            total_records += report.records
            total_s += report.seconds
            print(f"  {path.name:55s} {report.records:8,d} records {report.seconds:6.2f} s "
                  f"{report.rows_per_s:9,.0f} rows/s  {len(report.errors)} rejected")  # fmt: skip
        t = time.perf_counter()
        again = sum(ingest(store, CsvSource(p)).stored for p in files)
        reingest_s = time.perf_counter() - t
        stored = store.count()
    print(f"ingest-rows-per-s: {total_records / total_s:,.0f} ({total_records:,} records from "
          f"{raw_rows:,} CSV rows, {stored:,} distinct rows stored, {total_s:.2f} s)")  # fmt: skip
    print(f"baseline-csv-read-rows-per-s: {raw_rows / raw_s:,.0f}")
    print(f"ratio-ingest-vs-csv-read: {(total_records / total_s) / (raw_rows / raw_s):.3f}")
    print(f"re-ingest of everything: {again} rows changed, {reingest_s:.2f} s")


def grow(store: PriceStore, target: int) -> None:
    """Add time-shifted copies of the real AWS p2/p3 history until the store has ``target``."""
    base = store.history(cloud="aws", market="spot", until=1_600_000_000)
    span = max(r.ts for r in base) - min(r.ts for r in base) + 86_400
    shift = 0
    t = time.perf_counter()
    added = 0
    while store.count() < target:
        shift += span
        batch = [PriceRecord(r.cloud, r.region, r.zone, r.instance_type, r.market,
                             r.usd_per_hour, r.ts - shift, "bench-shifted-copy")
                 for r in base]  # fmt: skip
        added += store.upsert(batch)
    seconds = time.perf_counter() - t
    print(f"grew the store to {store.count():,} rows ({added:,} shifted copies of {len(base):,} "
          f"real rows, {added / seconds:,.0f} rows/s bulk upsert)")  # fmt: skip


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def _timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return percentiles(samples)


def bench_advise(store: PriceStore, repeats: int) -> None:
    catalog, model = load_catalog(), load_interruption_model()
    job = JobRequest(compute_hours=48, gpu="V100", gpus=8, deadline_hours=60)
    offers = matching_offers(job, catalog.offers, catalog)
    types = sorted({(o.cloud, o.instance_type) for o in offers})
    now = int(time.time())

    def advise(full_scan: bool) -> list:
        live = catalog_with_history(catalog, store, offers, at=now, full_scan=full_scan)
        return advise_from_catalog(job, live, model)

    # The same GROUP BY with the index switched off by '+' on the key columns: a table scan.
    scan_sql = (
        "SELECT region, zone, market, usd_per_hour, MAX(ts) FROM prices "
        "WHERE +cloud = ? AND +instance_type = ? AND ts <= ? GROUP BY market, region, zone"
    )

    def sql_scan() -> list:
        return [row for c, t in types for row in store._db.execute(scan_sql, (c, t, now))]

    assert [p.to_dict() for p in advise(False)] == [p.to_dict() for p in advise(True)]

    def place(r: PriceRecord) -> tuple[str, ...]:
        return (r.cloud, r.region, r.zone, r.instance_type, r.market)

    assert sorted(store.latest(types, at=now), key=place) == sorted(
        store.latest_full_scan(types, at=now), key=place
    )
    plan = "SELECT MAX(ts) FROM prices WHERE {c}cloud='aws' AND {c}instance_type='p3.16xlarge' " \
           "AND ts <= 0 GROUP BY market, region, zone"  # fmt: skip
    print(f"query plan, latest:  {store.query_plan(_LATEST, (now, 'aws', 'p3.16xlarge'))}")
    print(f"query plan, group:   {store.query_plan(plan.format(c=''))}")
    print(f"query plan, scan:    {store.query_plan(plan.format(c='+'))}")
    few = max(3, repeats // 5)
    print(f"latest prices of the {len(types)} instance types that fit 8 x V100:")

    def group_by() -> list:
        sql = scan_sql.replace("+", "")
        return [row for c, t in types for row in store._db.execute(sql, (c, t, now))]

    lookup = {
        "indexed": _timed(lambda: store.latest(types, at=now), repeats),
        "type-range": _timed(group_by, few),
        "sql-scan": _timed(sql_scan, few),
        "python-scan": _timed(lambda: store.latest_full_scan(types, at=now), few),
    }
    for name, (p50, p95) in lookup.items():
        print(f"  lookup-{name:12s} p50 {p50 * 1000:8.1f} ms  p95 {p95 * 1000:8.1f} ms")
    print("whole advise (history overlay + ranking of every placement):")
    whole = {
        "indexed": _timed(lambda: advise(False), repeats),
        "python-scan": _timed(lambda: advise(True), few),
    }
    for name, (p50, p95) in whole.items():
        print(f"  advise-{name:12s} p50 {p50 * 1000:8.1f} ms  p95 {p95 * 1000:8.1f} ms")
    top = advise(False)[0]
    print(f"best placement: {top.cloud} {top.region} {top.zone} {top.instance_type} {top.market} "
          f"${top.expected_cost_usd:,.0f} in {top.expected_hours:.1f} h")  # fmt: skip
    fast = lookup["indexed"][0]
    print(f"ratio-lookup-type-range-vs-indexed-p50: {lookup['type-range'][0] / fast:.1f}")
    print(f"ratio-lookup-sql-scan-vs-indexed-p50: {lookup['sql-scan'][0] / fast:.1f}")
    print(f"ratio-lookup-python-scan-vs-indexed-p50: {lookup['python-scan'][0] / fast:.1f}")
    print(f"ratio-advise-python-scan-vs-indexed-p50: "
          f"{whole['python-scan'][0] / whole['indexed'][0]:.1f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if not PRICES.is_dir():
        print(f"needs the price data at {PRICES}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "prices.db"
        print("1. ingest data/public/prices")
        bench_ingest(db)
        print(f"2. advise over a store of >= {args.rows:,} rows")
        with PriceStore(db) as store:
            grow(store, args.rows)
            bench_advise(store, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
