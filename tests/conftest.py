"""Test-wide settings: never probe real cloud metadata; keep state in temp dirs."""

from __future__ import annotations

import os

# Platform auto-detection probes the link-local metadata address; it must never run in tests.
os.environ["SPOTWISE_PLATFORM"] = "none"
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _spotwise_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test gets its own SPOTWISE_HOME so jobs and databases never leak between tests."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path_factory.mktemp("spotwise-home")))
    monkeypatch.setenv("SPOTWISE_PLATFORM", "none")
