"""GCP metadata detector: value meanings, long-polls, faults, over real HTTP."""

from __future__ import annotations

import threading
import time

import pytest

from spotwise.emulators import GcpMetadataEmulator
from spotwise.notices.base import NoticeKind
from spotwise.notices.gcp import MAINTENANCE, PREEMPTED, GcpDetector, interpret, probe


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (PREEMPTED, "FALSE", None),
        (PREEMPTED, "TRUE\n", (NoticeKind.TERMINATE, "preempted")),
        (MAINTENANCE, "NONE", None),
        (
            MAINTENANCE,
            "MIGRATE_ON_HOST_MAINTENANCE",
            (NoticeKind.ADVISORY, "MIGRATE_ON_HOST_MAINTENANCE"),
        ),
        (
            MAINTENANCE,
            "TERMINATE_ON_HOST_MAINTENANCE",
            (NoticeKind.TERMINATE, "TERMINATE_ON_HOST_MAINTENANCE"),
        ),
    ],
)
def test_interpret_recorded_values(key: str, value: str, expected: object) -> None:
    assert interpret(key, value) == expected


@pytest.mark.parametrize(("key", "value"), [(PREEMPTED, "maybe"), (MAINTENANCE, "EXPLODE")])
def test_interpret_rejects_unknown_values(key: str, value: str) -> None:
    with pytest.raises(ValueError, match="unexpected"):
        interpret(key, value)


def test_first_read_is_plain_then_long_polls_with_the_etag(
    gcp_emulator: GcpMetadataEmulator,
) -> None:
    det = GcpDetector(gcp_emulator.url, PREEMPTED, wait_s=20)
    assert det.poll() is None  # plain GET: FALSE
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(det.poll()), daemon=True)
    started = time.monotonic()
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # waiting for a change, not busy-polling
    gcp_emulator.trigger_notice()
    thread.join(timeout=10)
    assert time.monotonic() - started < 5.0  # woke on the change, not at timeout_sec
    notice = done[0]
    assert notice.kind is NoticeKind.TERMINATE and notice.source == "gcp"
    assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(30.0)
    assert gcp_emulator.count("instance/preempted", 200) == 2


def test_long_poll_timeout_returns_unchanged_value(gcp_emulator: GcpMetadataEmulator) -> None:
    det = GcpDetector(gcp_emulator.url, PREEMPTED, wait_s=1)
    det.poll()
    started = time.monotonic()
    assert det.poll() is None
    assert 0.8 < time.monotonic() - started < 5.0


def test_maintenance_migrate_is_advisory_and_clears(gcp_emulator: GcpMetadataEmulator) -> None:
    det = GcpDetector(gcp_emulator.url, MAINTENANCE, wait_s=1)
    assert det.poll() is None
    gcp_emulator.set_value(MAINTENANCE, "MIGRATE_ON_HOST_MAINTENANCE")
    advisory = det.poll()
    assert advisory is not None and advisory.kind is NoticeKind.ADVISORY
    gcp_emulator.set_value(MAINTENANCE, "NONE")
    assert det.poll() is None


def test_maintenance_terminate_deadline(gcp_emulator: GcpMetadataEmulator) -> None:
    det = GcpDetector(gcp_emulator.url, MAINTENANCE, wait_s=1, maintenance_notice_s=3600)
    det.poll()
    gcp_emulator.set_value(MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE")
    notice = det.poll()
    assert notice is not None and notice.is_terminate
    assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(3600.0)


@pytest.mark.parametrize("status", [503, 500, 429])
def test_errors_back_off_then_recover(gcp_emulator: GcpMetadataEmulator, status: int) -> None:
    gcp_emulator.inject(status, count=2)
    gcp_emulator.trigger_notice()
    det = GcpDetector(gcp_emulator.url, PREEMPTED, wait_s=1)
    assert det.poll() is None and det.poll_interval_s == 1.0
    assert det.poll() is None and det.poll_interval_s == 2.0
    notice = det.poll()
    assert notice is not None and notice.is_terminate


def test_unknown_value_is_ignored(gcp_emulator: GcpMetadataEmulator) -> None:
    gcp_emulator.set_value(PREEMPTED, "PERHAPS")
    det = GcpDetector(gcp_emulator.url, PREEMPTED, wait_s=1)
    assert det.poll() is None


def test_hanging_server_costs_one_timeout(gcp_emulator: GcpMetadataEmulator) -> None:
    gcp_emulator.inject("hang")
    det = GcpDetector(gcp_emulator.url, PREEMPTED, timeout_s=0.3)
    started = time.monotonic()
    assert det.poll() is None
    assert time.monotonic() - started < 2.0


def test_probe_needs_the_google_flavor(
    gcp_emulator: GcpMetadataEmulator, closed_port_url: str
) -> None:
    from spotwise.emulators import AwsImdsEmulator

    assert probe(gcp_emulator.url, 0.5) is True
    assert probe(closed_port_url, 0.5) is False
    with AwsImdsEmulator(port=0) as aws:  # a metadata server, but not Google's
        assert probe(aws.url, 0.5) is False
