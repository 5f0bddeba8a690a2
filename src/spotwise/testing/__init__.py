"""Contract suites for spotwise's four kinds of backend, shipped so a plugin can run them.

A package that registers a provider, storage scheme, notice detector or price source (through the
entry-point groups of :mod:`spotwise.registry`) subclasses the matching suite in its own tests and
supplies one fixture that builds its backend; every ``test_*`` method then runs against it, as it
runs against spotwise's own backends in this repository's tests::

    import pytest
    from spotwise.testing import StorageContract

    class TestMyStore(StorageContract):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(tmp_path)

Each suite's docstring names the fixture it needs. The in-memory fakes that the suites are
known to pass with (``MemoryStorage``, the ``fake`` provider, :class:`ScriptedDetector`,
:class:`StaticPriceSource`) double as the smallest working examples. Importing this package needs
``pytest``; nothing else in spotwise imports it.
"""

from __future__ import annotations

from spotwise.testing.detector import DetectorCase, DetectorContract, ScriptedDetector
from spotwise.testing.price_source import PriceSourceContract, StaticPriceSource
from spotwise.testing.provider import ATTEMPT_SCRIPT, Backend, Plan, ProviderContract
from spotwise.testing.storage import StorageContract

__all__ = [
    "ATTEMPT_SCRIPT",
    "Backend",
    "DetectorCase",
    "DetectorContract",
    "Plan",
    "PriceSourceContract",
    "ProviderContract",
    "ScriptedDetector",
    "StaticPriceSource",
    "StorageContract",
]
