"""The simulator's accounting, checked against runs worked out by hand, and the reference figures.

Hand-worked setting: ticks of 600 s, C = 1 h, R = 3 h, d = 0.2 h = 720 s (one whole tick plus
120 s), spot $0.918/h, on-demand $3.06/h.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pytest

from spotwise.errors import ConfigError, MarketError
from spotwise.market.policies import Decision, Problem, make_policy
from spotwise.market.policies.base import BasePolicy, Observation
from spotwise.market.policies.optimal import optimal_costs
from spotwise.market.simulate import (
    Markets,
    run_ticks,
    simulate,
    simulate_run,
    start_ticks,
)
from spotwise.market.traces import Trace, load_trace

SHARED = Path(__file__).resolve().parents[2] / "data/public/traces/availability/1-node"
SMALL = Problem(compute_h=1, deadline_h=3, changeover_h=0.2)


def markets(*rows: list[int], gap_s: float = 600) -> Markets:
    return Markets.from_traces(
        [Trace(gap_s, np.array(r), zone=f"z{i}") for i, r in enumerate(rows)]
    )


def test_greedy_run_by_hand_with_preemption() -> None:
    # spot: ticks 0-1 up, 2-3 down, then up. Greedy: start spot (600 s changeover + 120 s of the
    # next tick), 480 s of work, preempted at 1200 s, idle 2 ticks, restart (full 720 s again),
    # then work until 3600 s of progress at 6240 s.
    m = markets([1, 1, 0, 0] + [1] * 20)
    r = simulate_run(make_policy("greedy"), SMALL, m, 0)
    assert r.deadline_met and r.finish_h == pytest.approx(6240 / 3600)
    assert r.spot_hours == pytest.approx(5040 / 3600)  # paid, changeovers included
    assert r.spot_compute_h == pytest.approx(1.0)
    assert r.ondemand_hours == 0
    assert r.cost_usd == pytest.approx(5040 / 3600 * 0.918)
    assert (r.changeovers, r.preemptions) == (2, 1)


def test_changeover_cut_short_is_lost_and_paid_again_in_full() -> None:
    m = markets([1, 0] + [1] * 20)
    r = simulate_run(make_policy("greedy"), SMALL, m, 0)
    # 600 s of changeover lost at the preemption; the restart pays 720 s again
    assert r.spot_hours == pytest.approx((600 + 720 + 3600) / 3600)
    assert r.finish_h == pytest.approx((2 * 600 + 720 + 3600) / 3600)


def test_uniform_progress_run_by_hand() -> None:
    # After the preemption the job is ahead of ep(t) at 1200 s (480 >= 400) and waits; at 1800 s
    # it is behind (480 < 600) and starts on-demand; it goes back to spot at 4200 s, the first
    # boundary where progress (2160) >= ep(t + 2d) = (4200 + 1440) / 3 = 1880.
    m = markets([1, 1, 0, 0] + [1] * 20)
    r = simulate_run(make_policy("uniform-progress"), SMALL, m, 0, record=True)
    assert r.timeline is not None
    assert r.timeline.market[:11] == [2, 2, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert r.ondemand_hours == pytest.approx(2400 / 3600)
    assert r.ondemand_compute_h == pytest.approx(1680 / 3600)
    assert r.spot_hours == pytest.approx(3360 / 3600)
    assert r.finish_h == pytest.approx(6360 / 3600)
    assert r.cost_usd == pytest.approx(2400 / 3600 * 3.06 + 3360 / 3600 * 0.918)
    assert (r.changeovers, r.preemptions) == (3, 1)


def test_on_demand_only_and_spot_always_cost_exactly() -> None:
    m = markets([1] * 24)
    od = simulate_run(make_policy("on-demand"), SMALL, m, 0)
    assert od.cost_usd == pytest.approx(1.2 * 3.06) and od.finish_h == pytest.approx(1.2)
    spot = simulate_run(make_policy("greedy"), SMALL, m, 0)
    assert spot.cost_usd == pytest.approx(1.2 * 0.918)
    opt = simulate_run(make_policy("optimal"), SMALL, m, 0)
    assert opt.cost_usd == pytest.approx(1.2 * 0.918)


def test_safety_net_takes_over_when_spot_never_comes() -> None:
    m = markets([0] * 24)
    r = simulate_run(make_policy("greedy"), SMALL, m, 0, record=True)
    assert r.deadline_met and r.finish_h is not None and r.finish_h <= 3
    # idle while R(t) >= C(t) + 2d: slack 7200 s falls below 1440 s after 10 idle ticks
    assert r.timeline is not None and r.timeline.market[:10] == [0] * 10
    assert r.timeline.market[10] == 1


def test_nodes_multiply_cost_and_gate_availability() -> None:
    m = Markets.from_traces([Trace(600, np.array([1] * 24))], nodes=2)
    p2 = Problem(compute_h=1, deadline_h=3, changeover_h=0.2, nodes=2)
    r = simulate_run(make_policy("greedy"), p2, m, 0)
    assert r.spot_hours == 0  # one instance is not enough for two nodes
    assert r.cost_usd == pytest.approx(2 * 1.2 * 3.06)


def test_spot_price_series_is_charged_per_tick() -> None:
    prices = np.full((1, 24), 1.0)
    prices[0, 1] = 10.0
    m = Markets(600, np.ones((1, 24), bool), ("z",), spot_prices=prices)
    r = simulate_run(make_policy("greedy"), SMALL, m, 0)
    # 4320 s paid (720 s changeover + 3600 s work): tick 0 at $1/h, tick 1 at $10/h, 3120 s at $1/h
    assert r.cost_usd == pytest.approx((600 * 1 + 600 * 10 + 3120 * 1) / 3600)


def test_last_tick_is_cut_at_the_deadline() -> None:
    p = Problem(compute_h=0.5, deadline_h=0.75, changeover_h=0.0)
    assert run_ticks(p, 600) == 5  # 2700 s = 4.5 ticks


def test_policy_choosing_unavailable_spot_is_an_error() -> None:
    class Bad(BasePolicy):
        name = "bad"

        def decide(self, obs: Observation) -> Decision:
            return Decision.spot(0)

    with pytest.raises(MarketError, match="not available"):
        simulate_run(Bad(), SMALL, markets([0] * 24), 0)


def test_start_ticks_are_evenly_spaced_and_validated() -> None:
    assert start_ticks(100, 20, 5) == [0, 20, 40, 60, 80]
    assert start_ticks(100, 20, 1) == [0]
    assert start_ticks(100, 20, 3, first=10) == [10, 45, 80]
    with pytest.raises(ConfigError, match="needs 20"):
        start_ticks(10, 20, 1)
    with pytest.raises(ConfigError, match="different tick"):
        Markets.from_traces([Trace(600, np.ones(5)), Trace(195, np.ones(5))])
    with pytest.raises(ConfigError):
        simulate_run(make_policy("greedy"), SMALL, markets([1] * 10), 0)


def test_optimal_replay_matches_the_dp_value() -> None:
    rng = np.random.default_rng(7)
    av = (rng.random((2, 60)) < 0.6).astype(int)
    m = markets(*av.tolist())
    for s in (0, 17, 36):
        r = simulate_run(make_policy("optimal"), SMALL, m, s)
        dp = optimal_costs(SMALL, m.available, 0.918, 600, [s], run_ticks(SMALL, 600))[0]
        assert r.cost_usd == pytest.approx(dp, abs=1e-9)
        assert r.deadline_met


def test_reference_figures_on_the_2022_traces() -> None:
    """The spec's reference table, first row: all 8 traces of aws-10-26-2022, 300 starts each,
    averaged per trace then across traces. A faithful simulator lands on these to the cent."""
    problem = Problem(compute_h=48, deadline_h=60, changeover_h=0.2)
    files = sorted(glob.glob(str(SHARED / "aws-10-26-2022" / "*.json")))
    assert len(files) == 8
    costs: dict[str, list[float]] = {"greedy": [], "uniform-progress": [], "optimal": []}
    od_work: dict[str, list[float]] = {"greedy": [], "uniform-progress": []}
    for f in files:
        m = Markets.from_traces([load_trace(f)])
        ticks = run_ticks(problem, m.gap_s)
        starts = start_ticks(m.n_ticks, ticks, 300)
        for name in od_work:
            s = simulate(name, problem, m, starts)
            assert s.misses == 0
            costs[name].append(s.mean_cost_usd)
            od_work[name].append(s.mean_ondemand_compute_h)
        opt = optimal_costs(problem, m.available, 0.918, m.gap_s, starts, ticks)
        costs["optimal"].append(float(opt.mean()))
    assert np.mean(costs["greedy"]) == pytest.approx(108.90, abs=0.01)
    assert np.mean(costs["uniform-progress"]) == pytest.approx(102.91, abs=0.01)
    assert np.mean(costs["optimal"]) == pytest.approx(92.80, abs=0.01)
    assert np.mean(od_work["greedy"]) == pytest.approx(29.4, abs=0.05)
    assert np.mean(od_work["uniform-progress"]) == pytest.approx(25.3, abs=0.05)
