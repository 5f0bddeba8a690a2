"""Placement across zones in the live loop: the job's policy plans over the advisor's best
zones (expected cost from prices and interruption rates), starts in the best one, moves to the
next-ranked one after a preemption, never uses a zone ranked out, and keeps its zone indices
across a controller restart. On the process-free sim double with an injected clock."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from spotwise.control.decisions import RANKED_ZONES
from spotwise.control.progress import Committed
from spotwise.control.store import JobState, Store
from spotwise.control.summary import job_summary
from spotwise.market.interruption import InterruptionModel, RateRow

from .clocksim import Clock, ClockSim, job_for
from .test_live_policy import _run

# The provider's order, its spot prices ($/h) and the advisor's interruption rates (/h): the
# cheapest zone is interrupted every ten minutes, so finishing there costs the most; among the
# others the price decides, and twelve more zones (ap-south-1a..l, $1.50) fill the ranking up
# to RANKED_ZONES. Ranked: us-east-1b, us-west-2a, us-west-2b, eu-west-1a, ap-south-1a..l;
# us-east-1a is ranked out.
FILL = tuple(f"ap-south-1{c}" for c in "abcdefghijkl")
ZONES = ("us-east-1a", "eu-west-1a", "us-west-2b", "us-east-1b", "us-west-2a", *FILL)
PRICES = (0.50, 1.20, 1.10, 0.90, 1.00, *(1.50,) * len(FILL))
RATES = (6.0, 0.05, 0.05, 0.05, 0.05, *(0.05,) * len(FILL))
RANKED = ["us-east-1b", "us-west-2a", "us-west-2b", "eu-west-1a", *FILL]


def _model(rates: tuple[float, ...] = RATES) -> InterruptionModel:
    rows = [RateRow("aws", "", "", "", 0.3, 0, 0.0, 0.3, "default")]
    rows += [
        RateRow("aws", z[:-1], z, "", r, 0, 0.0, r, "test zone")
        for z, r in zip(ZONES, rates, strict=True)
    ]
    return InterruptionModel(rows)


def _sim(available: np.ndarray) -> ClockSim:
    return ClockSim(
        Clock(), ZONES, available, gap_s=600.0, compression=600.0, work_s=12.0,
        changeover_s=0.5, zone_spot_usd_per_hour=PRICES,
    )  # fmt: skip


def _up(lost: dict[str, int] | None = None, ticks: int = 60) -> np.ndarray:
    """Spot everywhere, except from the given tick on in the given zones."""
    avail = np.ones((len(ZONES), ticks), bool)
    for zone, tick in (lost or {}).items():
        avail[ZONES.index(zone), tick:] = False
    return avail


def _job(sim: ClockSim, store: Store, **fields: Any):
    job, _ = job_for(sim, store, policy="spotwise", deadline=30, zone_cooldown=5, **fields)
    return job


def test_the_policy_starts_in_the_advisors_best_zone_and_moves_to_the_next_ranked_one():
    sim = _sim(_up({"us-east-1b": 4}))  # the best zone loses its capacity at tick 4
    store = Store()
    job = _job(sim, store)
    assert _run(sim, store, job.id, interruptions=_model()) is JobState.SUCCEEDED
    attempts = store.attempts(job.id)
    assert [(a.market, a.zone, a.reason) for a in attempts] == [
        ("spot", "us-east-1b", "preempted"),
        ("spot", "us-west-2a", "succeeded"),  # the next-ranked zone, not the provider's next
    ]
    assert store.job(job.id).blocked["us-east-1b"] == pytest.approx(attempts[0].ended_at + 5)
    # the policy plans over exactly the top RANKED_ZONES zones, best first
    doc = store.job(job.id).policy
    assert RANKED_ZONES == 16 == len(RANKED) and doc["zones"] == RANKED
    assert doc["state"]["plan"]["zones"] == [0, 1]  # its two best of them
    [event] = [e for e in store.events(job.id) if e["kind"] == "zones"]
    assert event["data"]["zones"] == RANKED
    costs = [r["expected_cost_usd"] for r in event["data"]["ranked"]]
    assert costs == sorted(costs)
    # the policy's prior is the advisor's rate of each ranked zone
    assert doc["prior_rates_per_h"] == [
        r["interruption_rate_per_h"] for r in event["data"]["ranked"]
    ]
    assert doc["prior_rates_per_h"][:2] == [0.05, 0.05]
    assert job_summary(store, store.job(job.id), now=sim.clock())["policy"]["zones"] == RANKED


def test_a_zone_ranked_out_is_never_used_and_with_every_ranked_zone_out_the_job_goes_on_demand():
    # from tick 3 only the zone ranked out (us-east-1a, cheap but always interrupted) has spot
    sim = _sim(_up({z: 3 for z in RANKED}))
    store = Store()
    job = _job(sim, store)
    assert _run(sim, store, job.id, interruptions=_model()) is JobState.SUCCEEDED
    summary = job_summary(store, store.job(job.id), now=sim.clock())
    placed = [(a["market"], a["zone"], a["reason"]) for a in summary["attempts"]]
    assert placed[0] == ("spot", "us-east-1b", "preempted")
    assert placed[-1] == ("on-demand", "us-east-1b", "succeeded")
    assert all(zone != "us-east-1a" for _, zone, _ in placed)
    assert summary["attempts"][-1]["end"] - job.created_at <= 30


def test_a_resumed_controller_keeps_the_zone_order_the_policy_was_built_with():
    reference_sim = _sim(_up({"us-east-1b": 4}))
    store = Store()
    reference = _job(reference_sim, store)
    assert _run(reference_sim, store, reference.id, interruptions=_model()) is JobState.SUCCEEDED

    sim = _sim(_up({"us-east-1b": 4}))
    job = _job(sim, store)
    kill_at = sim.clock() + 4.7  # after the preemption in us-east-1b
    assert _run(sim, store, job.id, until=kill_at, interruptions=_model()) is None
    assert [a.reason for a in store.attempts(job.id)][:1] == ["preempted"]
    # the next controller's advisor would rank us-east-1b last: the policy keeps its zones
    changed = _model((6.0, 0.05, 0.05, 9.0, 0.05, *RATES[5:]))
    assert _run(sim, store, job.id, interruptions=changed) is JobState.SUCCEEDED
    assert store.job(job.id).policy["zones"] == RANKED
    assert [(a.market, a.zone, a.reason) for a in store.attempts(job.id)] == [
        (a.market, a.zone, a.reason) for a in store.attempts(reference.id)
    ]
    assert len([e for e in store.events(job.id) if e["kind"] == "zones"]) == 1
    # a job ranked by that advisor from the start plans over other zones
    fresh_sim = _sim(_up())
    fresh = _job(fresh_sim, store)
    assert (
        _run(fresh_sim, store, fresh.id, until=fresh_sim.clock() + 1, interruptions=changed) is None
    )
    ranked = ["us-west-2a", "us-west-2b", "eu-west-1a", *FILL, "us-east-1a"]  # 1b never finishes
    assert store.job(fresh.id).policy["zones"] == ranked


def test_an_attempt_placed_before_the_policy_outside_its_zones_is_moved_into_them():
    """With ``steps`` and no ``expected_runtime`` the first attempt is placed before the policy
    exists (in the provider's order: us-east-1a, which the advisor ranks out); once the step
    rate is measured the policy is built over the ranked zones and moves the job there."""
    sim = _sim(_up())
    store = Store()
    job = _job(sim, store, expected_runtime=None)

    def measured(checkpoint_dir: str) -> Committed:  # no rate until a checkpoint is committed
        done = sim.read_progress(checkpoint_dir)
        return done if done.step > 0 else Committed(0, None)

    assert (
        _run(sim, store, job.id, interruptions=_model(), read_progress=measured)
        is JobState.SUCCEEDED
    )
    placed = [(a.market, a.zone, a.reason) for a in store.attempts(job.id)]
    assert placed == [("spot", "us-east-1a", "switched"), ("spot", "us-east-1b", "succeeded")]
    assert store.job(job.id).policy["zones"] == RANKED


@pytest.mark.parametrize("policy", ["uniform-progress", "spotwise"])
def test_on_the_sim_provider_the_job_starts_in_the_advisors_best_zone(workdir, kit, policy):
    """The real ``sim`` provider (a stand-in process per attempt) on shipped traces: its spot
    prices are the catalog's for each zone's region, the rates the shipped interruption model's
    for p3.2xlarge. us-east-2a is both cheaper (us-east-2) and less interrupted (~0.24/h against
    ~0.78/h in us-east-1a); us-west-2c is as rarely interrupted, at us-west-2's higher price."""
    spec = kit.spec(
        workdir, command="python standin.py 0 0.3", market="auto", policy=policy,
        deadline="40s", expected_runtime="1s", changeover="0.5s", decision_interval="0.78s",
        provider={"name": "sim", "trace": "aws-02-15-2023-first30d", "start_hour": 399.5,
                  "zones": ["us-east-1a", "us-west-2c", "us-east-2a"], "time_compression": 250,
                  "boot_s": 0},
    )  # fmt: skip
    summary = kit.run(spec)
    assert summary["state"] == "SUCCEEDED"
    assert summary["policy"]["zones"] == ["us-east-2a", "us-east-1a", "us-west-2c"]
    assert [(a["market"], a["zone"]) for a in summary["attempts"]] == [("spot", "us-east-2a")]


def test_a_stored_policy_without_zone_names_is_refused_with_the_way_out():
    from spotwise.errors import ConfigError
    from spotwise.market.policies.driver import PolicyDriver

    sim = _sim(_up())
    store = Store()
    job = _job(sim, store)
    assert _run(sim, store, job.id, until=sim.clock() + 1, interruptions=_model()) is None
    doc = store.job(job.id).policy
    assert PolicyDriver.from_json(doc).zones == tuple(RANKED)
    with pytest.raises(ConfigError, match="unreadable") as err:
        PolicyDriver.from_json({**doc, "zones": 4})  # as written before zones had names
    assert "resubmit the job" in (err.value.hint or "")
