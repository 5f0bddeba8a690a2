"""The GCP metadata emulator: Metadata-Flavor rule, ETags, wait_for_change."""

from __future__ import annotations

import threading
import time

import pytest

from spotwise.emulators import GcpMetadataEmulator

G = {"Metadata-Flavor": "Google"}
PREEMPTED = "/computeMetadata/v1/instance/preempted"


@pytest.fixture()
def emu():  # type: ignore[no-untyped-def]
    with GcpMetadataEmulator(port=0) as emu:
        yield emu


def test_header_required_and_echoed(raw, emu) -> None:  # type: ignore[no-untyped-def]
    assert raw(emu.url, "GET", PREEMPTED)[0] == 403
    assert raw(emu.url, "GET", PREEMPTED, {**G, "X-Forwarded-For": "1.2.3.4"})[0] == 403
    status, headers, body = raw(emu.url, "GET", PREEMPTED, G)
    assert (status, body) == (200, b"FALSE")
    assert headers["metadata-flavor"] == "Google" and headers["etag"]
    assert raw(emu.url, "GET", "/computeMetadata/v1/instance/nope", G)[0] == 404
    assert emu.host_port == f"127.0.0.1:{emu.port}"


def test_wait_for_change_returns_on_change(raw, emu) -> None:  # type: ignore[no-untyped-def]
    etag = raw(emu.url, "GET", PREEMPTED, G)[1]["etag"]
    got: list[tuple[int, dict[str, str], bytes]] = []
    path = f"{PREEMPTED}?wait_for_change=true&last_etag={etag}&timeout_sec=30"
    thread = threading.Thread(target=lambda: got.append(raw(emu.url, "GET", path, G)))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()
    emu.trigger_notice()
    thread.join(5)
    _status, headers, body = got[0]
    assert body == b"TRUE" and headers["etag"] != etag


def test_wait_for_change_times_out_or_returns_at_once_on_stale_etag(raw, emu) -> None:  # type: ignore[no-untyped-def]
    etag = raw(emu.url, "GET", PREEMPTED, G)[1]["etag"]
    started = time.monotonic()
    _status, headers, body = raw(
        emu.url, "GET", f"{PREEMPTED}?wait_for_change=true&last_etag={etag}&timeout_sec=1", G
    )
    assert 0.9 < time.monotonic() - started < 3 and headers["etag"] == etag and body == b"FALSE"
    started = time.monotonic()
    raw(emu.url, "GET", f"{PREEMPTED}?wait_for_change=true&last_etag=stale&timeout_sec=30", G)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize(
    ("event", "key", "value"),
    [
        ("maintenance-terminate", "maintenance-event", b"TERMINATE_ON_HOST_MAINTENANCE"),
        ("maintenance-migrate", "maintenance-event", b"MIGRATE_ON_HOST_MAINTENANCE"),
    ],
)
def test_maintenance_events(raw, event, key, value) -> None:  # type: ignore[no-untyped-def]
    with GcpMetadataEmulator(port=0, event=event, notice_after=0) as emu:
        time.sleep(0.2)
        assert raw(emu.url, "GET", f"/computeMetadata/v1/instance/{key}", G)[2] == value
