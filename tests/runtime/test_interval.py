"""The checkpoint-interval decision (pure)."""

from __future__ import annotations

import math

import pytest

from spotwise.errors import ConfigError
from spotwise.runtime.interval import (
    MIN_AUTO_INTERVAL_S,
    Schedule,
    auto_interval_s,
    parse_every,
    save_due,
    young_daly_interval_s,
)


@pytest.mark.parametrize(
    ("every", "schedule"),
    [
        (500, Schedule(steps=500)),
        ("90s", Schedule(seconds=90.0)),
        ("10m", Schedule(seconds=600.0)),
        ("1.5h", Schedule(seconds=5400.0)),
        ("auto", Schedule(auto=True)),
        (None, Schedule()),
    ],
)
def test_parse_every(every: object, schedule: Schedule) -> None:
    assert parse_every(every) == schedule  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -3, "soon", "10 parsecs", "0s", True, 2.5])
def test_parse_every_rejects(bad: object) -> None:
    with pytest.raises(ConfigError):
        parse_every(bad)  # type: ignore[arg-type]


def test_young_daly() -> None:
    # first-order Young term dominates for small C/M
    t = young_daly_interval_s(10.0, 3600.0)
    assert math.sqrt(2 * 10 * 3600) * 0.95 < t < math.sqrt(2 * 10 * 3600) * 1.05
    # Daly's exact expression
    c, m = 60.0, 3600.0
    r = c / (2 * m)
    assert t == pytest.approx(young_daly_interval_s(10.0, 3600.0))
    expected = math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c
    assert young_daly_interval_s(c, m) == pytest.approx(expected)
    assert young_daly_interval_s(8000.0, 3600.0) == 3600.0  # C >= 2M: save every M
    assert young_daly_interval_s(0.0, 3600.0) == 0.0
    # a 4x costlier save waits about 2x longer
    ratio = young_daly_interval_s(4.0, 3600.0) / young_daly_interval_s(1.0, 3600.0)
    assert ratio == pytest.approx(2.0, rel=0.05)


def test_auto_interval_floors() -> None:
    assert auto_interval_s(1e-6, 0.0, 3600.0) == MIN_AUTO_INTERVAL_S
    assert auto_interval_s(0.01, 50.0, 3600.0) == 50.0  # never shorter than one write


def due(schedule: Schedule, **kw: float) -> bool:
    args: dict[str, float | None] = {
        "step": 10, "steps_since_save": 10, "seconds_since_save": 0.0,
        "save_cost_s": 0.1, "write_s": 0.5, "mtbi_s": 3600.0,
    }  # fmt: skip
    args.update(kw)
    return save_due(schedule, **args)  # type: ignore[arg-type]


def test_save_due_table() -> None:
    assert due(Schedule(steps=5), step=10)
    assert not due(Schedule(steps=5), step=11)
    assert not due(Schedule(steps=5), step=10, steps_since_save=0)  # just saved
    assert due(Schedule(seconds=60), seconds_since_save=61)
    assert not due(Schedule(seconds=60), seconds_since_save=59)
    assert not due(Schedule(), seconds_since_save=1e9)
    # auto: first boundary measures the cost; then Young/Daly (0.1 s, 1 h -> ~27 s)
    assert due(Schedule(auto=True), save_cost_s=None, steps_since_save=1)
    assert not due(Schedule(auto=True), seconds_since_save=20.0)
    assert due(Schedule(auto=True), seconds_since_save=30.0)


@pytest.mark.parametrize(
    ("remaining_s", "step_s", "save_s", "margin_s", "expected"),
    [
        (None, 0.1, 1.0, 30.0, True),  # no deadline: act at once
        (3600.0, None, 1.0, 30.0, True),  # nothing measured yet: act at once
        (3600.0, 0.1, None, 30.0, True),
        (3600.0, 0.1, 1.0, 30.0, False),  # GCP GPU maintenance: train on
        (120.0, 0.1, 1.0, 30.0, False),  # AWS two minutes, a cheap save: train on
        (32.2, 0.1, 1.0, 30.0, True),  # inside margin + two steps + two saves
        (32.3, 0.1, 1.0, 30.0, False),
        (100.0, 0.5, 40.0, 30.0, True),  # a slow save eats the notice
        (3600.0, 0.1, 1.0, math.inf, True),  # the default margin: act at once
    ],
)
def test_notice_exit_due(remaining_s, step_s, save_s, margin_s, expected):
    from spotwise.runtime.interval import DEFAULT_NOTICE_MARGIN_S, notice_exit_due

    assert math.isinf(DEFAULT_NOTICE_MARGIN_S)
    assert notice_exit_due(remaining_s, step_s=step_s, save_s=save_s, margin_s=margin_s) is expected


def test_notice_exit_due_counts_the_steps_between_checks():
    from spotwise.runtime.interval import notice_exit_due

    # two checks 40 steps of 0.1 s apart and two 1 s saves: 30 + 2 * (4 + 1) = 40 s
    assert notice_exit_due(40.0, step_s=0.1, save_s=1.0, margin_s=30.0, steps_per_check=40)
    assert not notice_exit_due(40.1, step_s=0.1, save_s=1.0, margin_s=30.0, steps_per_check=40)


@pytest.mark.parametrize(
    ("cost_s", "step_s", "expected"),
    [
        (0.0005, 0.0025, 20),  # 0.5 ms against 2.5 ms steps: 1% of 20 steps
        (0.0005, 0.1, 1),  # a long step hides it
        (0.001, 0.001, 100),
        (0.01, 0.001, 500),  # 1% would need 1 s of steps: the 0.5 s gap caps it first
        (0.05, 1.0, 1),  # steps longer than the gap: every boundary
        (0.0005, 0.0, 1),  # nothing measured yet
    ],
)
def test_agreement_interval(cost_s, step_s, expected):
    from spotwise.runtime.interval import agreement_interval

    assert agreement_interval(cost_s, step_s) == expected
