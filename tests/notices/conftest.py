"""Fixtures for detector tests: real loopback emulators, and a poller for conditions."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from spotwise.emulators import AwsImdsEmulator, AzureScheduledEventsEmulator, GcpMetadataEmulator

T = TypeVar("T")


def _wait_for(fn: Callable[[], T], timeout_s: float = 15.0, every_s: float = 0.02) -> T:
    """Poll ``fn`` until it returns something truthy (generous timeout: CI is shared)."""
    end = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value or time.monotonic() > end:
            return value
        time.sleep(every_s)


@pytest.fixture()
def wait_for() -> Callable[..., object]:
    return _wait_for


@pytest.fixture()
def aws_emulator() -> Iterator[AwsImdsEmulator]:
    emu = AwsImdsEmulator(port=0, hang_s=10.0)
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture()
def gcp_emulator() -> Iterator[GcpMetadataEmulator]:
    emu = GcpMetadataEmulator(port=0, hang_s=10.0)
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture()
def azure_emulator() -> Iterator[AzureScheduledEventsEmulator]:
    emu = AzureScheduledEventsEmulator(port=0, hang_s=10.0, rate_limit_per_s=0)
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture()
def closed_port_url() -> str:
    """A loopback URL where nothing listens (connection refused at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
