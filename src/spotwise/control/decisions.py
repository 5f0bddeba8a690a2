"""The controller's decisions as pure functions of plain values (time passed in, no I/O).

The loop in ``controller.py`` gathers the inputs and carries out the answers; tests drive these
with tables.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spotwise.control.providers.base import AttemptStatus, Phase, Placement, Pricing
from spotwise.control.store import Attempt, Job, JobState
from spotwise.exitcode import EXIT_INTERRUPTED
from spotwise.market.advisor import RankedZone, ZoneOffer, rank_zones
from spotwise.market.policies.base import Decision, Market, Problem

# Zones a job's policy plans over: the advisor's best of the provider's zones. A cap on how
# far one job spreads and on the policy's state (it keeps what it saw in every zone), set above
# what the providers list today (the sim's nine shipped zones, an AWS region's zones): fewer
# zones cost more, because a zone ranked low for its spot price is still far cheaper than
# on-demand when the better ones are out (the spotwise live loop on the nine 2023 zones at
# their regions' prices: docs/control.md, "Placement across zones").
RANKED_ZONES = 16


class Reason(str, enum.Enum):
    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"  # exit 75: notice honoured, state saved
    LOST = "lost"  # machine taken away without a clean exit: resume from the last checkpoint
    ERROR = "error"  # the command failed (user error): retried only as configured
    CANCELLED = "cancelled"
    BUDGET = "budget"
    SWITCHED = "switched"  # stopped by the controller (saved) to move to a better placement


def classify(status: AttemptStatus, stop_reason: str = "") -> Reason:
    """Why an attempt ended. A stop we asked for wins over what the process did about it."""
    if status.phase is Phase.EXITED and status.exit_code == 0:
        return Reason.SUCCEEDED
    if stop_reason == "cancel":
        return Reason.CANCELLED
    if stop_reason == "budget":
        return Reason.BUDGET
    if stop_reason == "switch" and (
        status.phase is Phase.LOST or status.exit_code == EXIT_INTERRUPTED
    ):
        return Reason.SWITCHED
    if status.phase is Phase.LOST:
        return Reason.LOST
    if status.exit_code == EXIT_INTERRUPTED:
        return Reason.PREEMPTED
    return Reason.ERROR


class Next(str, enum.Enum):
    SUCCEED = "succeed"
    RECOVER = "recover"
    FAIL = "fail"
    CANCEL = "cancel"


@dataclass(frozen=True)
class AfterAttempt:
    next: Next
    counts_as_error: bool = False
    message: str = ""


def after_attempt(reason: Reason, errors_used: int, max_restarts: int) -> AfterAttempt:
    """What the job does once an attempt has ended."""
    if reason is Reason.SUCCEEDED:
        return AfterAttempt(Next.SUCCEED, message="command exited 0")
    if reason is Reason.CANCELLED:
        return AfterAttempt(Next.CANCEL, message="cancelled by the user")
    if reason is Reason.BUDGET:
        return AfterAttempt(Next.FAIL, message="stopped before exceeding the budget; state saved")
    if reason in (Reason.PREEMPTED, Reason.LOST):
        return AfterAttempt(Next.RECOVER, message=f"attempt {reason.value}; relaunching")
    if reason is Reason.SWITCHED:
        return AfterAttempt(Next.RECOVER, message="attempt stopped to move; launching the next")
    if errors_used < max_restarts:
        return AfterAttempt(
            Next.RECOVER,
            counts_as_error=True,
            message=f"command failed; restart {errors_used + 1}/{max_restarts}",
        )
    return AfterAttempt(
        Next.FAIL,
        counts_as_error=True,
        message=f"command failed and max_restarts={max_restarts} is used up",
    )


def job_after_attempt(
    reason: Reason,
    attempt: Attempt,
    job: Job,
    now: float,
    *,
    max_restarts: int,
    zone_cooldown_s: float,
    restart_backoff_s: float,
    detail: str = "",
) -> list[tuple[JobState, str, dict[str, Any]]]:
    """The job's state changes, in order, once ``attempt`` ended for ``reason``: (state,
    message, other fields). A preemption shows as PREEMPTED (its spot zone cooling down), then
    RECOVERING; an error waits its exponential backoff; a switch relaunches at once."""
    decision = after_attempt(reason, job.errors_used, max_restarts)
    errors_used = job.errors_used + (1 if decision.counts_as_error else 0)
    if decision.next is Next.SUCCEED:
        return [(JobState.SUCCEEDED, decision.message, {"errors_used": errors_used})]
    if decision.next is Next.CANCEL:
        return [(JobState.CANCELLED, decision.message, {})]
    if decision.next is Next.FAIL:
        return [(JobState.FAILED, detail or decision.message, {"errors_used": errors_used})]
    changes: list[tuple[JobState, str, dict[str, Any]]] = []
    blocked = dict(job.blocked)
    delay = 0.0
    if reason in (Reason.PREEMPTED, Reason.LOST):
        if attempt.market == "spot":
            blocked[attempt.zone] = now + zone_cooldown_s
        changes.append((JobState.PREEMPTED, decision.message, {"blocked": blocked}))
    elif reason is not Reason.SWITCHED:
        delay = restart_backoff_s * 2 ** max(0, errors_used - 1)
    recovering = {"errors_used": errors_used, "next_launch_at": now + delay, "stop_reason": ""}
    changes.append((JobState.RECOVERING, decision.message, recovering))
    return changes


def stop_for_budget(
    cost_usd: float, burn_usd_per_s: float, budget_usd: float | None, horizon_s: float
) -> bool:
    """Stop (and save) now if running ``horizon_s`` more (notice + poll) would pass the budget."""
    return budget_usd is not None and cost_usd + burn_usd_per_s * horizon_s >= budget_usd


def estimate_cost_usd(runtime_s: float, pricing: Pricing) -> float:
    return runtime_s * pricing.time_scale / 3600.0 * pricing.usd_per_hour


def zone_order(
    zones: tuple[str, ...], blocked: dict[str, float], last_zone: str, now: float
) -> list[str]:
    """Zones to try, best first: unblocked ones, starting after the one just used, so a lost
    zone goes last (and stays out while blocked)."""
    if last_zone in zones:
        i = zones.index(last_zone) + 1
        zones = zones[i:] + zones[:i]
    return [z for z in zones if blocked.get(z, 0.0) <= now]


def choose_placement(
    mode: str,
    zones: tuple[str, ...],
    blocked: dict[str, float],
    last_zone: str,
    now: float,
    spot_supported: bool = True,
) -> Placement | None:
    """The next attempt's placement when no policy plans the job; None means wait and ask again.

    ``mode`` is the job's market: ``spot`` and ``on-demand`` are obeyed; ``auto`` without a
    deadline to protect (or before the job's compute time is known) takes spot where it can and
    on-demand when every zone is out. With a deadline, the job's policy decides instead
    (``PolicyDriver``, one per job, asked at every tick boundary).
    """
    usable = zone_order(zones, blocked, last_zone, now)
    if not spot_supported or mode == "on-demand":
        return Placement("on-demand", (usable or list(zones))[0])
    if mode == "spot":
        return Placement("spot", usable[0]) if usable else None
    return Placement("spot", usable[0]) if usable else Placement("on-demand", zones[0])


def live_problem(
    compute_wall_s: float,
    deadline_wall_s: float,
    changeover_wall_s: float,
    tick_wall_s: float,
    time_scale: float,
    spot_usd_per_hour: float,
    ondemand_usd_per_hour: float,
) -> tuple[Problem, float]:
    """The policy's job terms and tick length (seconds of *billed* time, wall x ``time_scale``,
    the time the market's rates and the simulator's traces are in) for a live job.

    The tick is kept on a millisecond grid and the changeover rounded to whole seconds, so the
    planning lattice stays coarse enough to solve (``optimal.Lattice``).
    """
    gap_s = max(0.001, round(tick_wall_s * time_scale, 3))
    changeover_s = float(round(changeover_wall_s * time_scale))
    problem = Problem(
        compute_h=max(compute_wall_s * time_scale, 1.0) / 3600.0,
        deadline_h=max(deadline_wall_s * time_scale, 1.0) / 3600.0,
        changeover_h=changeover_s / 3600.0,
        spot_price_usd_per_hour=spot_usd_per_hour,
        ondemand_price_usd_per_hour=ondemand_usd_per_hour,
    )
    return problem, gap_s


def decision_placement(decision: Decision, zones: tuple[str, ...]) -> Placement | None:
    """Where a policy's decision runs the job (None: idle)."""
    if decision.market is Market.ONDEMAND:
        return Placement("on-demand", zones[0] if zones else "")
    if decision.market is Market.SPOT:
        return Placement("spot", zones[decision.zone or 0])
    return None


def zone_offers(
    zones: Sequence[str],
    spot_usd_per_hour: Sequence[float],
    prior_rates_per_h: Sequence[float],
    attempts: Sequence[Attempt],
    now: float,
) -> list[ZoneOffer]:
    """What the ranking knows of each zone: its spot price, the interruption model's estimate,
    and this job's own record there (spot attempts preempted or lost, over the market hours
    its spot attempts ran in the zone)."""
    seen = {z: [0, 0.0] for z in zones}
    for a in attempts:
        if a.market != "spot" or a.zone not in seen:
            continue
        began = a.running_at if a.running_at is not None else a.started_at
        ended = a.ended_at if a.ended_at is not None else now
        seen[a.zone][0] += a.reason in (Reason.PREEMPTED.value, Reason.LOST.value)
        seen[a.zone][1] += max(0.0, ended - began) * a.time_scale / 3600.0
    return [
        ZoneOffer(z, usd, rate, int(seen[z][0]), seen[z][1])
        for z, usd, rate in zip(zones, spot_usd_per_hour, prior_rates_per_h, strict=True)
    ]


def ranked_zones(
    offers: Sequence[ZoneOffer],
    problem: Problem,
    emergency_save: bool,
    limit: int = RANKED_ZONES,
) -> list[RankedZone]:
    """The zones a job's policy plans over, best first: the advisor's ranking by expected
    cost for the job's terms (compute and changeover in the market's time), at most
    ``limit``."""
    return rank_zones(
        offers,
        problem.compute_h,
        restart_h=problem.changeover_h,
        emergency_save=emergency_save,
        limit=limit,
    )
