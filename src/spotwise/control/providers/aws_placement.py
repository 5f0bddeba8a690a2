"""Where an ``aws`` job runs when its job file does not pin it: instance type, region, zones.

A pure function of the job's ``resources``, the provider options it was given (instance type,
region, zones), the catalog's offers and the interruption model; it asks the market advisor to
rank the AWS offers that satisfy the request by expected cost (deadline first, when one is
given) and returns the winner's instance type and region with the zones to try, best first.

What the job file pins always wins: a pinned instance type is the only one considered, a pinned
region the only region, pinned zones the only zones (kept in the order written, which is how
the user says which zone to try first). The advisor only fills in what is left open. Catalog
spot prices are mostly regional, so a regional offer is ranked once per zone it may run in
(the given zones, or the zones the catalog and the interruption model know for the region):
zones then differ by their interruption estimate, which is what makes one cheaper to finish in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from spotwise.control.pricing import region_of
from spotwise.errors import ConfigError, NoPlacementError, UnknownGPUError
from spotwise.market.advisor import JobRequest, Placement, advise, matching_offers
from spotwise.market.catalog import Catalog, Offer
from spotwise.market.interruption import InterruptionModel

DEFAULT_COMPUTE_HOURS = 1.0  # the ranking's job length when the job file gives none
_ZONE_LETTER = re.compile(r"^[a-z]$")


@dataclass(frozen=True)
class AwsPlacement:
    """The provider's answer: one instance type, and the zones to try in order, in one region
    or (with ``provider.aws.regions``) several; ``region`` is the first zone's."""

    instance_type: str
    region: str
    zones: tuple[str, ...]
    advised: bool  # False: the job file pinned all three, no ranking was done
    ranked: tuple[Placement, ...] = ()  # the advisor's placements of the chosen type, best first

    @property
    def regions(self) -> tuple[str, ...]:
        """The regions of the zones, in the zones' order (a zone name carries its region)."""
        return tuple(dict.fromkeys(region_of(z) for z in self.zones))

    def to_event(self) -> dict[str, object]:
        """What the job's events record, so ``status --json`` shows why it runs there."""
        best = self.ranked[0] if self.ranked else None
        return {
            "instance_type": self.instance_type,
            "region": self.region,
            "regions": list(self.regions),
            "zones": list(self.zones),
            "advised": self.advised,
            "market": best.market if best else None,
            "usd_per_hour": best.usd_per_hour if best else None,
            "expected_cost_usd": best.to_dict()["expected_cost_usd"] if best else None,
            "interruption_rate_per_h": best.interruption_rate_per_h if best else None,
        }

    def pins(self) -> dict[str, object]:
        """Provider options that pin this answer: the job stores them at submit, so every
        later controller of the job runs it in the same place (one region as ``region``,
        several as ``regions``; the other key cleared, so the two never disagree)."""
        several = len(self.regions) > 1
        return {
            "instance_type": self.instance_type,
            "region": None if several else self.region,
            "regions": list(self.regions) if several else [],
            "zones": list(self.zones),
        }

    def message(self) -> str:
        if not self.advised:
            return f"aws placement as pinned: {self.instance_type} in {', '.join(self.zones)}"
        best = self.ranked[0]
        return (
            f"aws placement advised: {self.instance_type} ({best.gpus} x {best.gpu}) in "
            f"{', '.join(self.zones)}, {best.market} ${best.usd_per_hour:.4g}/h, "
            f"expected ${best.expected_cost_usd:.4g} for the job"
        )


def _zone_of(region: str, zone: str) -> bool:
    """``us-east-1a`` is a zone of ``us-east-1`` (the catalog's ``use1-az1`` style ids are not
    zone names RunInstances takes)."""
    return zone.startswith(region) and bool(_ZONE_LETTER.match(zone[len(region) :]))


def _known_zones(region: str, offers: Sequence[Offer], model_zones: Iterable[str]) -> list[str]:
    """The zone names the catalog and the interruption model know in ``region``."""
    return sorted(
        {o.zone for o in offers if o.region == region and o.zone}
        | {z for z in model_zones if _zone_of(region, z)}
    )


def _regional(offers: Sequence[Offer]) -> list[Offer]:
    """Offers priced by zone *id* (``use1-az1``: the catalog's spot rows) become one regional
    offer at their mean price: zone ids map to zone names differently in every account, so
    which named zone gets the cheap price is unknown, and the mean is the honest expectation."""
    out: list[Offer] = []
    by_id: dict[tuple[str, str, str], list[Offer]] = {}
    for o in offers:
        if o.zone and not _zone_of(o.region, o.zone):
            by_id.setdefault((o.region, o.instance_type, o.market), []).append(o)
        else:
            out.append(o)
    regional = {(o.region, o.instance_type, o.market) for o in out if not o.zone}
    for key, group in sorted(by_id.items()):
        if key not in regional:
            mean = sum(o.usd_per_hour for o in group) / len(group)
            out.append(replace(group[0], zone="", usd_per_hour=mean))
    return out


def _per_zone(offers: Sequence[Offer], zones: dict[str, list[str]]) -> list[Offer]:
    """Each regional offer once per allowed zone of its region; zonal offers where allowed."""
    zonal = {o.key for o in offers if o.zone}
    out = [o for o in offers if o.zone and o.zone in zones.get(o.region, [])]
    for o in offers:
        if not o.zone:
            out.extend(
                replace(o, zone=z)
                for z in zones.get(o.region, [])
                if (o.cloud, o.region, z, o.instance_type, o.market) not in zonal
            )
    return out


def _allowed_regions(
    region: str | None, regions: Sequence[str], zones: Sequence[str]
) -> tuple[tuple[str, ...], str]:
    """The regions a job may run in and the setting that named them; the zones written must
    lie in them."""
    if region is not None and regions:
        raise ConfigError(
            "provider.aws: both region and regions are given",
            hint="keep region for one region, or list them all under regions",
        )
    allowed = (region,) if region is not None else tuple(dict.fromkeys(regions))
    key = "provider.aws.regions" if regions else "provider.aws.region"
    if zones and not allowed:
        raise ConfigError(
            "provider.aws.zones: zones are given but no region",
            hint="set provider.aws.region to the zones' region (e.g. us-east-1), or "
            "provider.aws.regions to theirs",
        )
    stray = [z for z in zones if region_of(z) not in allowed]
    if stray:
        raise ConfigError(
            f"provider.aws.zones: {stray} are in no region of {key} ({', '.join(allowed)})",
            hint=f"zones of those regions are named <region><letter>, e.g. {allowed[0]}a",
        )
    return allowed, key


def _no_offer(what: str, cpus: int, allowed: tuple[str, ...], market: str, key: str) -> ConfigError:
    want = " ".join(
        p
        for p in (
            what,
            f"with >= {cpus} CPUs" if cpus > 1 else "",
            f"in {', '.join(allowed)}" if allowed else "",
            f"({market})",
        )
        if p
    )
    return ConfigError(
        f"resources: no AWS offer has {want}",
        hint="change resources.gpu, resources.gpu_count or resources.cpus"
        + (f", or {key}" if allowed else "")
        + " (spotwise gpus --cloud aws lists what exists)",
    )


def _pool(
    catalog: Catalog,
    model: InterruptionModel,
    cpus: int,
    instance_type: str | None,
    allowed: tuple[str, ...],
    gpu: str | None,
    gpu_count: int,
    zones: Sequence[str],
    compute_hours: float,
) -> list[Offer]:
    """The AWS offers that fit the request, once per zone it may run in: the zones written,
    else the zones known to offer the type (the interruption model's), else ``<region>a``."""
    aws = [
        o
        for o in _regional(catalog.offers)
        if o.cloud == "aws"
        and o.vcpus >= cpus
        and (instance_type is None or o.instance_type == instance_type)
        and (not allowed or o.region in allowed)
    ]
    if gpu is not None:
        request = JobRequest(compute_hours, gpu=gpu, gpus=max(gpu_count, 1), clouds=("aws",))
        try:
            aws = matching_offers(request, aws, catalog)
        except UnknownGPUError as exc:
            raise ConfigError(f"resources.gpu: {exc.message}", hint=exc.hint) from None
    offered = {o.region for o in aws}
    model_zones = model.zones("aws")
    if zones:
        places = {r: [z for z in zones if region_of(z) == r] for r in offered}
    else:
        places = {r: _known_zones(r, aws, model_zones.get(r, [])) or [f"{r}a"] for r in offered}
    return _per_zone(aws, places)


def choose_placement(
    *,
    gpu: str | None,
    gpu_count: int,
    cpus: int,
    instance_type: str | None,
    region: str | None,
    zones: Sequence[str],
    market: str,
    catalog: Catalog,
    model: InterruptionModel,
    compute_hours: float = DEFAULT_COMPUTE_HOURS,
    deadline_hours: float | None = None,
    regions: Sequence[str] = (),
) -> AwsPlacement:
    """The instance type, region(s) and ordered zones for one aws job.

    ``region`` keeps the job in one region; ``regions`` lets it span several: the advisor then
    ranks the zones of all of them and keeps every one of the best type's, best first (with
    neither, the best region alone). ``market``: "spot" or "on-demand", the market the ranking
    prices. Raises ``ConfigError`` naming the setting when no AWS offer satisfies the request.
    """
    allowed, key = _allowed_regions(region, regions, zones)
    if instance_type and allowed:
        first = tuple(zones) or tuple(f"{r}a" for r in allowed)
        return AwsPlacement(instance_type, region_of(first[0]), first, advised=False)
    if gpu is None and instance_type is None:
        raise ConfigError(
            "provider.aws: no instance type, and resources.gpu is not set to choose one",
            hint="set resources.gpu (e.g. T4) and resources.gpu_count, or pin "
            "provider.aws.instance_type (e.g. g4dn.xlarge)",
        )
    pool = _pool(catalog, model, cpus, instance_type, allowed, gpu, gpu_count, zones, compute_hours)
    gpus = max(gpu_count, 1) if gpu is not None else (pool[0].gpus if pool else 1)
    job = JobRequest(
        compute_hours,
        gpu=gpu,
        gpus=gpus,
        min_gpu_mem_gb=None if gpu is not None else 0.0,
        deadline_hours=deadline_hours,
        markets=(market,),
        clouds=("aws",),
    )
    try:
        ranked = advise(job, pool, model)
    except NoPlacementError:
        ranked = []
    if not ranked:
        what = f"{max(gpu_count, 1)} x {gpu}" if gpu else f"instance type {instance_type}"
        raise _no_offer(what, cpus, allowed, market, key)
    return _best_type(ranked, len(allowed) > 1, zones)


def _best_type(ranked: list[Placement], several: bool, zones: Sequence[str]) -> AwsPlacement:
    """The best-ranked type in every zone it was ranked in, best first: across the job's
    regions when it spans ``several``, else in the best region alone; zones written keep the
    order written (across regions, those the chosen type has)."""
    best = ranked[0]
    mine = tuple(
        p
        for p in ranked
        if p.instance_type == best.instance_type and (several or p.region == best.region)
    )
    order = tuple(dict.fromkeys(p.zone for p in mine))
    if zones:
        order = tuple(z for z in zones if z in order or not several)
    return AwsPlacement(best.instance_type, region_of(order[0]), order, advised=True, ranked=mine)


def settle_zones(advised: Sequence[str], usable: Iterable[str]) -> tuple[str, ...]:
    """The zones to try once the account's zones that offer the type are known (preflight):
    the advised ones it has, in the advised order, then its others by name."""
    have = set(usable)
    return tuple([z for z in advised if z in have] + sorted(have - set(advised)))
