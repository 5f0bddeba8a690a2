"""Properties on random traces (hypothesis): never miss a feasible deadline, never beat the
optimum, consistent accounting of money, hours and switches."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotwise.market.policies import Problem, make_policy
from spotwise.market.policies.optimal import optimal_costs
from spotwise.market.simulate import Markets, run_ticks, simulate_run

POLICIES = ["on-demand", "greedy", "uniform-progress", "spotwise", "optimal"]


@st.composite
def scenarios(draw):
    gap = draw(st.sampled_from([34.0, 195.0, 600.0, 900.0]))
    d_s = draw(st.sampled_from([0.0, 180.0, 720.0]))
    compute_h = draw(st.sampled_from([0.5, 1.0, 1.5, 2.5]))
    deadline_h = compute_h * draw(st.sampled_from([1.0, 1.1, 1.3, 1.6, 2.2]))
    if draw(st.booleans()):  # mostly feasible for on-demand: R >= C + d
        deadline_h = max(deadline_h, compute_h + d_s / 3600.0)
    problem = Problem(
        compute_h=compute_h,
        deadline_h=deadline_h,
        changeover_h=d_s / 3600.0,
        spot_price_usd_per_hour=draw(st.sampled_from([0.3, 0.918, 2.0])),
        ondemand_price_usd_per_hour=3.06,
    )
    zones = draw(st.integers(1, 2))
    ticks = run_ticks(problem, gap)
    history = draw(st.integers(0, 8))
    flip = draw(st.sampled_from([0.05, 0.2, 0.5]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    steps = rng.random((zones, history + ticks)) < flip
    avail = (np.cumsum(steps, axis=1) + rng.integers(0, 2, (zones, 1))) % 2 == 1
    return problem, Markets(gap, avail, tuple(f"z{i}" for i in range(zones))), history


def _switches(tl, avail) -> tuple[int, int]:
    starts = preempts = 0
    prev_m, prev_z = 0, -1
    for k, (m, z) in enumerate(zip(tl.market, tl.zone, strict=True)):
        if prev_m == 2 and not avail[prev_z, k]:
            preempts += 1
            prev_m, prev_z = 0, -1
        if m != 0 and (m, z) != (prev_m, prev_z):
            starts += 1
        prev_m, prev_z = m, z
    return starts, preempts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_policies_on_random_traces(scenario) -> None:
    problem, markets, start = scenario
    ticks = run_ticks(problem, markets.gap_s)
    dp = optimal_costs(
        problem, markets.available, problem.spot_price_usd_per_hour, markets.gap_s, [start], ticks
    )[0]
    feasible = problem.ondemand_feasible
    if feasible:
        assert np.isfinite(dp)
    for name in POLICIES:
        r = simulate_run(make_policy(name), problem, markets, start, record=True)
        # money: never negative, and exactly hours x prices
        assert r.cost_usd >= 0
        expected = (
            r.spot_hours * problem.spot_price_usd_per_hour
            + r.ondemand_hours * problem.ondemand_price_usd_per_hour
        )
        assert abs(r.cost_usd - expected) < 1e-9
        # deadline: nobody misses a deadline that on-demand only meets
        if feasible:
            assert r.deadline_met, name
        if r.deadline_met:
            assert abs(r.spot_compute_h + r.ondemand_compute_h - problem.compute_h) < 1e-9
            assert r.finish_h is not None and r.finish_h <= problem.deadline_h + 1e-9
            # the optimum is never beaten
            assert dp <= r.cost_usd + 1e-9, name
        # hours: paid = work + changeover time, at most d per start
        overhead = (r.spot_hours + r.ondemand_hours) - (r.spot_compute_h + r.ondemand_compute_h)
        assert -1e-9 <= overhead <= r.changeovers * problem.changeover_h + 1e-9
        # switches: starts and preemptions seen in the timeline match the counters
        assert r.timeline is not None
        avail = markets.available[:, start : start + ticks]
        assert _switches(r.timeline, avail) == (r.changeovers, r.preemptions)
        if name == "optimal" and np.isfinite(dp):
            assert abs(r.cost_usd - dp) < 1e-9
        if name == "on-demand" and feasible:
            assert r.changeovers == 1 and r.preemptions == 0
