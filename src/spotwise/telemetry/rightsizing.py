"""Rightsizing: a smaller or larger instance, from the job's GPU samples and the catalog.

A pure function of plain values. The rule of thumb, stated so that users can judge it:

- *under-used* (mean utilisation or peak memory under ``LOW``): the GPUs wait on something else
  (input pipeline, CPU, I/O), so fewer or cheaper GPUs with room for the memory the job used
  are assumed to run it about as fast: the cost difference is the price difference over the
  same remaining hours. With several GPUs, the count that keeps the used capacity at most
  ``TARGET`` busy is kept;
- *saturated* (mean utilisation or peak memory over ``HIGH``): the next larger count of the same
  GPU model, assumed to scale linearly (the best case, said as such): hours shrink by the GPU
  ratio; when memory is what is full, also GPUs with more memory each, at the same hours;
- otherwise: keep the instance.
Prices are the catalog's cheapest for each type in the job's market (spot or on-demand).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotwise.market.catalog import InstanceType

LOW = 0.5
HIGH = 0.9
TARGET = 0.8
MEMORY_HEADROOM = 1.2  # a smaller GPU must hold the peak memory used plus 20%


@dataclass(frozen=True)
class Suggestion:
    instance_type: str
    gpu: str
    gpus: int
    usd_per_hour: float
    hours: float  # expected billed hours for the remaining work there
    cost_usd: float
    difference_usd: float  # against staying (negative: cheaper)


@dataclass
class Rightsizing:
    verdict: str  # smaller | larger | keep | unknown
    reason: str
    instance_type: str
    usd_per_hour: float | None = None
    mean_util: float | None = None  # 0..1, over all samples and devices
    peak_mem: float | None = None  # 0..1, the highest share of one device's memory in use
    peak_mem_gb: float | None = None
    remaining_h: float = 0.0
    work: str = "of work left"  # or "for a rerun" once the job has finished
    suggestions: list[Suggestion] = field(default_factory=list)

    def line(self) -> str:
        """One sentence for the report and the CLI."""
        if not self.suggestions:
            return self.reason
        best = self.suggestions[0]
        change = "saves" if best.difference_usd < 0 else "costs"
        return (
            f"{self.reason}: {best.instance_type} ({best.gpus} x {best.gpu}, "
            f"${best.usd_per_hour:.2f}/h) {change} ${abs(best.difference_usd):.2f} on the "
            f"{self.remaining_h:.2f} h {self.work}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "suggestions"},
            "suggestions": [s.__dict__ for s in self.suggestions],
            "line": self.line(),
        }


def usage(samples: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None, float | None]:
    """Mean utilisation, peak memory share and peak memory in GB from ``gpu`` events."""
    utils, shares, used = [], [], []
    for event in samples:
        for d in event.get("devices", []):
            if d.get("util_pct") is not None:
                utils.append(float(d["util_pct"]) / 100.0)
            if d.get("mem_used_bytes") is not None and d.get("mem_total_bytes"):
                shares.append(d["mem_used_bytes"] / d["mem_total_bytes"])
                used.append(d["mem_used_bytes"] / 1e9)
    return (
        sum(utils) / len(utils) if utils else None,
        max(shares, default=None),
        max(used, default=None),
    )


def _price(t: InstanceType, market: str) -> float | None:
    return t.cheapest_spot_usd_per_hour if market == "spot" else t.cheapest_on_demand_usd_per_hour


Suggest = Callable[[InstanceType, float], Suggestion | None]  # a type for so many hours


def rightsize(
    samples: Sequence[Mapping[str, Any]],
    *,
    instance_type: str,
    market: str,
    remaining_h: float,
    types: Sequence[InstanceType],
    work: str = "of work left",
    top: int = 3,
) -> Rightsizing:
    """Advice for the rest of a job that ran on ``instance_type`` (``types``: the catalog's
    instance types of that cloud; ``remaining_h``: billed hours of work still to do)."""
    mean_util, peak_mem, peak_gb = usage(samples)
    current = next((t for t in types if t.instance_type == instance_type), None)
    out = Rightsizing(
        "unknown",
        "",
        instance_type,
        mean_util=mean_util,
        peak_mem=peak_mem,
        peak_mem_gb=peak_gb,
        remaining_h=remaining_h,
        work=work,
    )
    if mean_util is None:
        out.reason = "no GPU samples recorded (no GPU, or nvidia-ml-py not installed)"
        return out
    price = None if current is None else _price(current, market)
    if current is None or price is None:
        out.reason = f"{instance_type} has no {market} price in the catalog"
        return out
    out.usd_per_hour = price
    types = [t for t in types if t.cloud == current.cloud]
    stay = remaining_h * price
    shown = f"GPU {100 * mean_util:.0f}% busy, memory peak {100 * (peak_mem or 0):.0f}%"

    def suggest(t: InstanceType, hours: float) -> Suggestion | None:
        p = _price(t, market)
        if p is None or t.instance_type == instance_type:
            return None
        return Suggestion(t.instance_type, t.gpu, t.gpus, p, hours, hours * p, hours * p - stay)

    if mean_util < LOW or (peak_mem is not None and peak_mem < LOW):
        out.verdict = "smaller"
        out.reason = f"under-used ({shown}): a smaller or cheaper instance"
        found = _smaller(types, current, mean_util, peak_gb, remaining_h, suggest)
    elif mean_util > HIGH or (peak_mem is not None and peak_mem > HIGH):
        out.verdict = "larger"
        out.reason = f"saturated ({shown}): a larger instance (linear scaling assumed)"
        found = _larger(types, current, peak_mem, remaining_h, suggest)
    else:
        out.verdict = "keep"
        out.reason = f"well used ({shown}): keep {instance_type}"
        return out
    out.suggestions = sorted(found, key=lambda s: (s.cost_usd, s.instance_type))[:top]
    if not out.suggestions:
        out.reason += f", but the catalog has none that fits better than {instance_type}"
    return out


def _smaller(
    types: Sequence[InstanceType],
    current: InstanceType,
    mean_util: float,
    peak_gb: float | None,
    remaining_h: float,
    suggest: Suggest,
) -> list[Suggestion]:
    """Cheaper types with no more GPUs than now, enough of them for the work seen at the
    target utilisation, and room for the memory peak."""
    need_gb = (peak_gb or 0.0) * MEMORY_HEADROOM
    keep_gpus = max(1, math.ceil(mean_util * current.gpus / TARGET))
    return [
        s
        for t in types
        if t.gpus >= keep_gpus
        and t.gpus <= current.gpus
        and t.gpu_mem_gb >= need_gb
        and t.gpu_mem_gb > 0
        and (s := suggest(t, remaining_h)) is not None
        and s.difference_usd < 0
    ]


def _larger(
    types: Sequence[InstanceType],
    current: InstanceType,
    peak_mem: float | None,
    remaining_h: float,
    suggest: Suggest,
) -> list[Suggestion]:
    """The next count of the same GPU (its hours shrunk by linear scaling), and, when memory
    ran full, as many GPUs with more memory each (same speed assumed)."""
    more = [t.gpus for t in types if t.gpu == current.gpu and t.gpus > current.gpus]
    roomier = [t for t in types if t.gpus == current.gpus and t.gpu_mem_gb > current.gpu_mem_gb]
    found = [
        s
        for t in types
        if t.gpu == current.gpu
        and more
        and t.gpus == min(more)
        and (s := suggest(t, remaining_h * current.gpus / t.gpus)) is not None
    ]
    if peak_mem is not None and peak_mem > HIGH:
        found += [s for t in roomier if (s := suggest(t, remaining_h)) is not None]
    return found
