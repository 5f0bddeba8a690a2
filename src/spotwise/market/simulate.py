"""Trace-driven simulation of a deadline job under a spot/on-demand policy.

Conventions (exactly those of ``docs/policies.md`` and the project's simulation-model spec):
decisions at tick boundaries; a preemption happens at the boundary where spot disappears and
leaves the job idle; every start pays the changeover ``d`` (not rounded to ticks) at the new
market's price with no progress, and a changeover cut short is lost; billing is per second and
stops when the job completes; a run misses when progress < C at R.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from spotwise.errors import ConfigError, MarketError
from spotwise.market.policies.base import Decision, Market, Policy, Problem
from spotwise.market.policies.driver import PolicyDriver
from spotwise.market.traces import Trace

MARKET_CODE = {Market.IDLE: 0, Market.ONDEMAND: 1, Market.SPOT: 2}


@dataclass(frozen=True, eq=False)
class Markets:
    """Spot availability (zones x ticks) of the traces a job may use, with their prices."""

    gap_s: float
    available: np.ndarray  # bool, zones x ticks
    zone_names: tuple[str, ...]
    spot_prices: np.ndarray | None = None  # usd_per_hour, zones x ticks; None: Problem's price
    # the advisor's interruption rate per running hour of each zone, the policy's prior (the
    # controller hands its policy the same); None: the policy's built-in prior
    prior_rates_per_h: tuple[float, ...] | None = None

    @classmethod
    def from_traces(
        cls, traces: Sequence[Trace], nodes: int = 1, spot_prices: np.ndarray | None = None
    ) -> Markets:
        if not traces:
            raise ConfigError("no trace given", hint="pass --trace FILE (one per zone)")
        gaps = {t.gap_s for t in traces}
        if len(gaps) != 1:
            raise ConfigError(
                f"traces have different tick lengths {sorted(gaps)}",
                hint="replay traces of the same gap_seconds together",
            )
        n = min(t.n_ticks for t in traces)
        avail = np.stack([t.available(nodes)[:n] for t in traces])
        names = tuple(t.zone or t.name for t in traces)
        return cls(traces[0].gap_s, avail, names, spot_prices)

    @property
    def zones(self) -> int:
        return int(self.available.shape[0])

    @property
    def n_ticks(self) -> int:
        return int(self.available.shape[1])

    def prices(self, problem: Problem, start: int, ticks: int) -> np.ndarray:
        """Spot prices (zones x ticks) for the ticks of one run."""
        if self.spot_prices is None:
            return np.full((self.zones, ticks), problem.spot_price_usd_per_hour)
        return np.asarray(self.spot_prices, dtype=float)[:, start : start + ticks]


def run_ticks(problem: Problem, gap_s: float) -> int:
    """T = ceil(R / G): the ticks a run may use (the last one is cut at R)."""
    return max(1, math.ceil(problem.deadline_s / gap_s - 1e-9))


def start_ticks(n_ticks: int, run_len: int, starts: int, first: int = 0) -> list[int]:
    """``starts`` start ticks evenly spaced over [first, n_ticks - run_len], rounded."""
    last = n_ticks - run_len
    if last < first:
        raise ConfigError(
            f"the trace has {n_ticks} ticks but a run needs {run_len} from tick {first}",
            hint="use a longer trace, a shorter --deadline-h or a smaller --start-h",
        )
    if starts < 1:
        raise ConfigError("--starts must be >= 1")
    return sorted({int(x) for x in np.rint(np.linspace(first, last, starts))})


@dataclass
class Timeline:
    """Per tick of one run: what the job did, for pictures and tests."""

    gap_s: float
    available: np.ndarray  # zones x ticks
    market: list[int] = field(default_factory=list)  # MARKET_CODE
    zone: list[int] = field(default_factory=list)  # -1 unless spot
    progress_s: list[float] = field(default_factory=list)  # at the end of the tick
    cost_usd: list[float] = field(default_factory=list)  # cumulative, end of tick


@dataclass
class RunResult:
    start_h: float
    cost_usd: float
    spot_hours: float  # paid, changeovers included
    ondemand_hours: float  # paid, changeovers included
    spot_compute_h: float
    ondemand_compute_h: float
    finish_h: float | None  # hours after the start; None when it missed
    deadline_met: bool
    changeovers: int  # starts of spot or on-demand
    preemptions: int
    timeline: Timeline | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("timeline")
        return d


def simulate_run(
    policy: Policy,
    problem: Problem,
    markets: Markets,
    start: int = 0,
    *,
    record: bool = False,
) -> RunResult:
    """Replay one run of ``policy`` from trace tick ``start``."""
    gap = markets.gap_s
    c_s, r_s, d_s = problem.compute_s, problem.deadline_s, problem.changeover_s
    ticks = run_ticks(problem, gap)
    driver, avail, prices = _start(policy, problem, markets, start, ticks)
    avail_rows = [tuple(r) for r in avail.T.tolist()]
    price_rows = [tuple(r) for r in prices.T.tolist()]
    od_price = problem.ondemand_price_usd_per_hour
    timeline = Timeline(gap_s=gap, available=avail) if record else None

    tally = _Tally()
    market, zone, changeover_left = Market.IDLE, -1, 0.0
    finish: float | None = None
    for k in range(ticks):
        now = k * gap
        here = avail_rows[k]
        preempted = market is Market.SPOT and not here[zone]
        if preempted:
            market, zone, changeover_left = Market.IDLE, -1, 0.0
            tally.preemptions += 1
        decision = driver.decide(
            k,
            tally.progress,
            market,
            zone if zone >= 0 else None,
            changeover_left,
            here,
            price_rows[k],
            od_price,
            preempted,
        )
        new_zone = _check(decision, here, policy)
        if decision.market is not market or new_zone != zone:
            market, zone = decision.market, new_zone
            changeover_left = d_s if market is not Market.IDLE else 0.0
            tally.changeovers += market is not Market.IDLE
        if market is not Market.IDLE:
            price = price_rows[k][zone] if market is Market.SPOT else od_price
            paying, work = tally.run(market, price, min(gap, r_s - now), changeover_left, c_s)
            changeover_left -= paying
            if tally.progress >= c_s - 1e-6:
                finish = now + paying + work
        if timeline is not None:
            timeline.market.append(MARKET_CODE[market])
            timeline.zone.append(zone)
            timeline.progress_s.append(tally.progress)
            timeline.cost_usd.append(tally.cost * problem.nodes)
        if finish is not None:
            break
    return tally.result(start * gap / 3600.0, finish, r_s, problem.nodes, timeline)


def _start(
    policy: Policy, problem: Problem, markets: Markets, start: int, ticks: int
) -> tuple[PolicyDriver, np.ndarray, np.ndarray]:
    """The run's policy, told the traces' past, and its window of availability and prices
    (zones x ticks); only the omniscient optimum is shown that window in advance."""
    if start < 0 or start + ticks > markets.n_ticks:
        raise ConfigError(
            f"a run from tick {start} needs {ticks} ticks; the traces have {markets.n_ticks}",
            hint="choose an earlier --start-h or a shorter --deadline-h",
        )
    avail = markets.available[:, start : start + ticks]
    prices = markets.prices(problem, start, ticks)
    driver = PolicyDriver(
        policy,
        problem,
        markets.gap_s,
        markets.zone_names,
        markets.available[:, :start],
        prior_rates_per_h=markets.prior_rates_per_h,
    )
    plan = getattr(policy, "plan", None)
    if callable(plan):
        plan(avail, prices)
    return driver, avail, prices


@dataclass
class _Tally:
    """What one run has done and paid so far (seconds, usd of one node)."""

    progress: float = 0.0
    spot_paid: float = 0.0
    od_paid: float = 0.0
    spot_work: float = 0.0
    od_work: float = 0.0
    cost: float = 0.0
    changeovers: int = 0  # starts of spot or on-demand
    preemptions: int = 0

    def run(
        self, market: Market, usd_per_hour: float, length: float, changeover_left: float, c_s: float
    ) -> tuple[float, float]:
        """``length`` seconds on ``market``: the changeover left is paid first, then work up to
        ``c_s`` of progress. Returns (changeover paid, work done) in seconds."""
        paying = min(changeover_left, length)
        work = min(length - paying, c_s - self.progress)
        self.progress += work
        paid = paying + work
        if market is Market.SPOT:
            self.spot_paid += paid
            self.spot_work += work
        else:
            self.od_paid += paid
            self.od_work += work
        self.cost += paid * usd_per_hour / 3600.0
        return paying, work

    def result(
        self,
        start_h: float,
        finish: float | None,
        r_s: float,
        nodes: int,
        timeline: Timeline | None,
    ) -> RunResult:
        return RunResult(
            start_h=start_h,
            cost_usd=self.cost * nodes,
            spot_hours=self.spot_paid / 3600.0,
            ondemand_hours=self.od_paid / 3600.0,
            spot_compute_h=self.spot_work / 3600.0,
            ondemand_compute_h=self.od_work / 3600.0,
            finish_h=finish / 3600.0 if finish is not None else None,
            deadline_met=finish is not None and finish <= r_s + 1e-6,
            changeovers=self.changeovers,
            preemptions=self.preemptions,
            timeline=timeline,
        )


def _check(decision: Decision, available: tuple[bool, ...], policy: Policy) -> int:
    """The zone index of a valid decision (-1 unless spot); a bad decision is a policy bug."""
    if decision.market is not Market.SPOT:
        return -1
    z = decision.zone
    if z is None or not 0 <= z < len(available) or not available[z]:
        raise MarketError(
            f"policy {policy.name!r} chose spot in zone {z}, which is not available now",
            hint="a policy may only choose spot in a zone whose 'available' flag is true",
        )
    return z


@dataclass
class Summary:
    policy: str
    runs: list[RunResult]

    @property
    def mean_cost_usd(self) -> float:
        return float(np.mean([r.cost_usd for r in self.runs]))

    @property
    def mean_spot_hours(self) -> float:
        return float(np.mean([r.spot_hours for r in self.runs]))

    @property
    def mean_ondemand_hours(self) -> float:
        return float(np.mean([r.ondemand_hours for r in self.runs]))

    @property
    def mean_ondemand_compute_h(self) -> float:
        return float(np.mean([r.ondemand_compute_h for r in self.runs]))

    @property
    def misses(self) -> int:
        return sum(not r.deadline_met for r in self.runs)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "mean_cost_usd": self.mean_cost_usd,
            "mean_spot_hours": self.mean_spot_hours,
            "mean_ondemand_hours": self.mean_ondemand_hours,
            "mean_ondemand_compute_h": self.mean_ondemand_compute_h,
            "misses": self.misses,
            "runs": [r.to_json() for r in self.runs],
        }


def simulate(
    policy: str | Callable[[], Policy],
    problem: Problem,
    markets: Markets,
    starts: Sequence[int],
    *,
    record: bool = False,
) -> Summary:
    """Run a policy (a registry name or a factory) once per start tick."""
    from spotwise.market.policies import make_policy

    factory: Callable[[], Policy] = (
        (lambda: make_policy(policy)) if isinstance(policy, str) else policy
    )
    runs = [simulate_run(factory(), problem, markets, s, record=record) for s in starts]
    name = policy if isinstance(policy, str) else factory().name
    return Summary(policy=name, runs=runs)


COMPARED = ("on-demand", "greedy", "uniform-progress", "spotwise", "optimal")


def compare(
    problem: Problem,
    markets: Markets,
    starts: Sequence[int],
    policies: Sequence[str] = COMPARED,
    *,
    on_run: Callable[[], None] | None = None,
) -> list[Summary]:
    """Every policy on the same runs (``on_run`` is called after each run, for progress bars)."""
    from spotwise.market.policies import make_policy

    out = []
    for name in policies:
        runs = []
        for s in starts:
            runs.append(simulate_run(make_policy(name), problem, markets, s))
            if on_run is not None:
                on_run()
        out.append(Summary(policy=name, runs=runs))
    return out


def relative_costs(summaries: Sequence[Summary]) -> dict[str, dict[str, float | None]]:
    """Each policy's mean cost over on-demand only's and over the optimum's (when present)."""
    by = {s.policy: s.mean_cost_usd for s in summaries}
    od, opt = by.get("on-demand"), by.get("optimal")
    return {
        name: {
            "vs_ondemand": cost / od if od else None,
            "vs_optimal": cost / opt if opt else None,
        }
        for name, cost in by.items()
    }
