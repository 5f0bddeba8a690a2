"""The controller's decisions as pure functions of plain values (time passed in, no I/O).

The loop in ``controller.py`` gathers the inputs and carries out the answers; tests drive these
with tables.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from spotwise.control.providers.base import AttemptStatus, Phase, Placement, Pricing

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: interrupted with state saved, restart me


class Reason(str, enum.Enum):
    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"  # exit 75: notice honoured, state saved
    LOST = "lost"  # machine taken away without a clean exit: resume from the last checkpoint
    ERROR = "error"  # the command failed (user error): retried only as configured
    CANCELLED = "cancelled"
    BUDGET = "budget"


def classify(status: AttemptStatus, stop_reason: str = "") -> Reason:
    """Why an attempt ended. A stop we asked for wins over what the process did about it."""
    if status.phase is Phase.EXITED and status.exit_code == 0:
        return Reason.SUCCEEDED
    if stop_reason == "cancel":
        return Reason.CANCELLED
    if stop_reason == "budget":
        return Reason.BUDGET
    if status.phase is Phase.LOST:
        return Reason.LOST
    if status.exit_code == EXIT_PREEMPTED:
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
    if errors_used < max_restarts:
        return AfterAttempt(Next.RECOVER, counts_as_error=True,
                            message=f"command failed; restart {errors_used + 1}/{max_restarts}")
    return AfterAttempt(Next.FAIL, counts_as_error=True,
                        message=f"command failed and max_restarts={max_restarts} is used up")


def stop_for_budget(cost_usd: float, burn_usd_per_s: float, budget_usd: float | None,
                    horizon_s: float) -> bool:
    """Stop (and save) now if running ``horizon_s`` more (notice + poll) would pass the budget."""
    return budget_usd is not None and cost_usd + burn_usd_per_s * horizon_s >= budget_usd


def estimate_cost_usd(runtime_s: float, pricing: Pricing) -> float:
    return runtime_s * pricing.time_scale / 3600.0 * pricing.usd_per_hour


def zone_order(zones: tuple[str, ...], blocked: dict[str, float], last_zone: str,
               now: float) -> list[str]:
    """Zones to try, best first: unblocked ones, starting after the one just used, so a lost
    zone goes last (and stays out while blocked)."""
    if last_zone in zones:
        i = zones.index(last_zone) + 1
        zones = zones[i:] + zones[:i]
    return [z for z in zones if blocked.get(z, 0.0) <= now]


@dataclass(frozen=True)
class Progress:
    elapsed_s: float  # since the job was created
    progress_s: float  # compute done (time spent running)
    deadline_s: float | None
    expected_runtime_s: float | None
    changeover_s: float


def choose_placement(mode: str, policy_name: str, zones: tuple[str, ...],
                     blocked: dict[str, float], last_zone: str, now: float, progress: Progress,
                     spot_usd_per_hour: float, ondemand_usd_per_hour: float,
                     spot_supported: bool = True) -> Placement | None:
    """Spot (in which zone) or on-demand for the next attempt; None means wait and ask again.

    ``mode`` is the job's market: ``spot`` and ``on-demand`` are obeyed; ``auto`` asks the
    deadline-aware policy (spotwise.market.policies) with the zones believed available.
    """
    usable = zone_order(zones, blocked, last_zone, now)
    if not spot_supported or mode == "on-demand":
        return Placement("on-demand", (usable or list(zones))[0])
    if mode == "spot":
        return Placement("spot", usable[0]) if usable else None
    if progress.deadline_s is None or progress.expected_runtime_s is None:
        # no deadline to protect: spot where we can, on-demand when every zone is out
        return Placement("spot", usable[0]) if usable else Placement("on-demand", zones[0])
    from spotwise.market.policies import Market, Observation, Problem, make_policy

    compute_s = max(progress.expected_runtime_s, 1e-3)
    problem = Problem(compute_h=compute_s / 3600, deadline_h=max(progress.deadline_s, 1e-3) / 3600,
                      changeover_h=progress.changeover_s / 3600,
                      spot_price_usd_per_hour=spot_usd_per_hour,
                      ondemand_price_usd_per_hour=ondemand_usd_per_hour)
    policy = make_policy(policy_name)
    policy.reset(problem, progress.changeover_s or 1.0, 1, None)
    obs = Observation(
        tick=0, elapsed_s=progress.elapsed_s, progress_s=min(progress.progress_s, compute_s),
        market=Market.IDLE, zone=None, changeover_left_s=0.0, available=(bool(usable),),
        spot_prices=(spot_usd_per_hour,), ondemand_price=ondemand_usd_per_hour,
        compute_s=problem.compute_s, deadline_s=problem.deadline_s,
        changeover_s=problem.changeover_s, gap_s=progress.changeover_s or 1.0, preempted=False)
    decision = policy.decide(obs)
    if decision.market is Market.ONDEMAND:
        return Placement("on-demand", (usable or list(zones))[0])
    if decision.market is Market.SPOT and usable:
        return Placement("spot", usable[0])
    return None
