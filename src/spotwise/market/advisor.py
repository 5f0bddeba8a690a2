"""Rank placements by expected cost and expected completion time, interruptions included.

A pure function of plain values: the job, the offers (catalog, possibly with live prices laid
over it) and an interruption model. The expected wall time follows Young/Daly checkpointing:

    tau   = checkpoint interval (given, or Young's optimum sqrt(2 * delta / lambda), at most C)
    lost  = tau / 2 per interruption (delta with an emergency save on notice instead)
    W     = C * (1 + delta / tau) / (1 - lambda * (lost + R))

with C the compute hours, delta the checkpoint cost, R the restart (changeover) time and lambda
the interruption rate per running hour. The denominator is the share of wall time that is not
re-done or spent restarting; when it is near zero the job does not finish in expectation.
Expected cost is the hourly price times W (changeovers are billed, as on every cloud).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime

from spotwise.errors import ConfigError, NoPlacementError
from spotwise.market.catalog import CLOUDS, MARKETS, Catalog, Offer, same_family
from spotwise.market.interruption import InterruptionModel, posterior_rate

MIN_USEFUL_SHARE = 0.05  # below this the job spends > 95% of its time redoing work
DEFAULT_CHECKPOINT_COST_H = 0.05  # 3 minutes to write a checkpoint
DEFAULT_RESTART_H = 0.2  # 12 minutes changeover, the simulation model's d


@dataclass(frozen=True)
class JobRequest:
    """What the user wants to run; durations in hours."""

    compute_hours: float
    gpu: str | None = None  # canonical or vendor name; None: any GPU with min_gpu_mem_gb
    gpus: int = 1
    min_gpu_mem_gb: float | None = None
    deadline_hours: float | None = None  # from now
    deadline_at: datetime | None = None  # absolute; needs advise(now=...)
    budget_usd: float | None = None
    checkpoint_cost_h: float = DEFAULT_CHECKPOINT_COST_H  # time to write one checkpoint
    restart_h: float = DEFAULT_RESTART_H  # changeover: provision + start + restore
    checkpoint_interval_h: float | None = None  # None: Young's optimum per placement
    emergency_save: bool = False  # a notice triggers a save, so little work is lost
    markets: tuple[str, ...] = ("spot", "on-demand")
    clouds: tuple[str, ...] = ()  # empty: all
    regions: tuple[str, ...] = ()  # empty: all
    include_host_excluded: bool = False  # GCP GPU-only prices (the N1 host is not priced)

    def validate(self) -> None:
        if not self.compute_hours > 0:
            raise ConfigError(
                f"compute hours must be positive, got {self.compute_hours}",
                hint="pass --hours, e.g. --hours 48",
            )
        if self.gpus < 1:
            raise ConfigError(f"GPU count must be at least 1, got {self.gpus}")
        if self.gpu is None and self.min_gpu_mem_gb is None:
            raise ConfigError("say which GPU", hint="pass --gpu V100 or --min-mem 40")
        if self.checkpoint_cost_h < 0 or self.restart_h < 0:
            raise ConfigError("checkpoint cost and restart time cannot be negative")
        if self.checkpoint_interval_h is not None and self.checkpoint_interval_h <= 0:
            raise ConfigError("checkpoint interval must be positive")
        if self.deadline_hours is not None and self.deadline_hours <= 0:
            raise ConfigError(f"the deadline must be in the future, got {self.deadline_hours} h")
        if self.budget_usd is not None and self.budget_usd <= 0:
            raise ConfigError(f"the budget must be positive, got {self.budget_usd}")
        for name, values, allowed in (
            ("market", self.markets, MARKETS),
            ("cloud", self.clouds, CLOUDS),
        ):
            unknown = sorted(set(values) - set(allowed))
            if unknown:
                raise ConfigError(
                    f"unknown {name} {', '.join(unknown)}", hint=f"use {', '.join(allowed)}"
                )


@dataclass(frozen=True)
class Expectation:
    checkpoint_interval_h: float
    expected_interruptions: float
    expected_hours: float  # inf when the job does not finish in expectation


def expected_wall_hours(
    compute_hours: float,
    rate_per_h: float,
    *,
    checkpoint_cost_h: float,
    restart_h: float,
    checkpoint_interval_h: float | None = None,
    emergency_save: bool = False,
) -> Expectation:
    """Expected wall time of ``compute_hours`` of work under Poisson interruptions."""
    if rate_per_h <= 0:
        return Expectation(compute_hours, 0.0, compute_hours)
    if checkpoint_interval_h is not None:
        tau = checkpoint_interval_h
    elif checkpoint_cost_h > 0:
        tau = math.sqrt(2 * checkpoint_cost_h / rate_per_h)
    else:
        tau = compute_hours
    tau = min(tau, compute_hours)
    lost = checkpoint_cost_h if emergency_save else tau / 2
    useful_share = 1 - rate_per_h * (lost + restart_h)
    if useful_share < MIN_USEFUL_SHARE:
        return Expectation(tau, math.inf, math.inf)
    checkpoints = max(math.ceil(compute_hours / tau) - 1, 0)
    wall = (compute_hours + checkpoints * checkpoint_cost_h) / useful_share
    return Expectation(tau, rate_per_h * wall, wall)


@dataclass(frozen=True)
class Placement:
    """One ranked answer: where to run, what it costs and how long it takes, in expectation."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    gpu: str
    gpus: int
    usd_per_hour: float
    interruption_rate_per_h: float
    interruption_source: str
    checkpoint_interval_h: float
    expected_interruptions: float
    expected_hours: float
    expected_cost_usd: float
    on_demand_cost_usd: float | None  # the same type on-demand in the same region, if offered
    savings_vs_on_demand_pct: float | None
    meets_deadline: bool
    within_budget: bool
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        for key in ("expected_hours", "expected_cost_usd", "expected_interruptions"):
            if math.isinf(data[key]):
                data[key] = None  # JSON has no infinity
        return data


def _deadline(job: JobRequest, now: datetime | None) -> float | None:
    if job.deadline_at is None:
        return job.deadline_hours
    if now is None:
        raise ConfigError("an absolute deadline needs the current time (advise(..., now=...))")
    return (job.deadline_at - now).total_seconds() / 3600.0


def _fits(job: JobRequest, o: Offer) -> bool:
    """Hardware and place; not the GPU model, nor the market (on-demand offers are the reference
    for savings even when only spot is wanted)."""
    return (
        o.gpus == job.gpus
        and (job.min_gpu_mem_gb is None or o.gpu_mem_gb >= job.min_gpu_mem_gb)
        and (not job.clouds or o.cloud in job.clouds)
        and (not job.regions or o.region in job.regions)
        and (job.include_host_excluded or o.host_included)
    )


def matching_offers(job: JobRequest, offers: Iterable[Offer], catalog: Catalog) -> list[Offer]:
    """Offers whose hardware and place fit the job, in every market (GPU names resolved against
    the catalog)."""
    gpu = catalog.resolve_gpu(job.gpu) if job.gpu else None
    return [o for o in offers if (gpu is None or same_family(gpu, o.gpu)) and _fits(job, o)]


def advise(
    job: JobRequest,
    offers: Iterable[Offer],
    interruption_model: InterruptionModel,
    now: datetime | None = None,
    *,
    objective: str = "cost",
) -> list[Placement]:
    """All placements among ``offers`` that fit ``job``, best first.

    Order: placements that meet the deadline and the budget first, then by expected cost
    (``objective="cost"``) or expected hours (``"time"``). The GPU model is not checked here
    (offers may come from anywhere): pass ``matching_offers(...)`` or a catalog selection.
    """
    job.validate()
    if objective not in ("cost", "time"):
        raise ConfigError(f"objective must be 'cost' or 'time', got {objective!r}")
    deadline_h = _deadline(job, now)
    candidates = [o for o in offers if _fits(job, o)]
    pool = [o for o in candidates if o.market in job.markets]
    if not pool:
        raise NoPlacementError(
            f"no offer fits {job.gpus} x {job.gpu or 'GPU'} in markets {', '.join(job.markets)}",
            hint="spotwise gpus shows what exists; relax the count, clouds or regions",
        )
    on_demand: dict[tuple[str, str, str], float] = {}
    for o in candidates:
        if o.market == "on-demand":
            k = (o.cloud, o.region, o.instance_type)
            on_demand[k] = min(on_demand.get(k, math.inf), o.usd_per_hour)
    placements = [_place(job, o, interruption_model, deadline_h, on_demand) for o in pool]

    def rank(p: Placement) -> tuple[bool, bool, float, float, str]:
        first, second = (
            (p.expected_cost_usd, p.expected_hours)
            if objective == "cost"
            else (p.expected_hours, p.expected_cost_usd)
        )
        tie = f"{p.cloud}/{p.region}/{p.zone}/{p.instance_type}/{p.market}"
        return (not p.meets_deadline, not p.within_budget, first, second, tie)

    return sorted(placements, key=rank)


def _place(
    job: JobRequest,
    offer: Offer,
    model: InterruptionModel,
    deadline_h: float | None,
    on_demand: dict[tuple[str, str, str], float],
) -> Placement:
    if offer.market == "spot":
        estimate = model.rate(offer.cloud, offer.region, offer.zone, offer.instance_type)
        rate, source = estimate.rate_per_h, estimate.source
    else:
        rate, source = 0.0, "on-demand"
    exp = expected_wall_hours(
        job.compute_hours,
        rate,
        checkpoint_cost_h=job.checkpoint_cost_h,
        restart_h=job.restart_h,
        checkpoint_interval_h=job.checkpoint_interval_h,
        emergency_save=job.emergency_save,
    )
    cost = offer.usd_per_hour * exp.expected_hours
    od_rate = on_demand.get((offer.cloud, offer.region, offer.instance_type))
    od_cost = od_rate * job.compute_hours if od_rate is not None else None
    savings = (
        100.0 * (1 - cost / od_cost)
        if od_cost and math.isfinite(cost) and offer.market == "spot"
        else None
    )
    notes = []
    if not offer.host_included:
        notes.append("GPU-only price: the N1 host VM is billed on top")
    if not math.isfinite(exp.expected_hours):
        notes.append("interrupted too often to finish in expectation")
    if offer.price_source == "advisor-estimate":
        notes.append("spot price estimated from on-demand x advisor savings")
    meets = deadline_h is None or exp.expected_hours <= deadline_h
    if deadline_h is not None and not meets:
        notes.append(f"misses the {deadline_h:g} h deadline")
    within = job.budget_usd is None or cost <= job.budget_usd
    if not within:
        notes.append(f"over the ${job.budget_usd:g} budget")
    return Placement(
        cloud=offer.cloud, region=offer.region, zone=offer.zone,
        instance_type=offer.instance_type, market=offer.market, gpu=offer.gpu, gpus=offer.gpus,
        usd_per_hour=offer.usd_per_hour, interruption_rate_per_h=rate, interruption_source=source,
        checkpoint_interval_h=exp.checkpoint_interval_h,
        expected_interruptions=exp.expected_interruptions, expected_hours=exp.expected_hours,
        expected_cost_usd=cost, on_demand_cost_usd=od_cost, savings_vs_on_demand_pct=savings,
        meets_deadline=meets, within_budget=within, notes=tuple(notes),
    )  # fmt: skip


def advise_from_catalog(
    job: JobRequest,
    catalog: Catalog,
    interruption_model: InterruptionModel,
    now: datetime | None = None,
    *,
    objective: str = "cost",
) -> list[Placement]:
    """Convenience: resolve the GPU against ``catalog``, select its offers, rank them.

    Impossible requests (unknown GPU, more GPUs than any type has) raise with a hint.
    """
    job.validate()
    catalog.find(gpu=job.gpu, count=job.gpus, min_mem_gb=job.min_gpu_mem_gb)  # explains misses
    return advise(
        job,
        matching_offers(job, catalog.offers, catalog),
        interruption_model,
        now,
        objective=objective,
    )


@dataclass(frozen=True)
class ZoneOffer:
    """One zone a provider offers spot capacity in, with what is known of its interruptions:
    the interruption model's estimate and what has been seen there since (a job's own
    preemptions over the spot hours it ran in the zone)."""

    zone: str
    usd_per_hour: float
    prior_rate_per_h: float  # the interruption model's estimate for the zone
    interruptions: int = 0  # seen there since
    exposure_h: float = 0.0  # spot hours they were seen over


@dataclass(frozen=True)
class RankedZone:
    zone: str
    usd_per_hour: float
    interruption_rate_per_h: float
    expected_hours: float
    expected_cost_usd: float  # inf when the zone is interrupted too often to finish

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        for key in ("expected_hours", "expected_cost_usd"):
            if math.isinf(data[key]):
                data[key] = None  # JSON has no infinity
        return data


def rank_zones(
    offers: Sequence[ZoneOffer],
    compute_hours: float,
    *,
    checkpoint_cost_h: float = DEFAULT_CHECKPOINT_COST_H,
    restart_h: float = DEFAULT_RESTART_H,
    emergency_save: bool = False,
    limit: int | None = None,
) -> list[RankedZone]:
    """The zones best first by expected cost (price x ``expected_wall_hours``, the model
    :func:`advise` ranks placements with), then by expected hours; equal zones keep the order
    given (the provider's), so zones nothing tells apart are tried as the provider lists them.

    A zone's rate is the Gamma-Poisson update of the model's estimate with what was seen there
    (``posterior_rate``: the estimate counts as a week of observation, as in the model's own
    build), so one preemption moves a zone a little, not to the back. At most ``limit`` zones.
    """
    ranked = []
    for o in offers:
        rate = posterior_rate(o.prior_rate_per_h, o.interruptions, o.exposure_h)
        exp = expected_wall_hours(
            compute_hours,
            rate,
            checkpoint_cost_h=checkpoint_cost_h,
            restart_h=restart_h,
            emergency_save=emergency_save,
        )
        cost = o.usd_per_hour * exp.expected_hours
        ranked.append(RankedZone(o.zone, o.usd_per_hour, rate, exp.expected_hours, cost))
    ranked.sort(key=lambda r: (r.expected_cost_usd, r.expected_hours))  # stable: ties keep order
    return ranked[:limit]
