"""The ranks' agreement of a distributed Run, in this process (one real gloo rank): it agrees
only every few step boundaries, chosen from its cost and the measured step time, and hands
each proposal back one agreement later."""

from __future__ import annotations

import itertools

import pytest

from spotwise.runtime import distributed
from spotwise.runtime.interval import AGREEMENT_SHARE, MAX_AGREEMENT_GAP_S


@pytest.fixture
def ranks(one_rank: None) -> distributed.Ranks:
    found = distributed.current()
    assert found is not None
    return found


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_agreements_come_every_interval_and_return_the_previous_proposal(
    ranks: distributed.Ranks,
) -> None:
    clock = Clock()
    step_s, cost_s = 0.002, 0.0004  # 100 steps are needed for the cost to be 1% of them
    agreement = distributed.Agreement(ranks, cost_s, clock=clock)
    agreed_at: dict[int, list[int]] = {}
    for boundary in range(1, 400):
        clock.now += step_s
        result = agreement.boundary(lambda b=boundary: [b, 7])
        if result is not None:
            agreed_at[boundary] = result
    agreement.drain()
    boundaries = sorted(agreed_at)
    assert boundaries[:2] == [1, 2]  # nothing measured at the first: the next boundary agrees
    every = round(cost_s / (AGREEMENT_SHARE * step_s))
    assert every == 20 and agreement.every == every
    assert all(b - a == every for a, b in itertools.pairwise(boundaries[2:]))
    assert agreed_at[1] == [0, 0]
    for before, at in itertools.pairwise(boundaries):
        assert agreed_at[at] == [before, 7]  # each proposal comes back one agreement later


def test_a_slow_step_agrees_at_every_boundary(ranks: distributed.Ranks) -> None:
    clock = Clock()
    agreement = distributed.Agreement(ranks, 0.05, clock=clock)  # a slow link: 50 ms
    results = []
    for _ in range(10):
        clock.now += MAX_AGREEMENT_GAP_S  # a step as long as the longest gap allowed
        results.append(agreement.boundary(lambda: [1]))
    agreement.drain()
    assert None not in results and agreement.every == 1
