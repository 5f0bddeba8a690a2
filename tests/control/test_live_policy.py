"""The job's one policy in the live loop, on a process-free sim double with an injected clock:
the same decisions as the simulator, mid-run switches, kill-and-resume, status outages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from spotwise.control.controller import Controller
from spotwise.control.decisions import live_problem
from spotwise.control.pricing import zone_interruption_rates
from spotwise.control.store import JobState, Store
from spotwise.control.summary import job_summary
from spotwise.errors import TransientProviderError
from spotwise.market.interruption import load_interruption_model
from spotwise.market.policies import make_policy
from spotwise.market.simulate import Markets, simulate_run

from .clocksim import Clock, ClockSim, job_for


class Killed(Exception):
    """Stands for SIGKILL: the controller object is gone; only the store remains."""


def _sim(available: np.ndarray, work_s: float = 10.0, **kw: Any) -> ClockSim:
    zones = tuple("abcdefgh"[: available.shape[0]])
    return ClockSim(
        Clock(),
        zones,
        available,
        gap_s=600.0,
        compression=600.0,
        work_s=work_s,
        changeover_s=0.5,
        **kw,
    )


def _run(
    sim: ClockSim,
    store: Store,
    job_id: str,
    *,
    until: float | None = None,
    seen: list[dict[str, Any]] | None = None,
    **options: Any,
) -> JobState | None:
    """Run a controller on the double; ``until``: "kill" it at that wall time; ``options``:
    more of the Controller's arguments."""

    def update(job, attempts) -> None:
        if (
            seen is not None
            and job.policy is not None
            and (not seen or seen[-1]["tick"] != job.policy["tick"])
        ):
            seen.append(job.policy)
        if until is not None and sim.clock() >= until:
            raise Killed

    ctl = Controller(
        store,
        job_id,
        clock=sim.clock,
        sleep=sim.clock.sleep,
        provider=sim,
        on_update=update,
        **{"read_progress": sim.read_progress, **options},
    )
    try:
        return ctl.run()
    except Killed:
        return None


def _segments(timeline) -> list[tuple[str, int | None]]:
    """The simulator's placements in order (consecutive ticks in one placement are one)."""
    names = {1: "on-demand", 2: "spot"}
    out, prev = [], (0, -1)
    for m, z in zip(timeline.market, timeline.zone, strict=True):
        if (m, z) != prev and m:
            out.append((names[m], z if m == 2 else None))
        prev = (m, z)
    return out


def _simulated(sim: ClockSim, policy: str, deadline_wall_s: float):
    problem, gap = live_problem(
        sim.work_s,
        deadline_wall_s,
        sim.changeover_s,
        sim.gap_s / sim.compression,
        sim.compression,
        sim.spot_usd_per_hour,
        sim.ondemand_usd_per_hour,
    )
    # the advisor's rates of the zones: the prior the controller gives its policy
    rates = zone_interruption_rates(load_interruption_model(), None, sim.zones)
    markets = Markets(gap, sim.available, sim.zones, prior_rates_per_h=rates)
    return simulate_run(make_policy(policy), problem, markets, sim.start_tick, record=True)


@pytest.mark.parametrize(
    ("policy", "up", "down", "work", "deadline"),
    [
        ("uniform-progress", 3, 7, 10, 20),
        # it waits out part of the outage, then buys on-demand; (a 4 h job: starting from the
        # advisor's prior of ~4 h spot runs, a shorter one finishes on on-demand instead)
        ("spotwise", 2, 8, 24, 32),
    ],
)
def test_spot_comes_back_after_on_demand_and_the_live_loop_follows_the_simulator(
    policy, up, down, work, deadline
):
    sim = _sim(np.array([[1] * up + [0] * down + [1] * 40], bool), work_s=work)
    store = Store()
    job, _ = job_for(sim, store, policy=policy, deadline=deadline)
    assert _run(sim, store, job.id) is JobState.SUCCEEDED
    summary = job_summary(store, store.job(job.id), now=sim.clock())
    expected = _simulated(sim, policy, deadline)
    live = [
        (a["market"], "abc".index(a["zone"]) if a["market"] == "spot" else None)
        for a in summary["attempts"]
    ]
    assert live == _segments(expected.timeline)
    assert [a["reason"] for a in summary["attempts"]] == ["preempted", "switched", "succeeded"]
    assert summary["switches"] == 1 and summary["preemptions"] == 1
    assert summary["cost_usd"] == pytest.approx(expected.cost_usd, rel=1e-6)
    finish = summary["attempts"][-1]["end"] - job.created_at
    assert finish == pytest.approx(expected.finish_h * 3600 / sim.compression, abs=1e-6)
    assert finish <= deadline
    assert summary["policy"]["name"] == policy


def test_a_controller_killed_between_decisions_resumes_with_the_same_beliefs():
    rng = np.random.default_rng(3)
    avail = rng.random((3, 60)) < 0.7
    reference: list[dict[str, Any]] = []
    sim = _sim(avail, work_s=14.0)
    store = Store()
    job, _ = job_for(sim, store, policy="spotwise", deadline=30)
    assert _run(sim, store, job.id, seen=reference) is JobState.SUCCEEDED

    resumed: list[dict[str, Any]] = []
    sim2 = _sim(avail, work_s=14.0)
    job2, _ = job_for(sim2, store, policy="spotwise", deadline=30)
    for kill_at in (sim2.clock() + 3.3, sim2.clock() + 7.8, sim2.clock() + 12.1):
        assert _run(sim2, store, job2.id, until=kill_at, seen=resumed) is None
    assert _run(sim2, store, job2.id, seen=resumed) is JobState.SUCCEEDED
    # every decision and every learned state equals the uninterrupted controller's
    assert [d["tick"] for d in resumed] == [d["tick"] for d in reference]
    assert resumed == reference
    assert len(reference[-1]["state"]["past"][0]) == len(reference)  # it learned every tick
    a1 = [(a.market, a.zone, a.reason) for a in store.attempts(job.id)]
    assert a1 == [(a.market, a.zone, a.reason) for a in store.attempts(job2.id)]


@pytest.mark.parametrize(
    ("failures", "error"), [(1, TimeoutError), (25, TimeoutError), (25, TransientProviderError)]
)
def test_status_outage_never_relaunches_a_healthy_attempt(failures, error):
    sim = _sim(np.ones((1, 60), bool), work_s=20.0, failing=failures, failure=error)
    store = Store()
    job, _ = job_for(sim, store, deadline=40)
    sim.outage_at = job.created_at + 3  # once the attempt is training
    assert _run(sim, store, job.id) is JobState.SUCCEEDED
    attempts = store.attempts(job.id)
    assert [(a.market, a.reason) for a in attempts] == [("spot", "succeeded")]
    assert sim.failing == 0 and len(sim.attempts) == 1  # every failure was seen, no relaunch
    outages = [e for e in store.events(job.id) if e["kind"] == "control-plane"]
    assert outages and "timed out" in outages[0]["message"]
    # billed once, from launch to the end of the work: nothing paid twice
    assert attempts[0].ended_at - attempts[0].started_at == pytest.approx(20.5)


def test_preempted_in_one_zone_the_next_attempt_is_elsewhere():
    avail = np.ones((3, 60), bool)
    avail[0, 4:] = False  # zone a loses its capacity at tick 4; b and c stay free
    sim = _sim(avail, work_s=12.0)
    store = Store()
    job, _ = job_for(sim, store, policy="spotwise", deadline=30, zone_cooldown=5)
    assert _run(sim, store, job.id) is JobState.SUCCEEDED
    attempts = store.attempts(job.id)
    assert (attempts[0].zone, attempts[0].reason) == ("a", "preempted")
    assert attempts[1].market == "spot" and attempts[1].zone != "a"
    assert store.job(job.id).blocked["a"] == pytest.approx(attempts[0].ended_at + 5)


@pytest.mark.parametrize("order", [("a", "b", "c"), ("c", "a", "b")])
def test_zones_the_policy_cannot_tell_apart_keep_the_provider_order(order):
    # every zone always free and no history: the provider's order (for aws, the advisor's
    # ranking) is the policy's ranking; it plans over the first two and starts in the first
    sim = ClockSim(
        Clock(), order, np.ones((3, 40), bool), gap_s=600.0, compression=600.0, work_s=8.0,
        changeover_s=0.5,
    )  # fmt: skip
    store = Store()
    job, _ = job_for(sim, store, policy="spotwise", deadline=20)
    assert _run(sim, store, job.id) is JobState.SUCCEEDED
    assert [a.zone for a in store.attempts(job.id)] == [order[0]]
    assert store.job(job.id).policy["state"]["plan"]["zones"] == [0, 1]


def test_without_expected_runtime_the_policy_starts_from_the_measured_step_rate():
    sim = _sim(np.ones((1, 40), bool), work_s=6.0)
    store = Store()
    job, _ = job_for(sim, store, deadline=20, expected_runtime=None)
    assert _run(sim, store, job.id) is JobState.SUCCEEDED
    problem = store.job(job.id).policy["problem"]
    assert problem["compute_h"] * 3600 == pytest.approx(6.0 * sim.compression)  # steps / rate


def test_job_file_terms_of_the_live_policy():
    from spotwise.control.spec import parse_spec
    from spotwise.errors import ConfigError

    spec = parse_spec(
        {
            "command": "python t.py",
            "steps": 400,
            "changeover": "3s",
            "decision_interval": "0.78s",
            "policy": "spotwise",
        }
    )
    assert (spec.steps, spec.changeover_s, spec.decision_interval_s) == (400, 3.0, 0.78)
    with pytest.raises(ConfigError, match=r"policy 'optimal' needs the future.*spotwise"):
        parse_spec({"command": "python t.py", "policy": "optimal"})  # it needs the future
    with pytest.raises(ConfigError, match=r"decision_interval: 'soon' is not a duration"):
        parse_spec({"command": "python t.py", "decision_interval": "soon"})


def test_an_older_job_database_gains_the_policy_column(tmp_path, monkeypatch):
    import sqlite3

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    db = sqlite3.connect(tmp_path / "spotwise.db")
    db.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_json TEXT NOT "
        "NULL, spec_path TEXT, state TEXT NOT NULL, created_at REAL NOT NULL, updated_at "
        "REAL NOT NULL, cancel_requested INTEGER NOT NULL DEFAULT 0, next_launch_at REAL "
        "NOT NULL DEFAULT 0, errors_used INTEGER NOT NULL DEFAULT 0, message TEXT NOT "
        "NULL DEFAULT '', blocked_json TEXT NOT NULL DEFAULT '{}', control_error_since "
        "REAL, stop_reason TEXT NOT NULL DEFAULT '')"
    )
    db.execute(
        "INSERT INTO jobs (id, name, spec_json, state, created_at, updated_at) VALUES "
        "('old-1', 'old', '{}', 'SUCCEEDED', 0, 0)"
    )
    db.commit()
    db.close()
    store = Store()
    assert store.job("old-1").policy is None
    store.update_job("old-1", policy={"policy": "greedy", "tick": 3})
    assert Store().job("old-1").policy == {"policy": "greedy", "tick": 3}


def test_controller_sigkilled_between_decisions_resumes_the_persisted_policy(workdir, kit):
    """A real controller process killed with SIGKILL; `spotwise resume` continues the policy
    from its stored state (what it learned so far), not from a cold prior."""
    import json as _json
    import signal
    import subprocess
    import sys
    import time

    traces = workdir / "traces"
    traces.mkdir()
    for zone in ("za", "zb"):
        (traces / f"{zone}_v100_1.json").write_text(
            _json.dumps({"metadata": {"gap_seconds": 10}, "data": [1] * 5000})
        )
    spec = kit.spec(
        workdir, command="python standin.py 0 120", market="auto", policy="spotwise",
        deadline="300s", expected_runtime="120s", changeover="1s", decision_interval="0.5s",
        provider={"name": "sim", "trace": str(traces), "zones": ["za", "zb"],
                  "time_compression": 20, "boot_s": 0, "spot_usd_per_hour": 1.0,
                  "ondemand_usd_per_hour": 3.0},
    )  # fmt: skip
    from spotwise.control.submission import submit

    store = Store()
    job = submit(store, spec)

    def controller() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", "from spotwise.cli.main import main; main()", "resume",
             job.id, "--quiet"], start_new_session=True, stdout=subprocess.DEVNULL)  # fmt: skip

    def wait_tick(least: int) -> dict[str, Any]:
        deadline = time.time() + 60
        while True:
            doc = store.job(job.id).policy
            if doc is not None and doc["tick"] >= least:
                return doc
            assert time.time() < deadline, "the policy never reached that tick"
            time.sleep(0.05)

    first = controller()
    wait_tick(3)
    first.send_signal(signal.SIGKILL)
    first.wait()
    kept = store.job(job.id).policy
    assert kept is not None
    seen = kept["state"]["past"]
    time.sleep(1.2)  # boundaries pass with no controller
    second = controller()
    after = wait_tick(kept["tick"] + 1)
    # the restored policy appended to what it had learned: one more tick, the same history
    assert [p[: len(s)] for p, s in zip(after["state"]["past"], seen, strict=True)] == seen
    assert len(after["state"]["past"][0]) == len(seen[0]) + 1
    store.request_cancel(job.id)  # the job itself would take two minutes
    second.wait(timeout=120)
    assert store.job(job.id).state is JobState.CANCELLED
