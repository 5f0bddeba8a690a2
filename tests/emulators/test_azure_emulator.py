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
    triggered = time.time()
    emu.trigger_notice()
    doc = json.loads(raw(emu.url, "GET", EVENTS, M)[2])
    answered = time.time()
    assert doc["DocumentIncarnation"] == 2
    (event,) = doc["Events"]
    assert event["EventType"] == "Preempt" and event["Resources"] == ["spotwise-vm"]
    assert event["EventStatus"] == "Scheduled" and event["EventSource"] == "Platform"
    assert event["NotBefore"].endswith(" GMT")  # RFC 1123
    # 30 s after the notice (whole seconds in RFC 1123): bounded by the calls around it, not by
    # a reading of the clock afterwards that a stalled machine would push late
    not_before = parsedate_to_datetime(event["NotBefore"]).timestamp()
    assert int(triggered) + 30 <= not_before <= answered + 30


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


def test_instance_document_says_where_the_vm_runs(raw) -> None:  # type: ignore[no-untyped-def]
    with AzureScheduledEventsEmulator(port=0, rate_limit_per_s=0, location="westeurope",
                                      vm_size="Standard_ND96asr_v4", zone="2") as emu:  # fmt: skip
        url = "/metadata/instance?api-version=2021-02-01"
        assert raw(emu.url, "GET", url)[0] == 400  # no Metadata: true header
        assert raw(emu.url, "GET", "/metadata/instance", M)[0] == 400  # no api-version
        status, headers, body = raw(emu.url, "GET", url, M)
        assert status == 200 and headers["content-type"].startswith("application/json")
        compute = json.loads(body)["compute"]
        assert (compute["location"], compute["vmSize"], compute["zone"]) == (
            "westeurope",
            "Standard_ND96asr_v4",
            "2",
        )
        assert compute["priority"] == "Spot" and compute["name"] == "spotwise-vm"
        assert len(compute["vmId"]) == 36
        assert (
            json.loads(body)["network"]["interface"][0]["ipv4"]["ipAddress"][0]["privateIpAddress"]
            == "10.0.0.4"
        )
        sub = raw(emu.url, "GET", "/metadata/instance/compute?api-version=2021-02-01", M)
        assert json.loads(sub[2]) == compute
        leaf = "/metadata/instance/compute/vmSize?api-version=2021-02-01"
        assert raw(emu.url, "GET", leaf + "&format=text", M)[2] == b"Standard_ND96asr_v4"
        status, _, body = raw(emu.url, "GET", leaf, M)  # leaves need format=text
        assert status == 400 and "format=text" in json.loads(body)["error"]
        deep = "/metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress"
        assert raw(emu.url, "GET", deep + "?api-version=2021-02-01&format=text", M)[2] == (
            b"10.0.0.4"
        )
        for missing in ("compute/nope", "network/interface/3"):
            path = f"/metadata/instance/{missing}?api-version=2021-02-01&format=text"
            assert raw(emu.url, "GET", path, M)[0] == 404
