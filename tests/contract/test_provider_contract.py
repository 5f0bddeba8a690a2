"""The Provider contract (shipped in :mod:`spotwise.testing`) over every provider that
tests/contract/providers.py builds: what the controller relies on, checked against the real thing
(processes, a SLURM cluster, loopback clouds)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from spotwise.control.providers import PROVIDERS
from spotwise.testing import Backend, Plan, ProviderContract

_spec = importlib.util.spec_from_file_location(
    "provider_contract_backends", Path(__file__).with_name("providers.py")
)
assert _spec is not None and _spec.loader is not None
providers = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = providers
_spec.loader.exec_module(providers)
BACKENDS = providers.BACKENDS


class TestProviders(ProviderContract):
    @pytest.fixture(params=sorted(BACKENDS))
    def make(self, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Plan], Backend]:
        def build(plan: Plan) -> Backend:
            return BACKENDS[request.param](request, tmp_path, plan)

        return build


def test_every_registered_provider_is_in_the_contract_suite() -> None:
    assert set(PROVIDERS.names()) <= set(BACKENDS), "add the new provider to providers.py"
