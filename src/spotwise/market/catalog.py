"""The GPU catalog: which instance types exist, where, and at what list price.

The catalog is a flat table of *offers* (one instance type, in one region or zone, in one market,
at one hourly price). It ships in the package (``spotwise/data/catalog/offers.csv``, derived by
``scripts/build_catalog.py`` from public snapshots) so that ranking works offline on a fresh
install; live prices from the history store can be laid over it (:func:`Catalog.with_prices`).
"""

from __future__ import annotations

import csv
import difflib
import functools
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from spotwise.errors import MarketError, NoPlacementError, UnknownGPUError

CLOUDS = ("aws", "gcp", "azure", "lambda")
MARKETS = ("spot", "on-demand")

# Memory per GPU in GB for accelerators whose source rows do not say it.
GPU_MEMORY_GB: dict[str, float] = {
    "K80": 12, "K520": 4, "M60": 8, "P4": 8, "P100": 16, "T4": 16, "V100": 16, "V100-32GB": 32,
    "A10": 24, "A10G": 24, "L4": 24, "L40": 48, "L40S": 48, "A100": 40, "A100-80GB": 80,
    "H100": 80, "H100-MEGA": 80, "H200": 141, "B200": 180, "GH200": 96, "A6000": 48,
    "RTX6000": 24, "MI25": 16, "MI300X": 192, "RTXPRO6000": 96,
}  # fmt: skip

# Vendor spellings -> canonical name (SkyPilot's accelerator names where one exists).
_GPU_ALIASES = {
    "nvidia-tesla-k80": "K80", "nvidia-tesla-p4": "P4", "nvidia-tesla-p100": "P100",
    "nvidia-tesla-t4": "T4", "nvidia-tesla-v100": "V100", "nvidia-tesla-a100": "A100",
    "nvidia-a100-80gb": "A100-80GB", "nvidia-l4": "L4", "nvidia-h100-80gb": "H100",
    "grid k520": "K520", "rtx pro 6000": "RTXPRO6000", "aws inferentia": "Inferentia",
    "aws inferentia2": "Inferentia2", "aws trainium": "Trainium", "qualcomm ai 100": "AI100",
    "amd radeon pro v520": "V520", "arm mali-g78mp12": "Mali-G78",
}  # fmt: skip

# GCP machine families with GPUs built in: prefix -> GPU; the count is in the name (-<n>g).
_GCP_VM_GPU = (
    ("a2-highgpu-", "A100"), ("a2-megagpu-", "A100"), ("a2-ultragpu-", "A100-80GB"),
    ("a3-highgpu-", "H100"), ("a3-edgegpu-", "H100"), ("a3-megagpu-", "H100-MEGA"),
    ("a3-ultragpu-", "H200"), ("a4-highgpu-", "B200"), ("g2-standard-", "L4"),
)  # fmt: skip
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}

# The catalog's GPU names -> Compute Engine accelerator types (N1 guest accelerators), which
# the GCP provider asks for and the GCE double answers with.
GCP_ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "P4": "nvidia-tesla-p4",
    "P100": "nvidia-tesla-p100",
    "V100": "nvidia-tesla-v100",
    "L4": "nvidia-l4",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
}


def canonical_gpu(name: str, mem_gb_per_gpu: float | None = None) -> str:
    """Map a vendor GPU spelling ('NVIDIA V100', 'nvidia-tesla-v100') to one canonical name."""
    raw = name.strip()
    low = raw.lower()
    for prefix in ("nvidia ", "amd "):
        if low.startswith(prefix) and low not in _GPU_ALIASES:
            raw, low = raw[len(prefix) :], low[len(prefix) :]
    low = low.replace(" blackwell", "")
    raw = re.sub(r"\s+Blackwell$", "", raw)
    gpu = _GPU_ALIASES.get(low, raw.upper() if raw.isascii() and " " not in raw else raw)
    if gpu == "A100" and mem_gb_per_gpu and mem_gb_per_gpu >= 80:
        return "A100-80GB"
    if gpu == "V100" and mem_gb_per_gpu and mem_gb_per_gpu >= 32:
        return "V100-32GB"
    return gpu


def same_family(wanted: str, gpu: str) -> bool:
    """'A100' asks for any A100 (A100, A100-80GB); 'A100-80GB' only for that variant."""
    return gpu == wanted or gpu.startswith(wanted + "-")


def gcp_vm_gpus(instance_type: str) -> tuple[str, int] | None:
    """GPU model and count of a GCP machine type that has GPUs built in, else None."""
    for prefix, gpu in _GCP_VM_GPU:
        if instance_type.startswith(prefix):
            tail = instance_type[len(prefix) :]
            if gpu == "L4":
                return gpu, _G2_GPUS.get(int(tail), 1)
            match = re.match(r"(\d+)g", tail)
            return (gpu, int(match.group(1))) if match else None
    return None


def gcp_attached_type(gpu: str, count: int) -> str:
    """Name for 'count x gpu attached to an N1 VM' (the host VM is priced separately on GCP)."""
    return f"n1+{gpu}:{count}"


@dataclass(frozen=True)
class Offer:
    """One instance type in one region (or zone) and market at one hourly price."""

    cloud: str
    region: str
    zone: str  # "" when the price is regional (on-demand, Azure, Lambda, estimated spot)
    instance_type: str
    market: str  # "spot" | "on-demand"
    usd_per_hour: float
    gpu: str
    gpus: int
    gpu_mem_gb: float  # per GPU; 0 when unknown
    vcpus: float
    ram_gb: float
    host_included: bool = True  # False: GCP GPU-only price, the N1 host VM costs extra
    price_source: str = ""  # where the price comes from (snapshot, advisor-estimate, history)
    as_of: str = ""  # ISO date of the price

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.cloud, self.region, self.zone, self.instance_type, self.market)


_FIELDS = [f for f in Offer.__dataclass_fields__]


def write_offers(offers: Iterable[Offer], out: io.TextIOBase | io.StringIO) -> None:
    """Write offers as the shipped CSV (used by the build script)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_FIELDS)
    for o in offers:
        writer.writerow(
            [
                o.cloud, o.region, o.zone, o.instance_type, o.market, f"{o.usd_per_hour:.10g}",
                o.gpu, o.gpus, f"{o.gpu_mem_gb:g}", f"{o.vcpus:g}", f"{o.ram_gb:g}",
                int(o.host_included), o.price_source, o.as_of,
            ]
        )  # fmt: skip


def read_offers(text: str) -> list[Offer]:
    rows = csv.DictReader(io.StringIO(text))
    if rows.fieldnames != _FIELDS:
        raise MarketError(
            f"catalog file has columns {rows.fieldnames}, expected {_FIELDS}",
            hint="rebuild it with scripts/build_catalog.py",
        )
    return [
        Offer(
            cloud=r["cloud"], region=r["region"], zone=r["zone"],
            instance_type=r["instance_type"], market=r["market"],
            usd_per_hour=float(r["usd_per_hour"]), gpu=r["gpu"], gpus=int(r["gpus"]),
            gpu_mem_gb=float(r["gpu_mem_gb"]), vcpus=float(r["vcpus"]), ram_gb=float(r["ram_gb"]),
            host_included=r["host_included"] == "1", price_source=r["price_source"],
            as_of=r["as_of"],
        )
        for r in rows
    ]  # fmt: skip


@dataclass(frozen=True)
class InstanceType:
    """What one instance type is, independent of where it runs."""

    cloud: str
    instance_type: str
    gpu: str
    gpus: int
    gpu_mem_gb: float
    vcpus: float
    ram_gb: float
    host_included: bool
    regions: int
    cheapest_on_demand_usd_per_hour: float | None
    cheapest_spot_usd_per_hour: float | None


class Catalog:
    """All offers, with lookups by GPU, count, memory, cloud and place."""

    def __init__(self, offers: Sequence[Offer]) -> None:
        self.offers: list[Offer] = list(offers)
        self._by_key = {o.key: o for o in self.offers}

    def __len__(self) -> int:
        return len(self.offers)

    def gpus(self) -> list[str]:
        """Canonical GPU names the catalog knows."""
        return sorted({o.gpu for o in self.offers})

    def resolve_gpu(self, name: str) -> str:
        """Canonical name for a user's spelling, or UnknownGPUError suggesting close matches."""
        known = self.gpus()
        by_upper = {g.upper(): g for g in known}
        for candidate in (name, canonical_gpu(name)):
            if candidate.upper() in by_upper:
                return by_upper[candidate.upper()]
        close = difflib.get_close_matches(name.upper(), list(by_upper), n=3, cutoff=0.5)
        hint = (
            f"did you mean {', '.join(by_upper[c] for c in close)}?"
            if close
            else f"known GPUs: {', '.join(known)}"
        )
        raise UnknownGPUError(f"unknown GPU {name!r}", hint=hint)

    def select(
        self,
        *,
        gpu: str | None = None,
        count: int | None = None,
        min_mem_gb: float | None = None,
        cloud: str | None = None,
        region: str | None = None,
        market: str | None = None,
    ) -> list[Offer]:
        """Offers matching every given filter (GPU names are resolved, unknown ones raise)."""
        want_gpu = self.resolve_gpu(gpu) if gpu else None
        if cloud and cloud not in CLOUDS:
            raise MarketError(f"unknown cloud {cloud!r}", hint=f"use one of {', '.join(CLOUDS)}")
        if market and market not in MARKETS:
            raise MarketError(f"unknown market {market!r}", hint=f"use one of {', '.join(MARKETS)}")
        return [
            o
            for o in self.offers
            if (want_gpu is None or same_family(want_gpu, o.gpu))
            and (count is None or o.gpus == count)
            and (min_mem_gb is None or o.gpu_mem_gb >= min_mem_gb)
            and (cloud is None or o.cloud == cloud)
            and (region is None or o.region == region)
            and (market is None or o.market == market)
        ]

    def find(
        self,
        *,
        gpu: str | None = None,
        count: int | None = None,
        min_mem_gb: float | None = None,
        cloud: str | None = None,
    ) -> list[InstanceType]:
        """Instance types matching the filters, cheapest on-demand first.

        Raises NoPlacementError for impossible requests (e.g. more GPUs than any type has).
        """
        offers = self.select(gpu=gpu, count=count, min_mem_gb=min_mem_gb, cloud=cloud)
        if not offers:
            raise NoPlacementError(
                _why_nothing(self, gpu=gpu, count=count, min_mem_gb=min_mem_gb, cloud=cloud),
                hint="relax --count/--min-mem or pick another GPU (spotwise gpus lists them)",
            )
        groups: dict[tuple[str, str], list[Offer]] = {}
        for o in offers:
            groups.setdefault((o.cloud, o.instance_type), []).append(o)
        types = []
        for (cloud_name, itype), group in groups.items():
            first = group[0]
            od = [o.usd_per_hour for o in group if o.market == "on-demand"]
            spot = [o.usd_per_hour for o in group if o.market == "spot"]
            types.append(
                InstanceType(
                    cloud=cloud_name, instance_type=itype, gpu=first.gpu, gpus=first.gpus,
                    gpu_mem_gb=first.gpu_mem_gb, vcpus=first.vcpus, ram_gb=first.ram_gb,
                    host_included=first.host_included,
                    regions=len({o.region for o in group}),
                    cheapest_on_demand_usd_per_hour=min(od) if od else None,
                    cheapest_spot_usd_per_hour=min(spot) if spot else None,
                )
            )  # fmt: skip
        inf = float("inf")
        return sorted(
            types,
            key=lambda t: (t.cheapest_on_demand_usd_per_hour or inf, t.cloud, t.instance_type),
        )

    def price(
        self,
        cloud: str,
        region: str,
        instance_type: str,
        market: str,
        zone: str | None = None,
    ) -> float:
        """Hourly USD price; with no zone, the cheapest zone (or regional price) in the region."""
        if zone is not None:
            for z in (zone, ""):
                hit = self._by_key.get((cloud, region, z, instance_type, market))
                if hit is not None:
                    return hit.usd_per_hour
        else:
            prices = [
                o.usd_per_hour
                for o in self.offers
                if (o.cloud, o.region, o.instance_type, o.market)
                == (cloud, region, instance_type, market)
            ]
            if prices:
                return min(prices)
        raise NoPlacementError(
            f"no {market} price for {cloud} {instance_type} in {region}"
            + (f" zone {zone}" if zone else ""),
            hint="spotwise gpus --json lists the places each type is offered",
        )

    def with_prices(self, updates: Iterable[tuple[str, str, str, str, str, float, str]]) -> Catalog:
        """A copy where (cloud, region, zone, type, market, usd_per_hour, as_of) rows override
        or add prices; new places inherit the hardware facts of a known offer of that type."""
        by_key = dict(self._by_key)
        specimen = {(o.cloud, o.instance_type): o for o in self.offers}
        for cloud, region, zone, itype, market, usd, as_of in updates:
            base = by_key.get((cloud, region, zone, itype, market)) or specimen.get((cloud, itype))
            if base is None:
                continue  # a type the catalog has no hardware facts for cannot be ranked
            by_key[(cloud, region, zone, itype, market)] = replace(
                base, region=region, zone=zone, market=market, usd_per_hour=usd,
                price_source="history", as_of=as_of,
            )  # fmt: skip
        return Catalog(list(by_key.values()))


def _why_nothing(
    catalog: Catalog,
    *,
    gpu: str | None,
    count: int | None,
    min_mem_gb: float | None,
    cloud: str | None,
) -> str:
    pool = catalog.select(gpu=gpu, cloud=cloud)
    what = " ".join(
        p
        for p in (
            f"{count} x" if count else "",
            gpu or "GPU",
            f"with >= {min_mem_gb:g} GB each" if min_mem_gb else "",
            f"on {cloud}" if cloud else "",
        )
        if p
    )
    if count is not None and pool:
        counts = sorted({o.gpus for o in pool})
        if count > counts[-1]:
            return f"no instance type has {what}: the most on one instance is {counts[-1]}"
        return f"no instance type has {what}; available counts: {counts}"
    if min_mem_gb is not None and pool:
        return f"no {what}: the most memory per GPU is {max(o.gpu_mem_gb for o in pool):g} GB"
    return f"no offer matches {what}"


def catalog_text() -> str:
    """The shipped catalog CSV, read through importlib.resources (works from wheels and zips)."""
    ref = resources.files("spotwise") / "data" / "catalog" / "offers.csv"
    try:
        return ref.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise MarketError(
            "the shipped catalog is missing from the installed package",
            hint="reinstall spotwise, or run scripts/build_catalog.py in a source checkout",
        ) from exc


@functools.lru_cache(maxsize=4)
def _load(path: str | None) -> Catalog:
    text = catalog_text() if path is None else Path(path).read_text(encoding="utf-8")
    return Catalog(read_offers(text))


@functools.lru_cache(maxsize=1)
def load_reserved_prices() -> dict[tuple[str, str, str], float]:
    """(cloud, region, instance_type) -> 1-year reserved $/h, where the sources have one."""
    ref = resources.files("spotwise") / "data" / "catalog" / "reserved.csv"
    rows = csv.DictReader(io.StringIO(ref.read_text(encoding="utf-8")))
    return {(r["cloud"], r["region"], r["instance_type"]): float(r["usd_per_hour"]) for r in rows}


def load_catalog(path: str | Path | None = None) -> Catalog:
    """The shipped catalog (cached), or one read from a CSV in the same format."""
    return _load(None if path is None else str(path))
