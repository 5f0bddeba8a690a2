"""The Provider contract: what the controller relies on, checked against a real backend.

Subclass :class:`ProviderContract` and define a ``make`` fixture returning a function
``plan -> Backend`` (a fresh provider scripted by ``plan``). ``plan[n - 1] = (exit_code,
run_s)`` is what attempt ``n`` does: run :data:`ATTEMPT_SCRIPT` for ``run_s`` seconds, then exit
with ``exit_code``; on SIGTERM (the notice) it exits 75, as the runtime does after its
emergency save. A real backend runs that as a process; an in-memory fake is scripted with it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotwise.control.providers import (
    PROVIDERS,
    AttemptStatus,
    LaunchRequest,
    NoticeKind,
    Phase,
    Placement,
    Provider,
    make_provider,
)
from spotwise.control.providers.base import MARKETS
from spotwise.errors import ConfigError

Plan = list[tuple[int, float]]

ATTEMPT_SCRIPT = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("saved on notice", flush=True), sys.exit(75)))
print("attempt running", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    time.sleep(0.02)
sys.exit(int(sys.argv[1]))
"""

LONG_S = 120.0  # an attempt that outlives the test unless it is terminated


@dataclass
class Backend:
    """One provider under test, with the scratch folder and job id its attempts use."""

    provider: Provider
    tmp: Path
    plan: Plan
    job_id: str
    options: dict[str, Any]

    @property
    def attempts_dir(self) -> Path:
        return self.tmp / "attempts"

    def request(self, n: int, market: str = "on-demand") -> LaunchRequest:
        code, run_s = self.plan[n - 1]
        # as the controller does: a remote machine gets none of this host's environment
        env = dict(os.environ) if self.provider.features.same_host else {}
        env["SPOTWISE_PLATFORM"] = "none"
        return LaunchRequest(
            job_id=self.job_id,
            n=n,
            argv=(sys.executable, "-c", ATTEMPT_SCRIPT, str(code), str(run_s)),
            # a remote machine has its image's directories, none of this host's
            workdir=self.tmp if self.provider.features.same_host else Path("/"),
            env=env,
            log_path=self.tmp / "job.log",
            attempt_dir=self.attempts_dir / str(n),
            placement=Placement(market, self.provider.features.zones[0]),
            grace_s=5.0,
        )

    def wait(self, handle: dict[str, Any], phases: set[Phase], timeout_s: float = 90.0):
        """Poll the attempt (at the provider's own pace) until it reaches one of ``phases``."""
        deadline = time.time() + timeout_s
        while True:
            status: AttemptStatus = self.provider.status(handle)
            if status.phase in phases:
                return status
            assert time.time() < deadline, f"still {status} after {timeout_s}s"
            time.sleep(self.provider.features.poll_s)


MakeBackend = Callable[[Plan], Backend]
_ENDED = {Phase.EXITED, Phase.LOST}


class ProviderContract:
    """Needs a ``make`` fixture: ``plan -> Backend`` building a fresh provider each call."""

    def test_features_and_prices_are_data(self, make: MakeBackend) -> None:
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
        first_zone = p.prices.of(Placement("on-demand", f.zones[0]))
        assert p.prices.of(Placement("on-demand")) == first_zone

    def test_exit_codes_are_reported_as_they_were(self, make: MakeBackend) -> None:
        b = make([(0, 0.2), (75, 0.2), (3, 0.0)])
        handles = [b.provider.launch(b.request(n)) for n in (1, 2, 3)]
        for n, h in enumerate(handles, 1):
            assert h["n"] == n and json.loads(json.dumps(h)) == h  # stored with the attempt
        assert len({h["id"] for h in handles}) == 3
        ends = [b.wait(h, _ENDED) for h in handles]
        assert [(s.phase, s.exit_code) for s in ends] == [
            (Phase.EXITED, 0),
            (Phase.EXITED, 75),
            (Phase.EXITED, 3),
        ]

    def test_find_lists_the_live_attempts_of_that_job_only(self, make: MakeBackend) -> None:
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
                b.wait(h, _ENDED)

    def test_terminate_gives_notice_and_is_idempotent(self, make: MakeBackend) -> None:
        b = make([(0, LONG_S)])
        handle = b.provider.launch(b.request(1))
        b.wait(handle, {Phase.RUNNING})
        b.provider.terminate(handle)
        b.provider.terminate(handle)
        end = b.wait(handle, _ENDED, timeout_s=60.0)
        # the process saved on the notice (75), or the platform reports the machine taken away
        assert end.phase is Phase.LOST or end.exit_code == 75
        b.provider.terminate(handle)  # after the end: still fine
        assert b.provider.status(handle).phase is end.phase

    def test_a_misspelt_option_is_named_with_a_suggestion(self, make: MakeBackend) -> None:
        b = make([(0, 0.0)])
        cls = PROVIDERS.load(b.provider.name)
        option = sorted(cls.Options.model_fields)[0]
        with pytest.raises(ConfigError) as info:
            make_provider(b.provider.name, {**b.options, option + "x": 1}, epoch=0.0)
        assert f"provider.{b.provider.name}.{option}x" in str(info.value)
        assert f"did you mean {option!r}" in str(info.value)
