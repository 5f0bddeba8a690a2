from __future__ import annotations

import pytest

from spotwise.control.decisions import (
    Next,
    Progress,
    Reason,
    after_attempt,
    choose_placement,
    classify,
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


def _progress(elapsed, done, deadline=600.0, runtime=60.0):
    return Progress(elapsed, done, deadline, runtime, changeover_s=5.0)


def test_markets_spot_and_on_demand_are_obeyed():
    p = _progress(0, 0)
    assert choose_placement("spot", "greedy", ZONES, {}, "a", 0, p, 1, 3) == Placement("spot", "b")
    assert choose_placement("spot", "greedy", ZONES, {z: 9 for z in ZONES}, "a", 0, p, 1, 3) \
        is None
    assert choose_placement("on-demand", "greedy", ZONES, {}, "", 0, p, 1, 3).market == "on-demand"
    assert choose_placement("auto", "greedy", ZONES, {}, "", 0, p, 1, 3,
                            spot_supported=False).market == "on-demand"


@pytest.mark.parametrize("policy", ["greedy", "uniform-progress"])
def test_auto_asks_the_policy(policy):
    # plenty of slack: spot in a zone other than the one just lost
    assert choose_placement("auto", policy, ZONES, {"a": 99}, "a", 10, _progress(10, 5), 1, 3) \
        == Placement("spot", "b")
    # slack nearly gone (R - C < 2d): the Safety Net puts the job on on-demand
    late = _progress(elapsed=560, done=28)
    assert choose_placement("auto", policy, ZONES, {}, "a", 560, late, 1, 3).market == "on-demand"


def test_auto_without_deadline_falls_back_to_on_demand_only_when_all_zones_are_out():
    p = Progress(0, 0, None, None, 5.0)
    assert choose_placement("auto", "greedy", ZONES, {}, "", 0, p, 1, 3).market == "spot"
    all_out = {z: 99.0 for z in ZONES}
    assert choose_placement("auto", "greedy", ZONES, all_out, "", 0, p, 1, 3).market == "on-demand"


def test_budget_stop_leaves_room_for_the_save():
    assert not stop_for_budget(5.0, 0.1, None, 30)
    assert not stop_for_budget(5.0, 0.1, 10.0, 30)  # 5 + 3 < 10
    assert stop_for_budget(7.5, 0.1, 10.0, 30)  # 7.5 + 3 >= 10
