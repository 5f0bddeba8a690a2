"""Each policy's rules on hand-made observations, the registry, and the no-peeking guarantee."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spotwise.errors import UnknownBackendError
from spotwise.market.policies import POLICIES, Decision, Market, Observation, Problem, make_policy
from spotwise.market.policies.spotwise import (
    SpotwisePolicy,
    hazard_estimate,
    planning_problem,
    run_age,
)
from spotwise.market.simulate import Markets, simulate_run
from spotwise.market.traces import Trace

H = 3600.0
PROBLEM = Problem(compute_h=48, deadline_h=60, changeover_h=0.2)


def obs(
    t_h: float,
    progress_h: float,
    market: Market = Market.IDLE,
    available: tuple[bool, ...] = (True,),
    zone: int | None = None,
) -> Observation:
    return Observation(
        tick=round(t_h * H / 600),
        elapsed_s=t_h * H,
        progress_s=progress_h * H,
        market=market,
        zone=zone if zone is not None else (0 if market is Market.SPOT else None),
        changeover_left_s=0.0,
        available=available,
        spot_prices=(0.918,) * len(available),
        ondemand_price=3.06,
        compute_s=PROBLEM.compute_s,
        deadline_s=PROBLEM.deadline_s,
        changeover_s=PROBLEM.changeover_s,
        gap_s=600.0,
    )


def fresh(name: str, zones: int = 1):
    p = make_policy(name)
    p.reset(PROBLEM, 600.0, zones, None)
    return p


def test_registry_lists_all_policies_and_rejects_typos() -> None:
    assert POLICIES.names() == ["greedy", "on-demand", "optimal", "spotwise", "uniform-progress"]
    with pytest.raises(UnknownBackendError, match="did you mean greedy"):
        make_policy("greedie")


def test_observation_slack_and_safety_net() -> None:
    o = obs(10, 5)
    assert o.remaining_s == 50 * H and o.remaining_compute_s == 43 * H
    assert o.slack_s == 7 * H and not o.safety_net
    # R(t) - C(t) = 0.39 h < 2d = 0.4 h
    assert obs(59.61 - 48 + 10, 10).safety_net
    assert not obs(59.6 - 48 + 10, 10).safety_net


@pytest.mark.parametrize(
    ("o", "expected"),
    [
        (obs(1, 0, available=(True,)), Decision.spot(0)),
        (obs(1, 0, available=(False,)), Decision.idle()),
        (obs(1, 0.5, Market.SPOT), Decision.spot(0)),
        (obs(11.7, 0, available=(True,)), Decision.ondemand()),  # slack 0.3 h < 2d
    ],
)
def test_greedy_rules(o: Observation, expected: Decision) -> None:
    assert fresh("greedy").decide(o) == expected


def test_greedy_safety_net_is_for_good() -> None:
    g = fresh("greedy")
    assert g.decide(obs(11.7, 0, available=(False,))) == Decision.ondemand()
    assert g.decide(obs(11.8, 0.1, Market.ONDEMAND, available=(True,))) == Decision.ondemand()


@pytest.mark.parametrize(
    ("o", "expected"),
    [
        # idle: spot whenever available, even far behind the line ("taking risks")
        (obs(10, 0, available=(True,)), Decision.spot(0)),
        # idle, no spot, behind ep(10 h) = 8 h -> on-demand
        (obs(10, 7.9, available=(False,)), Decision.ondemand()),
        # idle, no spot, on the line -> wait
        (obs(10, 8.0, available=(False,)), Decision.idle()),
        # on spot: stay until preempted
        (obs(10, 1, Market.SPOT), Decision.spot(0)),
        # on-demand: leave for spot only when progress >= ep(t + 2d) = 0.8 * 10.4 = 8.32 h
        (obs(10, 8.31, Market.ONDEMAND, available=(True,)), Decision.ondemand()),
        (obs(10, 8.32, Market.ONDEMAND, available=(True,)), Decision.spot(0)),
        # on-demand never goes idle, even far ahead
        (obs(10, 9.5, Market.ONDEMAND, available=(False,)), Decision.ondemand()),
    ],
)
def test_uniform_progress_rules(o: Observation, expected: Decision) -> None:
    assert fresh("uniform-progress").decide(o) == expected


def test_uniform_progress_keeps_on_demand_when_safety_net_condition_holds() -> None:
    # way ahead of the line but slack 0.3 h < 2d: switching to spot is not allowed
    up = fresh("uniform-progress")
    assert up.decide(obs(59.5, 47.2, Market.ONDEMAND)) == Decision.ondemand()


def test_single_zone_baselines_use_the_first_zone_only() -> None:
    o = obs(1, 0.8, available=(False, True))  # on the uniform line
    assert fresh("greedy", 2).decide(o) == Decision.idle()
    assert fresh("uniform-progress", 2).decide(o) == Decision.idle()


def test_hazard_estimate_learns_from_counts() -> None:
    # blocks of 10 up / 10 down: one age bucket = a plain two-state chain
    seq = np.tile(np.r_[np.ones(10, bool), np.zeros(10, bool)], 10)
    (down,), (up,) = hazard_estimate(seq, 600.0, ages=1, prior_weight_h=0.0)
    assert up == pytest.approx(10 / 100) and down == pytest.approx(9 / 99)
    # two buckets: a run never ends at age 1 here; older runs end 1 time in 9
    down2, up2 = hazard_estimate(seq, 600.0, ages=2, prior_weight_h=0.0)
    assert up2 == pytest.approx((0.0 + 1e-4, 10 / 90))
    assert down2[0] == pytest.approx(1e-4) and down2[1] == pytest.approx(9 / 89)
    # three buckets double in length: ages 1, 2-3, 4+; every run ends in the last one
    down3, up3 = hazard_estimate(seq, 600.0, ages=3, prior_weight_h=0.0)
    assert up3 == pytest.approx((1e-4, 1e-4, 10 / 70))
    assert down3 == pytest.approx((1e-4, 1e-4, 9 / 69))  # the last down run is cut short
    # no data: the prior (2 h mean up and down at 600 s ticks)
    (down0,), (up0,) = hazard_estimate(np.zeros(0, bool), 600.0, ages=1)
    assert (down0, up0) == pytest.approx((1 / 12, 1 / 12))


def test_run_age_is_the_bucket_of_the_latest_run() -> None:
    assert run_age([True, False, False, False], 2) == 1  # age 3: bucket "2 or older"
    assert run_age([True, False, False, False], 5) == 1  # age 3: bucket 2-3
    assert run_age([True] + [False] * 5, 5) == 2  # age 5: bucket 4-7
    assert run_age([False] * 40, 5) == 4  # age 40: the open bucket 16+
    assert run_age([False, True], 3) == 0
    assert run_age([False, True, True, True], 3, stride=2) == 1  # 2 planning ticks


def test_plan_buckets_shrink_with_the_zones_planned() -> None:
    # one zone: 4 age buckets (8 joint states); two zones: 2 each (16 <= max_states)
    a = np.ones((2, 400), bool)
    for zones, buckets in ((1, 4), (2, 2)):
        sw = SpotwisePolicy()
        simulate_run(sw, PROBLEM, Markets(600.0, a[:zones], ("a", "b")[:zones]), 0)
        plan = sw.state()["plan"]
        assert len(plan["zones"]) == zones
        assert [len(up) for _, up in plan["hazards"]] == [buckets] * zones


def test_planning_problem_coarsens_only_large_lattices() -> None:
    assert planning_problem(PROBLEM, 600.0, 800) is PROBLEM
    p = planning_problem(PROBLEM, 195.0, 800)
    assert p.changeover_s == pytest.approx(715.0)  # 3 ticks + 130 s (a 65 s grid)


def test_spotwise_hops_to_another_zone_when_preempted() -> None:
    # zone 0 goes away for long; zone 1 is up: spotwise continues in zone 1 instead of waiting
    a = np.ones((2, 400), bool)
    a[0, 50:] = False
    m = Markets(600.0, a, ("a", "b"))
    p = Problem(compute_h=24, deadline_h=30, changeover_h=0.2)
    r = simulate_run(SpotwisePolicy(), p, m, 0, record=True)
    assert r.deadline_met and r.ondemand_hours == 0
    assert r.timeline is not None and 1 in r.timeline.zone


def test_spotwise_guard_overrides_a_risky_plan() -> None:
    sw = SpotwisePolicy()
    sw.reset(PROBLEM, 600.0, 1, None)
    sw._planned = lambda o: Decision.idle()  # type: ignore[method-assign]  # a reckless plan
    assert sw.decide(obs(11.7, 0, available=(False,))) == Decision.ondemand()
    sw.reset(PROBLEM, 600.0, 1, None)
    sw._planned = lambda o: Decision.spot(0)  # type: ignore[method-assign]
    on_od = obs(59.5, 47.2, Market.ONDEMAND)
    assert sw.decide(on_od) == Decision.ondemand()


def _bursty(rng: np.random.Generator, zones: int, n: int) -> np.ndarray:
    out = np.zeros((zones, n), bool)
    for z in range(zones):
        state = bool(rng.random() < 0.5)
        for i in range(n):
            if rng.random() < 0.15:
                state = not state
            out[z, i] = state
    return out


@pytest.mark.parametrize("name", ["on-demand", "greedy", "uniform-progress", "spotwise"])
def test_decisions_never_depend_on_the_future(name: str) -> None:
    """Altering the trace after tick t leaves every decision up to t unchanged."""
    rng = np.random.default_rng(3)
    p = Problem(compute_h=6, deadline_h=8, changeover_h=0.2)
    for _ in range(3):
        av = _bursty(rng, 2, 120)
        start, t = int(rng.integers(0, 30)), int(rng.integers(5, 40))
        base = simulate_run(
            make_policy(name), p, Markets(600.0, av, ("a", "b")), start, record=True
        )
        changed = av.copy()
        changed[:, start + t + 1 :] = rng.random(changed[:, start + t + 1 :].shape) < 0.5
        alt = simulate_run(
            make_policy(name), p, Markets(600.0, changed, ("a", "b")), start, record=True
        )
        assert base.timeline is not None and alt.timeline is not None
        upto = min(t + 1, len(base.timeline.market), len(alt.timeline.market))
        assert base.timeline.market[:upto] == alt.timeline.market[:upto]
        assert base.timeline.zone[:upto] == alt.timeline.zone[:upto]


def test_optimal_does_use_the_future() -> None:
    """The control for the test above: the omniscient optimum's first decision moves with it."""
    p = Problem(compute_h=1, deadline_h=2, changeover_h=0.2)
    up_now = np.ones((1, 30), bool)
    short = up_now.copy()
    short[0, 1:] = False  # spot up now, gone after one tick: waiting/on-demand beats a spot start
    first = [
        simulate_run(make_policy("optimal"), p, Markets(600.0, a, ("a",)), 0, record=True)
        for a in (up_now, short)
    ]
    assert [r.timeline.market[0] for r in first if r.timeline] != [2, 2]


def test_observation_is_plain_data() -> None:
    o = obs(1, 0)
    assert dataclasses.replace(o, tick=2).tick == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.tick = 3  # type: ignore[misc]
    assert isinstance(Trace(600, np.ones(3)).available(), np.ndarray)
