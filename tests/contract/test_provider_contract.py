"""One contract for every provider (tests/contract/providers.py lists them): what the controller
relies on, checked against the real thing (processes, a SLURM cluster, loopback clouds)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from spotwise.control.providers import (
    PROVIDERS,
    AttemptStatus,
    NoticeKind,
    Phase,
    Placement,
    Provider,
    make_provider,
)
from spotwise.control.providers.base import MARKETS
from spotwise.errors import ConfigError

_spec = importlib.util.spec_from_file_location(
    "provider_contract_backends", Path(__file__).with_name("providers.py")
)
assert _spec is not None and _spec.loader is not None
providers = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = providers  # its dataclass looks itself up there
_spec.loader.exec_module(providers)
BACKENDS, Backend, Plan = providers.BACKENDS, providers.Backend, providers.Plan

LONG_S = 120.0


@pytest.fixture(params=sorted(BACKENDS))
def make(request, tmp_path):
    def build(plan: Plan) -> Backend:
        return BACKENDS[request.param](request, tmp_path, plan)

    return build


def _wait(backend: Backend, handle, phases: set[Phase], timeout_s: float = 90.0) -> AttemptStatus:
    deadline = time.time() + timeout_s
    while True:
        status = backend.provider.status(handle)
        if status.phase in phases:
            return status
        assert time.time() < deadline, f"still {status} after {timeout_s}s"
        time.sleep(backend.provider.features.poll_s)


def test_every_registered_provider_is_in_the_contract_suite():
    assert set(PROVIDERS.names()) <= set(BACKENDS), "add the new provider to providers.py"


def test_features_and_prices_are_data(make):
    p = make([(0, 0.0)]).provider
    assert isinstance(p, Provider)
    f = p.features
    assert f.zones and f.poll_s > 0 and f.grace_s >= 0 and isinstance(f.notice, NoticeKind)
    for zone in f.zones:
        for market in MARKETS:
            price = p.prices.of(Placement(market, zone))
            assert price.usd_per_hour >= 0 and price.time_scale > 0
            if not f.spot:  # without a spot market, "spot" costs what on-demand does
                assert price.usd_per_hour == price.ondemand_usd_per_hour
    assert p.prices.of(Placement("on-demand")) == p.prices.of(Placement("on-demand", f.zones[0]))


def test_exit_codes_are_reported_as_they_were(make):
    b = make([(0, 0.2), (75, 0.2), (3, 0.0)])
    handles = [b.provider.launch(b.request(n)) for n in (1, 2, 3)]
    for n, h in enumerate(handles, 1):
        assert h["n"] == n and json.loads(json.dumps(h)) == h  # stored with the attempt
    assert len({h["id"] for h in handles}) == 3
    ends = [_wait(b, h, {Phase.EXITED, Phase.LOST}) for h in handles]
    assert [(s.phase, s.exit_code) for s in ends] == [
        (Phase.EXITED, 0),
        (Phase.EXITED, 75),
        (Phase.EXITED, 3),
    ]


def test_find_lists_the_live_attempts_of_that_job_only(make):
    b = make([(0, LONG_S), (0, LONG_S)])
    assert b.provider.find(b.job_id, b.attempts_dir) == []
    handles = [b.provider.launch(b.request(n)) for n in (1, 2)]
    try:
        found = b.provider.find(b.job_id, b.attempts_dir)
        assert sorted((h["n"], str(h["id"])) for h in found) == sorted(
            (h["n"], str(h["id"])) for h in handles
        )
        assert b.provider.find("other" + b.job_id, b.tmp / "elsewhere") == []
    finally:
        for h in handles:
            b.provider.terminate(h)
        for h in handles:
            _wait(b, h, {Phase.EXITED, Phase.LOST})


def test_terminate_gives_notice_and_is_idempotent(make):
    b = make([(0, LONG_S)])
    handle = b.provider.launch(b.request(1))
    _wait(b, handle, {Phase.RUNNING})
    b.provider.terminate(handle)
    b.provider.terminate(handle)
    end = _wait(b, handle, {Phase.EXITED, Phase.LOST}, timeout_s=60.0)
    # the process saved on the notice (75), or the platform reports the machine taken away
    assert end.phase is Phase.LOST or end.exit_code == 75
    b.provider.terminate(handle)  # after the end: still fine
    assert b.provider.status(handle).phase is end.phase


def test_a_misspelt_option_is_named_with_a_suggestion(make):
    b = make([(0, 0.0)])
    cls = PROVIDERS.load(b.provider.name)
    option = sorted(cls.Options.model_fields)[0]
    with pytest.raises(ConfigError) as info:
        make_provider(b.provider.name, {**b.options, option + "x": 1}, epoch=0.0)
    assert f"provider.{b.provider.name}.{option}x" in str(info.value)
    assert f"did you mean {option!r}" in str(info.value)
