#!/usr/bin/env python3
"""Derive the catalog and interruption estimates shipped in the package from data/public.

Run from the repository root:
    .venv/bin/python scripts/build_catalog.py [--shared PATH]   (default data/public)
Writes src/spotwise/data/catalog/{offers.csv,interruption.csv} and prints a summary; the output
is committed, so a fresh install ranks placements with no network and no data/ folder.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import statistics
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from spotwise.market.catalog import CLOUDS, Offer, canonical_gpu, write_offers
from spotwise.market.interruption import (
    PRIOR_WEIGHT_H,
    RateRow,
    band_rate,
    posterior_rate,
    trace_evidence,
    write_rates,
)
from spotwise.market.sources.csvfile import combine_gcp_rows, skypilot_row

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "spotwise" / "data" / "catalog"
AWS_VANTAGE = "catalog/aws_gpu_instances_ondemand_2026-01-21_vantage_via_tsaol.csv"
AWS_SKYPILOT = "catalog/aws_skypilot_catalog_v7_pfamily_g6_snapshot.csv"
LAMBDA = "catalog/lambda_vms_skypilot_format_2026-05-20.csv"
GCP = "prices/gcp_gpu_catalog_snapshots.csv"
AZURE = "prices/azure_gpu_catalog_snapshots.csv"
ADVISOR = "advisor/spot-advisor-data_2024-02-28.json"
TRACES = "traces/availability/1-node"
PREEMPTION = "traces/preemption/1-node"
TRACE_TYPES = {"v100_1": "p3.2xlarge", "v100_8": "p3.16xlarge",
               "k80_1": "p2.xlarge", "k80_8": "p2.16xlarge"}  # fmt: skip


def _gb(text: str) -> float:
    match = re.match(r"([\d.]+)\s*GiB|([\d.]+)\s*GB", text)
    return float(next(g for g in match.groups() if g)) if match else 0.0


def aws_offers(shared: Path, advisor: dict) -> list[Offer]:
    """On-demand from the 2026 Vantage table; spot per zone id from the SkyPilot snapshot where
    it has the type, else estimated per region as on-demand x (1 - advisor savings)."""
    offers: list[Offer] = []
    hardware: dict[str, dict] = {}
    with (shared / AWS_VANTAGE).open(newline="") as f:
        for row in csv.DictReader(f):
            count = float(row["gpu_count"])
            if count < 1 or count != int(count):
                continue  # fractional GPU slices
            mem = _gb(row["gpu_memory"])
            if mem >= 320:  # the source gives the instance total for these (p4d, p5...)
                mem /= count
            spec = dict(
                gpu=canonical_gpu(row["gpu"], mem),
                gpus=int(count),
                gpu_mem_gb=round(mem, 1),
                vcpus=float(row["vcpu"]),
                ram_gb=_gb(row["memory"]),
            )
            hardware[row["instance_type"]] = spec
            offers.append(
                Offer(
                    "aws",
                    row["region"],
                    "",
                    row["instance_type"],
                    "on-demand",
                    float(row["ondemand_usd_hr"]),
                    **spec,
                    price_source="vantage 2026-01-21",
                    as_of="2026-01-21",
                )
            )
    zone_spot: set[tuple[str, str]] = set()
    with (shared / AWS_SKYPILOT).open(newline="") as f:
        for row in csv.DictReader(f):
            sky = skypilot_row(row, "aws")
            if sky is None or sky.spot_usd_per_hour is None or sky.instance_type not in hardware:
                continue
            zone_spot.add((sky.region, sky.instance_type))
            offers.append(
                Offer(
                    "aws",
                    sky.region,
                    sky.zone,
                    sky.instance_type,
                    "spot",
                    sky.spot_usd_per_hour,
                    **hardware[sky.instance_type],
                    price_source="skypilot-catalog v7 snapshot",
                    as_of="2025",
                )
            )
    for od in [o for o in offers if o.market == "on-demand"]:
        entry = advisor["spot_advisor"].get(od.region, {}).get("Linux", {}).get(od.instance_type)
        if entry is None or (od.region, od.instance_type) in zone_spot:
            continue
        offers.append(
            Offer(
                "aws",
                od.region,
                "",
                od.instance_type,
                "spot",
                round(od.usd_per_hour * (1 - entry["s"] / 100), 6),
                **hardware[od.instance_type],
                price_source="advisor-estimate",
                as_of="2024-02-28",
            )
        )
    return offers


def aws_reserved(shared: Path) -> list[tuple[str, str, float]]:
    """(region, type, 1-year reserved $/h) where the Vantage table has one (for `spotwise roi`)."""
    with (shared / AWS_VANTAGE).open(newline="") as f:
        return sorted(
            (r["region"], r["instance_type"], float(r["reserved_usd_hr"]))
            for r in csv.DictReader(f)
            if r["reserved_usd_hr"] and float(r["gpu_count"]) >= 1
        )


def _latest_snapshot(path: Path) -> tuple[str, list[dict]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    latest = max({r["snapshot_utc"] for r in rows}, key=datetime.fromisoformat)
    return latest, [r for r in rows if r["snapshot_utc"] == latest]


def snapshot_offers(shared: Path, rel: str, cloud: str) -> list[Offer]:
    """GCP/Azure: the latest snapshot; spot per zone (GCP) or region (Azure), on-demand per
    region (the cheapest zone's, which on GCP is the region's price)."""
    if rel == LAMBDA:
        with (shared / rel).open(newline="") as f:
            stamp, rows = "2026-05-20", list(csv.DictReader(f))
    else:
        stamp, rows = _latest_snapshot(shared / rel)
        stamp = stamp[:10]
        if cloud == "gcp":
            combine_gcp_rows(rows)
    source = f"{Path(rel).name} ({stamp})"
    by_key: dict[tuple, Offer] = {}
    for row in rows:
        sky = skypilot_row(row, cloud)
        if sky is None:
            continue
        spec = dict(
            gpu=sky.gpu,
            gpus=sky.gpus,
            gpu_mem_gb=round(sky.gpu_mem_gb, 1),
            vcpus=sky.vcpus,
            ram_gb=sky.ram_gb,
            host_included=sky.host_included,
        )
        for market, usd, zone in (
            ("on-demand", sky.on_demand_usd_per_hour, ""),
            ("spot", sky.spot_usd_per_hour, sky.zone),
        ):
            if usd is None or usd <= 0:
                continue
            key = (sky.region, zone, sky.instance_type, market)
            if key not in by_key or usd < by_key[key].usd_per_hour:
                by_key[key] = Offer(
                    cloud,
                    sky.region,
                    zone,
                    sky.instance_type,
                    market,
                    usd,
                    **spec,
                    price_source=source,
                    as_of=stamp,
                )
    return list(by_key.values())


def interruption_rows(
    shared: Path, advisor: dict, gpu_types: set[str]
) -> tuple[list[RateRow], float]:
    ranges = {r["index"]: r for r in advisor["ranges"]}
    assert set(ranges) == {0, 1, 2, 3, 4}, "advisor bands changed; review BAND_MONTHLY_PROBABILITY"
    priors: dict[tuple[str, str], float] = {}
    for region, oses in advisor["spot_advisor"].items():
        for itype, entry in oses.get("Linux", {}).items():
            if itype in gpu_types:
                priors[(region, itype)] = band_rate(entry["r"])
    evidence: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for path in sorted((shared / TRACES).glob("*/*.json")):
        zone, _, kind = path.stem.partition("_")
        itype = TRACE_TYPES.get(kind)
        if itype is None:
            continue
        data = json.loads(path.read_text())
        events, exposure = trace_evidence(data["data"], data["metadata"]["gap_seconds"])
        for key in ((zone[:-1], zone, itype), (zone[:-1], "", itype)):
            evidence[key][0] += events
            evidence[key][1] += exposure
    # The bands rank places; the traces set the scale: scale every band rate by the ratio of
    # interruptions seen in the traces to those the bands predict over the same exposure.
    seen = sum(e for (r, z, t), (e, _) in evidence.items() if not z and (r, t) in priors)
    predicted = sum(
        priors[(r, t)] * x for (r, z, t), (_, x) in evidence.items() if not z and (r, t) in priors
    )
    scale = seen / predicted if predicted else 1.0
    print(f"advisor band rates scaled by {scale:.1f} to match {seen:.0f} trace interruptions")
    priors = {k: v * scale for k, v in priors.items()}
    default = statistics.fmean(priors.values())
    rows = [
        RateRow(
            c, "", "", "", default, 0, 0.0, default, "default: mean scaled AWS GPU advisor prior"
        )
        for c in CLOUDS
        if c != "gcp"
    ]
    rows += gcp_rows(shared, default)
    for (region, itype), prior in sorted(priors.items()):
        events, exposure = evidence.get((region, "", itype), (0, 0.0))
        source = "advisor band (scaled) + traces" if exposure else "advisor band (scaled)"
        rows.append(
            RateRow(
                "aws",
                region,
                "",
                itype,
                prior,
                int(events),
                exposure,
                posterior_rate(prior, int(events), exposure),
                source,
            )
        )
    for (region, zone, itype), (events, exposure) in sorted(evidence.items()):
        if zone:
            prior = priors.get((region, itype), default)
            rows.append(
                RateRow(
                    "aws",
                    region,
                    zone,
                    itype,
                    prior,
                    int(events),
                    exposure,
                    posterior_rate(prior, int(events), exposure),
                    "traces (zone)",
                )
            )
    return rows, scale


def gcp_rows(shared: Path, prior: float) -> list[RateRow]:
    """GCP has no advisor feed; its spot preemption traces (c3-highcpu-88 VMs, 2023-04) move the
    default prior, for the cloud and per traced region. They are CPU VMs: GPU VMs may differ."""
    evidence: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for path in sorted((shared / PREEMPTION).glob("gcp-*/*.json")):
        zone = path.stem.partition("_")[0]
        data = json.loads(path.read_text())
        events, exposure = trace_evidence(data["data"], data["metadata"]["gap_seconds"])
        for key in ("", zone.rsplit("-", 1)[0]):
            evidence[key][0] += events
            evidence[key][1] += exposure
    source = "default prior + GCP preemption traces (c3-highcpu-88)"
    return [
        RateRow("gcp", region, "", "", prior, int(events), exposure,
                posterior_rate(prior, int(events), exposure), source)
        for region, (events, exposure) in sorted(evidence.items())
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT / "data" / "public")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    shared: Path = args.shared
    advisor = json.loads((shared / ADVISOR).read_text())
    offers = (
        aws_offers(shared, advisor)
        + snapshot_offers(shared, GCP, "gcp")
        + snapshot_offers(shared, AZURE, "azure")
        + snapshot_offers(shared, LAMBDA, "lambda")
    )
    offers.sort(key=lambda o: (o.cloud, o.instance_type, o.region, o.zone, o.market))
    gpu_types = {o.instance_type for o in offers if o.cloud == "aws"}
    rates, scale = interruption_rows(shared, advisor, gpu_types)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "offers.csv").open("w", newline="") as f:
        write_offers(offers, f)
    with (args.out / "interruption.csv").open("w", newline="") as f:
        write_rates(rates, f)
    inputs = [AWS_VANTAGE, AWS_SKYPILOT, GCP, AZURE, LAMBDA, ADVISOR]
    inputs += [str(p.relative_to(shared)) for p in sorted((shared / TRACES).glob("*/*.json"))]
    inputs += [
        str(p.relative_to(shared)) for p in sorted((shared / PREEMPTION).glob("gcp-*/*.json"))
    ]
    with (args.out / "sources.json").open("w") as f:
        json.dump(
            {
                "built_by": "scripts/build_catalog.py",
                "inputs": {
                    rel: hashlib.sha256((shared / rel).read_bytes()).hexdigest() for rel in inputs
                },
                "advisor_band_scale": round(scale, 3),
            },
            f,
            indent=1,
        )
        f.write("\n")
    reserved = aws_reserved(shared)
    with (args.out / "reserved.csv").open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["cloud", "region", "instance_type", "usd_per_hour"])
        writer.writerows(("aws", region, itype, usd) for region, itype, usd in reserved)
    counts = defaultdict(int)
    for o in offers:
        counts[(o.cloud, o.market)] += 1
    print(
        f"offers: {len(offers)} "
        + ", ".join(f"{c}/{m}={n}" for (c, m), n in sorted(counts.items()))
    )
    print(f"interruption rows: {len(rates)} (prior weight {PRIOR_WEIGHT_H:g} h)")
    print(f"reserved prices: {len(reserved)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
