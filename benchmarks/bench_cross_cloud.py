"""Would one job spanning clouds (``providers: [aws, gcp]``) pay? Measured on the shipped data.

A job fails over between zones and regions of its provider already. Another cloud can only help
while *every* zone of the job's provider is out of spot capacity, and then it competes with the
fallback the controller already has: on-demand in the same cloud until spot comes back. Moving
instead costs the checkpoint's egress twice (out, and back when the home cloud is cheaper again).

1. From the shipped availability trace (9 zones in 3 AWS regions, 30 days, 195 s ticks): how
   often no zone of one region, and no zone at all, has spot; how many provider-wide outages,
   and how long.
2. From the shipped catalog (the cheapest spot and on-demand price per cloud) and the clouds' list
   internet egress prices: for a model of the size that fits each machine (mixed-precision Adam:
   16 bytes of training state per parameter), how long a provider-wide outage must last before
   moving to the cheapest other cloud beats on-demand at home, and how many of the measured
   outages last that long.

    .venv/bin/python benchmarks/bench_cross_cloud.py [--trace aws-02-15-2023-first30d]
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import numpy as np

os.environ.setdefault("SPOTWISE_PLATFORM", "none")

from spotwise.market.catalog import Catalog, load_catalog
from spotwise.market.traces import load_trace, shipped_trace_path, shipped_traces

# Internet egress list prices, USD per GB, first pricing tier (the vendors' pricing pages:
# AWS EC2 data transfer out, first 10 TB/month; Google Cloud premium tier, 0-1 TB worldwide;
# Azure bandwidth, first 10 TB/month from North America)
EGRESS_USD_PER_GB = {"aws": 0.09, "gcp": 0.12, "azure": 0.087}
STATE_BYTES_PER_PARAM = 16  # fp32 master weights + Adam's two moments + bf16 weights and grads


@dataclass(frozen=True)
class Machine:
    gpu: str
    count: int
    params_b: float  # billions of parameters a run on this machine typically trains


MACHINES = (Machine("V100", 1, 1.0), Machine("A100", 8, 7.0), Machine("H100", 8, 13.0))


def outages(available: np.ndarray) -> list[int]:
    """Lengths, in ticks, of the runs of ticks with no capacity."""
    lengths, run = [], 0
    for up in available:
        if up:
            if run:
                lengths.append(run)
            run = 0
        else:
            run += 1
    return lengths + ([run] if run else [])


def cheapest(catalog: Catalog, m: Machine, cloud: str, market: str) -> float | None:
    prices = [
        o.usd_per_hour
        for o in catalog.select(gpu=m.gpu, count=m.count, cloud=cloud, market=market)
        if o.host_included  # (a GCP price of the GPUs alone leaves out the host VM)
    ]
    return min(prices) if prices else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="aws-02-15-2023-first30d")
    parser.add_argument("--home", default="aws", choices=sorted(EGRESS_USD_PER_GB))
    args = parser.parse_args()

    traces = [
        load_trace(shipped_trace_path(n))
        for n in shipped_traces()
        if n.startswith(args.trace + "/")
    ]
    n = min(t.n_ticks for t in traces)
    up = np.stack([t.available()[:n] for t in traces])
    gap_h = traces[0].gap_h
    print(f"trace {args.trace}: {len(traces)} zones, {n * gap_h:.0f} h, {gap_h * 3600:.0f} s ticks")
    regions = sorted({t.zone[:-1] for t in traces})
    for region in regions:
        rows = [i for i, t in enumerate(traces) if t.zone[:-1] == region]
        out = 1 - up[rows].any(axis=0).mean()
        print(f"  {region} ({len(rows)} zones): no spot {out:6.1%} of the time")
    cloudwide = outages(np.asarray(up.any(axis=0)))
    hours = np.array(cloudwide) * gap_h
    total_h = n * gap_h
    print(
        f"  all {len(traces)} zones: no spot {hours.sum() / total_h:6.1%} of the time; "
        f"{len(cloudwide)} outages ({len(cloudwide) / total_h * 100:.1f} per 100 h), "
        f"median {np.median(hours):.2f} h, longest {hours.max():.2f} h"
    )

    catalog = load_catalog()
    print(f"\nhome cloud {args.home}: moving out and back vs on-demand at home during an outage")
    for m in MACHINES:
        state_gb = m.params_b * STATE_BYTES_PER_PARAM
        od_home = cheapest(catalog, m, args.home, "on-demand")
        others = {c: cheapest(catalog, m, c, "spot") for c in EGRESS_USD_PER_GB if c != args.home}
        offered = {c: p for c, p in others.items() if p is not None}
        if od_home is None or not offered:
            print(f"  {m.count}x{m.gpu}: not offered on {args.home} and another cloud")
            continue
        other, spot_other = min(offered.items(), key=lambda kv: kv[1])
        egress = state_gb * (EGRESS_USD_PER_GB[args.home] + EGRESS_USD_PER_GB[other])
        saving_per_h = od_home - spot_other
        line = (
            f"  {m.count}x{m.gpu} ({m.params_b:g}B params, {state_gb:.0f} GB state): "
            f"on-demand {args.home} ${od_home:.2f}/h, spot {other} ${spot_other:.2f}/h, "
            f"egress out and back ${egress:.2f}"
        )
        if saving_per_h <= 0:
            print(f"{line}; never pays (the other cloud's spot is dearer)")
            continue
        break_even_h = egress / saving_per_h
        longer = int((hours > break_even_h).sum())
        per_100h = 100 / total_h
        always = float((hours * saving_per_h - egress).sum()) * per_100h
        oracle = float(np.clip(hours * saving_per_h - egress, 0, None).sum()) * per_100h
        spot_home = cheapest(catalog, m, args.home, "spot") or od_home
        bill = spot_home * 100 + hours.sum() * per_100h * (od_home - spot_home)
        print(
            f"{line}; pays after {break_even_h:.2f} h ({longer} of {len(cloudwide)} outages "
            f"last that long). Per 100 h of training (spot at home ${spot_home:.2f}/h, bill "
            f"${bill:.0f}): moving at every outage saves ${always:.2f}, moving only for the "
            f"outages that pay (knowing their length) ${oracle:.2f} ({oracle / bill:.1%})"
        )


if __name__ == "__main__":
    main()
