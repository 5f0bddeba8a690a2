"""Azure Scheduled Events detector: document parsing, VM filter, ack, faults, over HTTP."""

from __future__ import annotations

import time

import pytest

from spotwise.emulators import AzureScheduledEventsEmulator
from spotwise.notices.azure import AzureDetector, parse_document, parse_not_before, probe
from spotwise.notices.base import NoticeKind

# The example document from Microsoft's Scheduled Events page.
RECORDED = b"""{
    "DocumentIncarnation": 1,
    "Events": [
        {
            "EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
            "EventStatus": "Scheduled",
            "EventType": "Freeze",
            "ResourceType": "VirtualMachine",
            "Resources": ["WestNO_0", "WestNO_1"],
            "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
            "Description": "Virtual machine is being paused for a Live Migration.",
            "EventSource": "Platform",
            "DurationInSeconds": 5
        }
    ]
}"""


def test_parse_recorded_document() -> None:
    incarnation, events = parse_document(RECORDED)
    assert incarnation == 1
    (event,) = events
    assert event.event_id == "A123BC45-1234-5678-AB90-ABCDEF123456"
    assert event.event_type == "Freeze" and event.status == "Scheduled"
    assert event.resources == ("WestNO_0", "WestNO_1")
    assert event.not_before == 1649716018.0


def test_not_before_is_rfc1123_and_empty_once_started() -> None:
    assert parse_not_before("Mon, 19 Sep 2016 18:29:47 GMT") == 1474309787.0
    assert parse_not_before("") is None


@pytest.mark.parametrize(
    "body", [b"", b"{", b"[]", b'{"Events": 3}', b'{"Events": [{"EventType": "Preempt"}]}']
)
def test_parse_rejects_malformed(body: bytes) -> None:
    with pytest.raises((ValueError, TypeError)):
        parse_document(body)


def detector(emu: AzureScheduledEventsEmulator, **kw: object) -> AzureDetector:
    return AzureDetector(emu.url, poll_interval_s=0.05, first_timeout_s=2.0, **kw)  # type: ignore[arg-type]


def test_preempt_for_this_vm(azure_emulator: AzureScheduledEventsEmulator) -> None:
    det = detector(azure_emulator)
    assert det.poll() is None
    assert det.vm_name == "spotwise-vm"  # learned from the instance metadata
    azure_emulator.trigger_notice()
    notice = det.poll()
    assert notice is not None and notice.kind is NoticeKind.TERMINATE
    assert notice.action == "Preempt" and notice.source == "azure"
    assert 28.0 < notice.deadline_monotonic - notice.received_monotonic <= 30.0
    assert det.poll() is notice  # deadline fixed at first sight


def test_acknowledge_starts_the_event(azure_emulator: AzureScheduledEventsEmulator) -> None:
    det = detector(azure_emulator)
    azure_emulator.trigger_notice()
    notice = det.poll()
    det.acknowledge(notice)
    assert azure_emulator.acknowledged == [notice.detail["event_id"]]
    assert azure_emulator.events[0]["EventStatus"] == "Started"
    assert det.poll() is notice


def test_event_for_another_vm_is_ignored(
    azure_emulator: AzureScheduledEventsEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="spotwise.notices")
    azure_emulator.resources = ["someone-else"]
    azure_emulator.trigger_notice()
    det = detector(azure_emulator)
    assert det.poll() is None
    assert det.poll() is None
    assert caplog.text.count("not this VM") == 1


def test_started_or_past_event_is_due_now(azure_emulator: AzureScheduledEventsEmulator) -> None:
    azure_emulator.lead_s = -60.0
    azure_emulator.trigger_notice()
    notice = detector(azure_emulator).poll()
    assert notice is not None
    assert notice.deadline_monotonic == pytest.approx(notice.received_monotonic)


def test_clock_skew_is_clamped_to_the_preempt_notice(
    azure_emulator: AzureScheduledEventsEmulator,
) -> None:
    azure_emulator.clock_skew_s = 600.0
    azure_emulator.trigger_notice()
    notice = detector(azure_emulator).poll()
    assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(30.0)


def test_freeze_is_advisory(azure_emulator: AzureScheduledEventsEmulator) -> None:
    azure_emulator.event_type = "Freeze"
    azure_emulator.trigger_notice()
    notice = detector(azure_emulator).poll()
    assert notice is not None and notice.kind is NoticeKind.ADVISORY
    assert notice.deadline_monotonic is None


@pytest.mark.parametrize("fault", [429, 500, 503, 400, "malformed", "close"])
def test_faults_back_off_and_recover(
    azure_emulator: AzureScheduledEventsEmulator, fault: object
) -> None:
    det = detector(azure_emulator, vm_name="spotwise-vm")
    azure_emulator.inject(fault, count=2, on="scheduledevents")
    azure_emulator.trigger_notice()
    assert det.poll() is None
    assert det.poll() is None
    assert det.poll_interval_s > 0.05
    notice = det.poll()
    assert notice is not None and notice.is_terminate
    assert det.poll_interval_s == pytest.approx(0.05)


def test_real_rate_limit_gets_429_and_backoff() -> None:
    with AzureScheduledEventsEmulator(port=0, rate_limit_per_s=5) as emu:
        det = detector(emu, vm_name="spotwise-vm")
        for _ in range(7):
            det.poll()
        assert emu.count("scheduledevents", 429) >= 1
        assert det.poll_interval_s > 0.05


def test_hanging_server_is_bounded(azure_emulator: AzureScheduledEventsEmulator) -> None:
    azure_emulator.inject("hang")
    det = AzureDetector(azure_emulator.url, timeout_s=0.3, first_timeout_s=0.3, vm_name="x")
    started = time.monotonic()
    assert det.poll() is None
    assert time.monotonic() - started < 2.0


def test_probe(azure_emulator: AzureScheduledEventsEmulator, closed_port_url: str) -> None:
    assert probe(azure_emulator.url, 0.5) is True
    assert probe(closed_port_url, 0.5) is False
