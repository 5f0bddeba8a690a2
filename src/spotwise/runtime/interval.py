"""When to save next: a pure decision from the schedule, the counters and measured costs.

``every="auto"`` uses the Young/Daly optimum. If a save blocks training for C seconds and
unannounced interruptions arrive on average every M seconds, the expected waste per unit of work
(C/T for saving plus T/(2M) of lost work) is smallest at T = sqrt(2*C*M) (Young, 1974); Daly
(2006) refines it to T = sqrt(2CM) * (1 + sqrt(C/2M)/3 + (C/2M)/9) - C for C < 2M, and T = M
beyond. Because spotwise saves in the background, C is only the snapshot stall; the interval is
also never shorter than the background write itself, since only one write is in flight.

Default M: one hour (``DEFAULT_MTBI_S``). Spot interruptions normally come with a notice that
triggers an emergency save, so the periodic interval only guards against the interruptions whose
notice is missed (a host failure, a notice shorter than the save). One hour is deliberately
pessimistic for GPU spot pools (the AWS Spot Instance Advisor's worst bucket is ">20% chance of
an interruption per month"); erring short costs only snapshot stalls, erring long costs lost
work. Set ``SPOTWISE_MTBI_S`` or ``CheckpointConfig(mtbi_s=...)`` from your own history.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from spotwise.durations import has_unit, parse_duration_s
from spotwise.errors import ConfigError

DEFAULT_MTBI_S = 3600.0
MIN_AUTO_INTERVAL_S = 1.0  # never save more often than this in auto mode
# By default a terminate notice is acted on at the next step boundary, whatever its deadline:
# the surest choice when a notice's deadline may be wrong. A finite margin trains on until the
# deadline is that close (plus the save estimate), which pays for long notices.
DEFAULT_NOTICE_MARGIN_S = math.inf


@dataclass(frozen=True)
class Schedule:
    """Save every ``steps`` optimizer steps, every ``seconds``, automatically, or never
    (all None / False): then only the final save and notice-triggered saves happen."""

    steps: int | None = None
    seconds: float | None = None
    auto: bool = False


def parse_every(every: int | str | None) -> Schedule:
    """``500`` (steps), ``"90s"``/``"10m"``/``"1h"`` (time), ``"auto"`` or ``None`` (never)."""
    if every is None:
        return Schedule()
    if isinstance(every, bool):
        raise ConfigError(f"invalid every={every!r}", hint="use a step count, '10m' or 'auto'")
    if isinstance(every, int):
        if every < 1:
            raise ConfigError(f"every must be at least 1 step, got {every}")
        return Schedule(steps=every)
    if isinstance(every, str):
        text = every.strip().lower()
        if text == "auto":
            return Schedule(auto=True)
        if has_unit(text):
            with contextlib.suppress(ValueError):  # (over ten years: refused below)
                if (seconds := parse_duration_s(text)) > 0:
                    return Schedule(seconds=seconds)
    raise ConfigError(
        f"invalid checkpoint interval every={every!r}",
        hint="use a number of steps (500), a duration ('90s', '10m', '1h'), 'auto' or None",
    )


def young_daly_interval_s(save_cost_s: float, mtbi_s: float) -> float:
    """Daly's higher-order optimum of the time between saves (seconds)."""
    if mtbi_s <= 0:
        raise ValueError("mean time between interruptions must be positive")
    if save_cost_s <= 0:
        return 0.0
    if save_cost_s >= 2 * mtbi_s:
        return mtbi_s
    ratio = save_cost_s / (2 * mtbi_s)
    base = math.sqrt(2 * save_cost_s * mtbi_s)
    return base * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_cost_s


def auto_interval_s(save_cost_s: float, write_s: float, mtbi_s: float) -> float:
    """The auto interval: Young/Daly on the blocking cost, but never shorter than one
    background write, nor than ``MIN_AUTO_INTERVAL_S``."""
    return max(young_daly_interval_s(save_cost_s, mtbi_s), write_s, MIN_AUTO_INTERVAL_S)


def save_due(
    schedule: Schedule,
    *,
    step: int,
    steps_since_save: int,
    seconds_since_save: float,
    save_cost_s: float | None,
    write_s: float | None,
    mtbi_s: float,
) -> bool:
    """Whether to save at this step boundary (``step`` optimizer steps are done). Step
    schedules save at multiples of the count, so an extra save (a notice, a resume) does not
    shift them. In auto mode the first boundary saves (that is how
    the cost gets measured); afterwards the Young/Daly interval applies."""
    if steps_since_save <= 0:
        return False
    if schedule.steps is not None and step % schedule.steps == 0:
        return True
    if schedule.seconds is not None and seconds_since_save >= schedule.seconds:
        return True
    if schedule.auto:
        if save_cost_s is None:
            return True
        return seconds_since_save >= auto_interval_s(save_cost_s, write_s or 0.0, mtbi_s)
    return False


def notice_exit_due(
    remaining_s: float | None,
    *,
    step_s: float | None,
    save_s: float | None,
    margin_s: float = DEFAULT_NOTICE_MARGIN_S,
    steps_per_check: int = 1,
) -> bool:
    """Whether a terminate notice must be acted on (emergency save, exit 75) at this boundary.

    The platforms' notices run from 30 s (GCP, Azure, Kubernetes) to 2 min (AWS) and up to 1 h
    (GCP GPU host maintenance). Acting when ``deadline - now <= save estimate + margin`` (the
    interruption-signals spec) keeps the work of a long notice instead of giving it up at once.
    The estimate counts two checks and two saves, since the check happens only every
    ``steps_per_check`` step boundaries (the ranks' agreement, :func:`agreement_interval`) and
    a save measured earlier may run slower now; the margin covers an upload to a remote tier
    and the process exit. Without a deadline, or without measurements, act at once. The default
    margin is infinite (act at once); ``SPOTWISE_NOTICE_MARGIN_S=60`` or
    ``CheckpointConfig(notice_margin_s=60)`` opts in to training on.
    """
    if remaining_s is None or step_s is None or save_s is None:
        return True
    return remaining_s <= margin_s + 2.0 * (steps_per_check * step_s + save_s)


AGREEMENT_SHARE = 0.01  # of the step time, the most the ranks' agreement may cost (issue 11)
MAX_AGREEMENT_GAP_S = 0.5  # a notice is acted on within two gaps, far inside the shortest (30 s)


def agreement_interval(cost_s: float, step_s: float) -> int:
    """Every how many step boundaries the ranks of a distributed Run agree (on notices, timed
    saves, background saves' progress): the fewest steps that one agreement, costing
    ``cost_s``, takes at most ``AGREEMENT_SHARE`` of, but never more steps than last
    ``MAX_AGREEMENT_GAP_S`` at ``step_s`` each, so that a slow link delays a notice no more."""
    if step_s <= 0:
        return 1
    needed = math.ceil(cost_s / (AGREEMENT_SHARE * step_s))
    return max(1, min(needed, math.floor(MAX_AGREEMENT_GAP_S / step_s)))
