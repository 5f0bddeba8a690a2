"""Deadline-aware spot/on-demand policies, by name (one file each; see docs/policies.md)."""

from __future__ import annotations

from spotwise.market.policies.base import (
    BasePolicy,
    Decision,
    Market,
    Observation,
    Policy,
    Problem,
)
from spotwise.registry import Registry

POLICIES: Registry[type[Policy]] = Registry(
    "policy",
    {
        "on-demand": "spotwise.market.policies.on_demand:OnDemandPolicy",
        "greedy": "spotwise.market.policies.greedy:GreedyPolicy",
        "uniform-progress": "spotwise.market.policies.uniform_progress:UniformProgressPolicy",
        "optimal": "spotwise.market.policies.optimal:OptimalPolicy",
        "spotwise": "spotwise.market.policies.spotwise:SpotwisePolicy",
    },
    group="spotwise.policies",
)


def make_policy(name: str) -> Policy:
    """A fresh policy object by registry name (``spotwise simulate --policy NAME``)."""
    policy: Policy = POLICIES.load(name)()
    return policy


__all__ = [
    "POLICIES",
    "BasePolicy",
    "Decision",
    "Market",
    "Observation",
    "Policy",
    "Problem",
    "make_policy",
]
