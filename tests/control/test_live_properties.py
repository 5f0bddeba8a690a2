"""Properties of the live loop (hypothesis) on random traces and starts, driven fast by an
injected clock on the process-free sim double: a feasible deadline is never missed, and a
policy that needs no history before the run makes the simulator's placements at its cost."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotwise.control.store import JobState, Store
from spotwise.control.summary import job_summary

from .clocksim import Clock, ClockSim, job_for
from .test_live_policy import _run, _segments, _simulated


@st.composite
def live_jobs(draw):
    zones = draw(st.integers(1, 2))
    work = draw(st.sampled_from([2.0, 3.5, 5.0, 8.0]))
    changeover = draw(st.sampled_from([0.0, 0.25, 0.5, 1.5]))
    deadline = (work + changeover) * draw(st.sampled_from([1.0, 1.2, 1.5, 2.5]))
    start = draw(st.integers(0, 6))
    flip = draw(st.sampled_from([0.1, 0.3, 0.6]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    n = start + int(deadline) + 4
    avail = (np.cumsum(rng.random((zones, n)) < flip, axis=1) + rng.integers(0, 2, (zones, 1))) % 2
    policy = draw(st.sampled_from(["greedy", "uniform-progress", "spotwise"]))
    sim = ClockSim(
        Clock(),
        tuple("ab"[:zones]),
        avail.astype(bool),
        gap_s=600.0,
        compression=600.0,
        work_s=work,
        changeover_s=changeover,
        start_tick=start,
    )
    return sim, policy, deadline


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(live_jobs())
def test_live_loop_never_misses_a_feasible_deadline_and_matches_the_simulator(case):
    sim, policy, deadline = case
    store = Store()
    job, _ = job_for(sim, store, policy=policy, deadline=deadline)
    assert _run(sim, store, job.id) is JobState.SUCCEEDED
    summary = job_summary(store, store.job(job.id), now=sim.clock())
    finish = summary["attempts"][-1]["end"] - job.created_at
    assert finish <= deadline + 1e-6  # C + d <= R by construction: on-demand alone makes it
    if policy == "spotwise" and sim.start_tick > 0:
        return  # the simulator shows it the trace before the start; a live job has none
    expected = _simulated(sim, policy, deadline)
    live = [
        (a["market"], "ab".index(a["zone"]) if a["market"] == "spot" else None)
        for a in summary["attempts"]
    ]
    assert live == _segments(expected.timeline)
    assert summary["cost_usd"] == pytest.approx(expected.cost_usd, rel=1e-6, abs=1e-9)
