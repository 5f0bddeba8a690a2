"""The deadline merge and wall-to-monotonic conversion (pure functions)."""

from __future__ import annotations

import pytest

from spotwise.notices.base import (
    Notice,
    NoticeKind,
    deadline_from_wall,
    effective_deadline,
    most_urgent,
)


def notice(kind: NoticeKind, received: float, deadline: float | None, source: str = "x") -> Notice:
    return Notice(source, kind, received, deadline)


T, A = NoticeKind.TERMINATE, NoticeKind.ADVISORY


def test_nothing_pending() -> None:
    assert most_urgent([]) is None
    assert most_urgent([None, None]) is None
    assert effective_deadline([None]) is None


def test_minimum_over_terminate_notices() -> None:
    late = notice(T, 1.0, 130.0, "aws")
    early = notice(T, 5.0, 35.0, "signal")
    assert most_urgent([late, early]) is early
    assert most_urgent([early, late]) is early
    assert effective_deadline([late, None, early]) == 35.0


def test_advisory_never_sets_a_deadline_or_beats_a_terminate() -> None:
    rebalance = notice(A, 0.0, None, "aws")
    sigterm = notice(T, 9.0, 39.0, "signal")
    assert most_urgent([rebalance, sigterm]) is sigterm
    assert most_urgent([rebalance]) is rebalance
    assert effective_deadline([rebalance]) is None


def test_first_received_advisory_wins() -> None:
    first, second = notice(A, 1.0, None, "aws"), notice(A, 2.0, None, "gcp")
    assert most_urgent([second, first]) is first


def test_terminate_without_deadline_counts_as_due_now() -> None:
    unknown = notice(T, 10.0, None)
    later = notice(T, 5.0, 40.0)
    assert most_urgent([later, unknown]) is unknown
    assert effective_deadline([later, unknown]) == 10.0


@pytest.mark.parametrize(
    ("wall_deadline", "expected"),
    [
        (1100.0, 600.0),  # 100 s ahead: kept
        (900.0, 500.0),  # in the past: now
        (5000.0, 620.0),  # skewed far ahead: clamped to the nominal notice
        (1000.0, 500.0),  # exactly now
    ],
)
def test_deadline_from_wall(wall_deadline: float, expected: float) -> None:
    got = deadline_from_wall(wall_deadline, wall_now=1000.0, mono_now=500.0, nominal_s=120.0)
    assert got == pytest.approx(expected)
