from __future__ import annotations

import pytest

from spotwise.control.decisions import (
    Next,
    Reason,
    after_attempt,
    choose_placement,
    classify,
    live_problem,
    stop_for_budget,
    zone_order,
)
from spotwise.control.providers.base import AttemptStatus, Phase, Placement

ZONES = ("a", "b", "c")


@pytest.mark.parametrize(
    ("status", "stop", "reason"),
    [
        (AttemptStatus(Phase.EXITED, 0), "", Reason.SUCCEEDED),
        (AttemptStatus(Phase.EXITED, 75), "", Reason.PREEMPTED),
        (AttemptStatus(Phase.LOST), "", Reason.LOST),
        (AttemptStatus(Phase.EXITED, 1), "", Reason.ERROR),
        (AttemptStatus(Phase.EXITED, -9), "", Reason.ERROR),
        (AttemptStatus(Phase.EXITED, 75), "cancel", Reason.CANCELLED),
        (AttemptStatus(Phase.EXITED, 75), "budget", Reason.BUDGET),
        (AttemptStatus(Phase.EXITED, 0), "cancel", Reason.SUCCEEDED),  # finished anyway
    ],
)
def test_classify(status, stop, reason):
    assert classify(status, stop) is reason


def test_preemptions_never_use_up_error_restarts():
    for used in range(5):
        for reason in (Reason.PREEMPTED, Reason.LOST):
            d = after_attempt(reason, used, max_restarts=0)
            assert d.next is Next.RECOVER and not d.counts_as_error


def test_errors_are_retried_only_as_configured():
    assert after_attempt(Reason.ERROR, 0, 0).next is Next.FAIL
    assert after_attempt(Reason.ERROR, 0, 2).next is Next.RECOVER
    assert after_attempt(Reason.ERROR, 1, 2).next is Next.RECOVER
    assert after_attempt(Reason.ERROR, 2, 2).next is Next.FAIL
    assert after_attempt(Reason.BUDGET, 0, 5).next is Next.FAIL
    assert after_attempt(Reason.CANCELLED, 0, 5).next is Next.CANCEL


def test_zone_order_puts_the_lost_zone_last_and_skips_blocked():
    assert zone_order(ZONES, {}, "a", now=0) == ["b", "c", "a"]
    assert zone_order(ZONES, {"a": 10.0}, "a", now=5) == ["b", "c"]
    assert zone_order(ZONES, {"a": 10.0}, "a", now=11) == ["b", "c", "a"]
    assert zone_order(ZONES, {"a": 10, "b": 10, "c": 10}, "c", now=1) == []


def test_markets_spot_and_on_demand_are_obeyed():
    assert choose_placement("spot", ZONES, {}, "a", 0) == Placement("spot", "b")
    assert choose_placement("spot", ZONES, {z: 9 for z in ZONES}, "a", 0) is None
    assert choose_placement("on-demand", ZONES, {}, "", 0).market == "on-demand"
    assert choose_placement("auto", ZONES, {}, "", 0, spot_supported=False).market == "on-demand"


def test_auto_without_a_policy_falls_back_to_on_demand_only_when_all_zones_are_out():
    assert choose_placement("auto", ZONES, {}, "", 0) == Placement("spot", "a")
    all_out = {z: 99.0 for z in ZONES}
    assert choose_placement("auto", ZONES, all_out, "", 0).market == "on-demand"


def test_a_switch_we_asked_for_is_neither_a_preemption_nor_an_error():
    for status in (AttemptStatus(Phase.EXITED, 75), AttemptStatus(Phase.LOST)):
        assert classify(status, "switch") is Reason.SWITCHED
    assert classify(AttemptStatus(Phase.EXITED, 0), "switch") is Reason.SUCCEEDED
    assert classify(AttemptStatus(Phase.EXITED, 1), "switch") is Reason.ERROR
    d = after_attempt(Reason.SWITCHED, 0, max_restarts=0)
    assert d.next is Next.RECOVER and not d.counts_as_error


def test_live_problem_is_in_the_markets_time_on_a_coarse_grid():
    # 10 wall minutes of deadline at 250x = 41.67 h of trace time; 0.78 s ticks = 195 s
    problem, gap = live_problem(50, 600, 3.0012, 0.78, 250, 0.9, 3.06)
    assert gap == 195.0
    assert problem.deadline_s == pytest.approx(150_000)
    assert problem.compute_s == pytest.approx(12_500)
    assert problem.changeover_s == 750.0  # whole seconds: 750.3 -> 750


def test_budget_stop_leaves_room_for_the_save():
    assert not stop_for_budget(5.0, 0.1, None, 30)
    assert not stop_for_budget(5.0, 0.1, 10.0, 30)  # 5 + 3 < 10
    assert stop_for_budget(7.5, 0.1, 10.0, 30)  # 7.5 + 3 >= 10


def test_zone_offers_count_this_jobs_preemptions_over_its_spot_hours():
    from spotwise.control.decisions import zone_offers
    from spotwise.control.store import Attempt

    def attempt(n, market, zone, start, running, end, reason):
        return Attempt("j", n, "ended" if end else "running", "sim", market, zone, None, start,
                       running, end, reason, None, 1.0, 3.0, 600.0)  # fmt: skip

    attempts = [
        attempt(1, "spot", "a", 0.0, 1.0, 7.0, "preempted"),  # 6 s x 600 = 1 market hour
        attempt(2, "spot", "b", 7.0, None, 13.0, "lost"),  # never running: from its start
        attempt(3, "on-demand", "a", 13.0, 14.0, 20.0, "switched"),  # not spot: not counted
        attempt(4, "spot", "a", 20.0, 21.0, None, None),  # open: until now, no interruption
        attempt(5, "spot", "elsewhere", 0.0, 0.0, 6.0, "preempted"),  # not offered now
    ]
    got = zone_offers(("a", "b", "c"), (1.0, 2.0, 3.0), (0.1, 0.2, 0.3), attempts, now=27.0)
    assert [(o.zone, o.usd_per_hour, o.prior_rate_per_h) for o in got] == [
        ("a", 1.0, 0.1), ("b", 2.0, 0.2), ("c", 3.0, 0.3)
    ]  # fmt: skip
    assert [(o.interruptions, o.exposure_h) for o in got] == [(1, 2.0), (1, 1.0), (0, 0.0)]


@pytest.mark.parametrize(
    ("reason", "market", "errors_used", "expected"),
    [
        (Reason.SUCCEEDED, "spot", 0, [("SUCCEEDED", {"errors_used": 0})]),
        (Reason.CANCELLED, "spot", 1, [("CANCELLED", {})]),
        (Reason.BUDGET, "spot", 0, [("FAILED", {"errors_used": 0})]),
        # a spot preemption cools its zone down, relaunches at once, costs no restart
        (
            Reason.PREEMPTED,
            "spot",
            1,
            [
                ("PREEMPTED", {"blocked": {"old": 1.0, "a": 130.0}}),
                ("RECOVERING", {"errors_used": 1, "next_launch_at": 100.0, "stop_reason": ""}),
            ],
        ),
        # an on-demand machine lost: no zone is blocked
        (
            Reason.LOST,
            "on-demand",
            0,
            [
                ("PREEMPTED", {"blocked": {"old": 1.0}}),
                ("RECOVERING", {"errors_used": 0, "next_launch_at": 100.0, "stop_reason": ""}),
            ],
        ),
        (
            Reason.SWITCHED,
            "spot",
            0,
            [("RECOVERING", {"errors_used": 0, "next_launch_at": 100.0, "stop_reason": ""})],
        ),
        # the second error waits twice the backoff
        (
            Reason.ERROR,
            "spot",
            1,
            [("RECOVERING", {"errors_used": 2, "next_launch_at": 110.0, "stop_reason": ""})],
        ),
        (Reason.ERROR, "spot", 2, [("FAILED", {"errors_used": 3})]),  # max_restarts 2 used up
    ],
)
def test_what_the_job_does_once_an_attempt_ended(reason, market, errors_used, expected):
    from spotwise.control.decisions import job_after_attempt
    from spotwise.control.store import Attempt, Job, JobState

    attempt = Attempt("j", 1, "ended", "sim", market, "a", None, 0.0, 1.0, 90.0, reason.value,
                      None, 1.0, 3.0, 1.0)  # fmt: skip
    job = Job("j", "j", {}, None, JobState.RUNNING, 0.0, 0.0, False, 0.0, errors_used, "",
              blocked={"old": 1.0})  # fmt: skip
    got = job_after_attempt(
        reason,
        attempt,
        job,
        100.0,
        max_restarts=2,
        zone_cooldown_s=30.0,
        restart_backoff_s=5.0,
    )
    assert [(state.value, fields) for state, _, fields in got] == expected
    assert job.blocked == {"old": 1.0}  # the job's own record is never changed in place
