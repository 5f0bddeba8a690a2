"""The goodput ledger on hand-made event streams with known answers, and its invariants."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotwise.control.store import Attempt
from spotwise.telemetry.ledger import KINDS, goodput


def attempt(
    n: int,
    start: float,
    running: float | None,
    end: float | None,
    *,
    usd: float = 1.0,
    ondemand: float = 3.0,
    market: str = "spot",
    scale: float = 3600.0,
) -> Attempt:
    """time_scale 3600: one wall second bills one hour, so $/h reads as $/s."""
    return Attempt(
        job_id="j",
        n=n,
        state="ended" if end is not None else "running",
        provider="sim",
        market=market,
        zone="z",
        handle=None,
        started_at=start,
        running_at=running,
        ended_at=end,
        reason=None,
        exit_code=None,
        usd_per_hour=usd,
        ondemand_usd_per_hour=ondemand,
        time_scale=scale,
    )


def ev(t: float, kind: str, **fields) -> dict:
    return {"time": t, "kind": kind, **fields}


def test_preempted_then_on_demand_known_answer() -> None:
    attempts = [
        attempt(1, 10, 12, 100),  # spot, killed without a word at 100
        attempt(2, 105, 106, 200, usd=3.0, market="on-demand"),
    ]
    events = [
        ev(15, "start", step=0, restore_s=0.0),
        ev(40, "checkpoint", step=10, write_s=2.0),  # step 10 reached at 38
        ev(70, "checkpoint", step=20, write_s=1.0),  # never committed as far as the next knows
        ev(110, "start", step=10, restore_s=2.0),  # resumes from step 10: 38..100 is lost
        ev(150, "checkpoint", step=30, write_s=1.0),
        ev(190, "finished", step=50),
    ]
    led = goodput(attempts, events, created_at=0.0, end=202.0)
    assert led.seconds == pytest.approx(
        {
            "useful": 23 + 80,
            "lost": 62,
            "restore": 2,
            "changeover": 10 + 5 + 5 + 3,
            "idle": 10 + 2,
        }
    )
    assert led.wall_s == 202
    assert led.usd == pytest.approx(
        {
            "useful": 23 + 80 * 3,
            "lost": 62,
            "restore": 2 * 3,
            "changeover": 5 + 3 * 3,
            "idle": 10 * 3,
        }
    )
    assert led.cost_usd == pytest.approx(90 + 285)
    # the same useful compute on on-demand, plus the first attempt's changeover
    assert led.ondemand_run_usd == pytest.approx((23 + 80) * 3 + 5 * 3)
    assert led.savings_usd == pytest.approx(led.ondemand_run_usd - 375)
    assert [s.attempt for s in led.segments if s.kind == "lost"] == [1]


def test_notice_exit_loses_only_the_tail() -> None:
    attempts = [attempt(1, 0, 0, 52), attempt(2, 53, 53, 80)]
    events = [
        ev(1, "start", step=0, restore_s=0.5),
        ev(20, "checkpoint", step=10, write_s=0.2, reason="interval"),
        ev(50, "checkpoint", step=30, write_s=1.0, reason="notice"),
        ev(50.5, "interrupted", step=30),
        ev(55, "start", step=30, restore_s=1.0),
        ev(79, "finished", step=40),
    ]
    led = goodput(attempts, events, created_at=0.0, end=80.0)
    assert led.seconds["useful"] == pytest.approx(49 - 1 + 79 - 55)
    assert led.seconds["lost"] == pytest.approx(1.5)
    assert led.seconds["restore"] == pytest.approx(0.5 + 1.0)
    assert led.seconds["idle"] == pytest.approx(1.5 + 1.0)  # 50.5..52 and 79..80
    assert led.seconds["changeover"] == pytest.approx(0.5 + 1 + 1)  # 0..0.5, 52..53, 53..54


def test_an_attempt_whose_checkpoints_were_never_used_is_all_lost() -> None:
    attempts = [attempt(1, 0, 1, 30), attempt(2, 30, 31, 50), attempt(3, 50, 51, 90)]
    events = [
        ev(2, "start", step=0),
        ev(20, "checkpoint", step=10, write_s=0.0),
        ev(32, "start", step=10),  # killed before its first save committed
        ev(52, "start", step=10),
        ev(88, "finished", step=60),
    ]
    led = goodput(attempts, events, created_at=0.0, end=90.0)
    lost = {s.attempt: s.seconds for s in led.segments if s.kind == "lost"}
    assert lost == pytest.approx({1: 10.0, 2: 18.0})
    assert led.seconds["useful"] == pytest.approx(18 + 36)


def test_running_job_bills_the_open_attempt_until_now() -> None:
    attempts = [attempt(1, 0, 2, None)]
    led = goodput(attempts, [ev(3, "start", step=0)], created_at=0.0, end=10.0)
    assert led.seconds["useful"] == pytest.approx(7)
    assert led.cost_usd == pytest.approx(attempts[0].cost_usd(10.0))


def test_attempts_that_never_trained() -> None:
    attempts = [attempt(1, 0, None, 4), attempt(2, 5, 6, 9)]  # launch failed; process crashed
    led = goodput(attempts, [], created_at=0.0, end=9.0)
    assert led.seconds["changeover"] == pytest.approx(4 + 1 + 1)
    assert led.seconds["idle"] == pytest.approx(3)
    assert led.runtime_events == 0


def test_clock_skew_is_clamped_into_the_attempt() -> None:
    attempts = [attempt(1, 10, 10, 20)]
    events = [ev(5, "start", step=0, restore_s=3.0), ev(25, "finished", step=9)]
    led = goodput(attempts, events, created_at=10.0, end=20.0)
    assert led.seconds["useful"] == pytest.approx(10)
    assert sum(led.seconds.values()) == pytest.approx(10)


_times = st.floats(0, 1000, allow_nan=False)


@st.composite
def histories(draw):
    n = draw(st.integers(0, 4))
    cuts = sorted(draw(st.lists(_times, min_size=2 * n + 1, max_size=2 * n + 1)))
    attempts, events = [], []
    for i in range(n):
        start, end = cuts[2 * i], cuts[2 * i + 1]
        running = draw(st.one_of(st.none(), st.floats(start, max(start, end))))
        attempts.append(
            attempt(
                i + 1,
                start,
                running,
                end,
                usd=draw(st.floats(0, 5)),
                scale=draw(st.sampled_from([1.0, 250.0])),
            )
        )
        for _ in range(draw(st.integers(0, 4))):
            events.append(
                ev(
                    draw(st.floats(start - 5, end + 5)),
                    draw(st.sampled_from(["start", "checkpoint", "interrupted", "finished"])),
                    step=draw(st.integers(0, 5)),
                    restore_s=draw(st.floats(0, 9)),
                    write_s=draw(st.floats(0, 9)),
                )
            )
    return attempts, events, cuts[0] - 1, cuts[-1] + 1


@settings(max_examples=200, deadline=None)
@given(histories())
def test_the_kinds_always_tile_wall_time_and_cost(history) -> None:
    attempts, events, created, end = history
    led = goodput(attempts, events, created_at=created, end=end)
    assert set(led.seconds) == set(KINDS)
    assert sum(led.seconds.values()) == pytest.approx(end - created)
    assert all(v >= 0 for v in led.seconds.values())
    assert led.cost_usd == pytest.approx(sum(a.cost_usd(end) for a in attempts), abs=1e-6)
    for a, b in itertools.pairwise(led.segments):
        assert a.end == pytest.approx(b.start)


def test_demo_job_ledger_adds_up_to_its_wall_time_and_cost(demo_home) -> None:
    """The README's digits job, shortened, run for real on the simulated spot market."""
    import os

    from spotwise.control.store import Store
    from spotwise.control.summary import job_summary
    from spotwise.telemetry.jobview import job_end, job_view

    home, job_id = demo_home
    os.environ["SPOTWISE_HOME"] = str(home)  # restored by the autouse fixture's monkeypatch
    store = Store(home)
    job = store.job(job_id)
    view = job_view(store, job)
    led = view.ledger
    summary = job_summary(store, job)
    assert summary["preemptions"] >= 1
    assert led.wall_s == pytest.approx(job_end(job, view.attempts, view.now) - job.created_at)
    assert sum(led.seconds.values()) == pytest.approx(led.wall_s)
    assert led.cost_usd == pytest.approx(summary["cost_usd"], abs=1e-5)
    assert sum(led.usd.values()) == pytest.approx(summary["cost_usd"], abs=1e-5)
    # 150 steps of at least 0.1 s each were kept, and changing machines took time
    assert led.seconds["useful"] >= 15.0 and led.seconds["changeover"] > 0
    assert led.runtime_events > 0
    first = view.attempts[0]
    assert first.reason in ("preempted", "lost")
    mine = [s for s in led.segments if s.attempt == first.n]
    assert sum(s.seconds for s in mine) == pytest.approx(first.ended_at - first.started_at)
    trained = any(
        e["kind"] == "start" and first.started_at <= e["time"] <= first.ended_at
        for e in view.runtime_events
    )
    if trained:  # under heavy load the first machine can go before the interpreter is up
        assert {"useful", "lost"} & {s.kind for s in mine}
    assert 0 < led.cost_usd < led.ondemand_run_usd  # spot was cheaper than on-demand only
