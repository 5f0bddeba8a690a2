"""The Azure Scheduled Events emulator: header and version rules, document, acks, 429."""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime

import pytest

from spotwise.emulators import AzureScheduledEventsEmulator

M = {"Metadata": "true"}
EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"


@pytest.fixture()
def emu():  # type: ignore[no-untyped-def]
    with AzureScheduledEventsEmulator(port=0, rate_limit_per_s=0) as emu:
        yield emu


def test_header_and_api_version_required(raw, emu) -> None:  # type: ignore[no-untyped-def]
    status, _, body = raw(emu.url, "GET", EVENTS)
    assert status == 400 and "metadata header" in json.loads(body)["error"]
    status, _, body = raw(emu.url, "GET", "/metadata/scheduledevents", M)
    assert status == 400 and "api-version" in json.loads(body)["error"]
    assert raw(emu.url, "GET", EVENTS, {**M, "X-Forwarded-For": "1.2.3.4"})[0] == 403


def test_document_before_and_after_the_notice(raw, emu) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(raw(emu.url, "GET", EVENTS, M)[2])
    assert doc == {"DocumentIncarnation": 1, "Events": []}
    emu.trigger_notice()
    doc = json.loads(raw(emu.url, "GET", EVENTS, M)[2])
    assert doc["DocumentIncarnation"] == 2
    (event,) = doc["Events"]
    assert event["EventType"] == "Preempt" and event["Resources"] == ["spotwise-vm"]
    assert event["EventStatus"] == "Scheduled" and event["EventSource"] == "Platform"
    assert event["NotBefore"].endswith(" GMT")  # RFC 1123
    ahead = parsedate_to_datetime(event["NotBefore"]).timestamp() - time.time()
    assert 28 < ahead <= 30


def test_start_requests(raw, emu) -> None:  # type: ignore[no-untyped-def]
    emu.trigger_notice()
    event_id = json.loads(raw(emu.url, "GET", EVENTS, M)[2])["Events"][0]["EventId"]
    assert raw(emu.url, "POST", EVENTS, M, b"not json")[0] == 400
    bad = json.dumps({"StartRequests": [{"EventId": "nope"}]}).encode()
    assert raw(emu.url, "POST", EVENTS, M, bad)[0] == 400
    good = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
    assert raw(emu.url, "POST", EVENTS, M, good)[0] == 200
    event = json.loads(raw(emu.url, "GET", EVENTS, M)[2])["Events"][0]
    assert event["EventStatus"] == "Started" and event["NotBefore"] == ""
    assert emu.acknowledged == [event_id]


def test_rate_limit_429_above_5_per_second(raw) -> None:  # type: ignore[no-untyped-def]
    with AzureScheduledEventsEmulator(port=0) as emu:
        codes = [raw(emu.url, "GET", EVENTS, M)[0] for _ in range(8)]
    assert codes[:5] == [200] * 5 and 429 in codes[5:]


def test_instance_name_and_versions(raw, emu) -> None:  # type: ignore[no-untyped-def]
    path = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
    assert raw(emu.url, "GET", path, M)[2] == b"spotwise-vm"
    assert "apiVersions" in json.loads(raw(emu.url, "GET", "/metadata/versions", M)[2])
