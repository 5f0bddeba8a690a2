"""The Storage contract (shipped in :mod:`spotwise.testing`) over every backend in
backends.BACKENDS, and every registered storage scheme is among them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from spotwise.storage import STORAGE
from spotwise.storage.base import Storage
from spotwise.testing import StorageContract

_spec = importlib.util.spec_from_file_location(
    "storage_contract_backends", Path(__file__).with_name("backends.py")
)
assert _spec is not None and _spec.loader is not None
backends = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(backends)


class TestStorage(StorageContract):
    @pytest.fixture(params=sorted(backends.BACKENDS))
    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
        return backends.BACKENDS[request.param](request, tmp_path)


def test_every_registered_scheme_runs_the_contract() -> None:
    assert set(STORAGE.names()) <= set(backends.BACKENDS), "add the new scheme to backends.py"
