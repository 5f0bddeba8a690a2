"""The AWS IMDS emulator speaks IMDS: token rules, 401/403/400, 404 before the notice."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from spotwise.emulators import AwsImdsEmulator

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
ACTION = "/latest/meta-data/spot/instance-action"


@pytest.fixture()
def emu():  # type: ignore[no-untyped-def]
    with AwsImdsEmulator(port=0) as emu:
        yield emu


def token(raw, emu, ttl: str = "21600") -> str:  # type: ignore[no-untyped-def]
    status, headers, body = raw(emu.url, "PUT", "/latest/api/token", {TTL: ttl})
    assert status == 200 and headers[TTL.lower()] == ttl
    return body.decode()


@pytest.mark.parametrize("ttl", [None, "0", "21601", "abc", "-5"])
def test_token_ttl_must_be_1_to_21600(raw, emu, ttl) -> None:  # type: ignore[no-untyped-def]
    headers = {} if ttl is None else {TTL: ttl}
    assert raw(emu.url, "PUT", "/latest/api/token", headers)[0] == 400


def test_token_put_refuses_forwarded_and_versioned_paths(raw, emu) -> None:  # type: ignore[no-untyped-def]
    assert (
        raw(emu.url, "PUT", "/latest/api/token", {TTL: "60", "X-Forwarded-For": "1.2.3.4"})[0]
        == 403
    )
    assert raw(emu.url, "PUT", "/2021-03-23/api/token", {TTL: "60"})[0] == 403


def test_invalid_or_expired_token_is_401(raw, emu) -> None:  # type: ignore[no-untyped-def]
    assert raw(emu.url, "GET", ACTION, {"X-aws-ec2-metadata-token": "bogus"})[0] == 401
    tok = token(raw, emu, "1")
    assert (
        raw(emu.url, "GET", "/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": tok})[0]
        == 200
    )
    time.sleep(1.1)
    assert (
        raw(emu.url, "GET", "/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": tok})[0]
        == 401
    )


def test_imdsv1_allowed_unless_tokens_required(raw, emu) -> None:  # type: ignore[no-untyped-def]
    assert raw(emu.url, "GET", "/latest/meta-data/instance-life-cycle")[2] == b"spot"
    emu.imdsv2_required = True
    assert raw(emu.url, "GET", "/latest/meta-data/instance-life-cycle")[0] == 401


def test_404_before_the_notice_then_a_fixed_action_time(raw, emu) -> None:  # type: ignore[no-untyped-def]
    tok = {"X-aws-ec2-metadata-token": token(raw, emu)}
    status, headers, body = raw(emu.url, "GET", ACTION, tok)
    assert status == 404 and b"404 - Not Found" in body
    assert raw(emu.url, "GET", "/latest/meta-data/spot/termination-time", tok)[0] == 404
    emu.trigger_notice()
    status, headers, first = raw(emu.url, "GET", ACTION, tok)
    assert status == 200 and headers["content-type"] == "text/plain"
    doc = json.loads(first)
    assert doc["action"] == "terminate"
    when = datetime.strptime(doc["time"], "%Y-%m-%dT%H:%M:%SZ")
    ahead = when.timestamp() - datetime.utcnow().timestamp()
    assert 115 < ahead <= 121
    time.sleep(1.1)
    assert raw(emu.url, "GET", ACTION, tok)[2] == first  # real IMDS keeps the time fixed
    assert (
        raw(emu.url, "GET", "/latest/meta-data/spot/termination-time", tok)[2]
        == doc["time"].encode()
    )


def test_scheduled_notice_and_rebalance(raw) -> None:  # type: ignore[no-untyped-def]
    with AwsImdsEmulator(port=0, notice_after=0.5, rebalance_after=0.1, action="stop") as emu:
        assert raw(emu.url, "GET", ACTION)[0] == 404
        time.sleep(0.3)
        status, _, body = raw(emu.url, "GET", "/latest/meta-data/events/recommendations/rebalance")
        assert status == 200 and "noticeTime" in json.loads(body)
        time.sleep(0.4)
        assert json.loads(raw(emu.url, "GET", ACTION)[2])["action"] == "stop"
        assert emu.notice_visible_wall is not None


def test_faults(raw, emu) -> None:  # type: ignore[no-untyped-def]
    emu.inject(503, count=2, on="instance-id")
    assert raw(emu.url, "GET", "/latest/meta-data/instance-id")[0] == 503
    assert raw(emu.url, "GET", "/latest/meta-data/instance-life-cycle")[0] == 200  # other path
    assert raw(emu.url, "GET", "/latest/meta-data/instance-id")[0] == 503
    assert raw(emu.url, "GET", "/latest/meta-data/instance-id")[0] == 200
    with pytest.raises(ValueError, match="unknown fault"):
        emu.inject("explode")


def test_unknown_action_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown spot action"):
        AwsImdsEmulator(action="vanish")
