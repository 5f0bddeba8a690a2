"""AWS IMDS detector: parsing of recorded bodies, and behaviour over real HTTP (emulator)."""

from __future__ import annotations

import time

import pytest

from spotwise.emulators import AwsImdsEmulator
from spotwise.notices.aws import (
    AwsDetector,
    parse_instance_action,
    parse_rebalance,
    parse_time,
    probe,
)
from spotwise.notices.base import NoticeKind

# Bodies as documented by AWS (spot-instance-termination-notices.md, rebalance-recommendations.md)
RECORDED_ACTION = b'{"action": "terminate", "time": "2017-09-18T08:22:00Z"}'
RECORDED_REBALANCE = b'{"noticeTime": "2020-10-27T08:22:00Z"}'


def test_parse_recorded_bodies() -> None:
    action, when = parse_instance_action(RECORDED_ACTION)
    assert action == "terminate"
    assert when == 1505722920.0  # 2017-09-18T08:22:00Z
    assert parse_rebalance(RECORDED_REBALANCE) == 1603786920.0
    assert parse_instance_action(b'{"action":"Hibernate","time":"2017-09-18T08:22:00Z"}')[0] == (
        "hibernate"
    )
    assert parse_time("2017-09-18T08:22:00+00:00") == 1505722920.0


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[]", b'{"action": 3, "time": "x"}', b'{"action": "stop"}', b'{"time": "x"}'],
)
def test_parse_rejects_malformed(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_instance_action(body)


def detector(emu: AwsImdsEmulator, **kw: float) -> AwsDetector:
    return AwsDetector(emu.url, poll_interval_s=0.05, timeout_s=kw.pop("timeout_s", 1.0))


def test_no_notice_is_404_and_uses_an_imdsv2_token(aws_emulator: AwsImdsEmulator) -> None:
    det = detector(aws_emulator)
    assert det.poll() is None
    assert det.poll() is None
    assert aws_emulator.count("/latest/api/token", 200) == 1  # the token is reused
    assert aws_emulator.count("spot/instance-action", 404) == 2
    assert aws_emulator.count("rebalance", 404) == 2


def test_terminate_notice_deadline_is_the_action_time(aws_emulator: AwsImdsEmulator) -> None:
    det = detector(aws_emulator)
    aws_emulator.trigger_notice()
    notice = det.poll()
    assert notice is not None and notice.kind is NoticeKind.TERMINATE
    assert notice.action == "terminate" and notice.source == "aws"
    left = notice.deadline_monotonic - time.monotonic()
    assert 115.0 < left <= 120.0  # the body's time has 1 s resolution
    assert det.poll() is notice


def test_hibernate_means_now(aws_emulator: AwsImdsEmulator) -> None:
    aws_emulator.action = "hibernate"
    aws_emulator.trigger_notice()
    notice = detector(aws_emulator).poll()
    assert notice is not None and notice.action == "hibernate"
    assert notice.deadline_monotonic == pytest.approx(notice.received_monotonic)


def test_notice_in_the_past_means_now(aws_emulator: AwsImdsEmulator) -> None:
    aws_emulator.lead_s = -300.0
    aws_emulator.trigger_notice()
    notice = detector(aws_emulator).poll()
    assert notice is not None
    assert notice.deadline_monotonic == pytest.approx(notice.received_monotonic)


def test_clock_skew_cannot_push_the_deadline_past_two_minutes(
    aws_emulator: AwsImdsEmulator,
) -> None:
    aws_emulator.clock_skew_s = 3600.0  # the platform's clock is an hour ahead of ours
    aws_emulator.trigger_notice()
    notice = detector(aws_emulator).poll()
    assert notice is not None
    assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(120.0)


def test_rebalance_is_advisory_until_the_terminate_arrives(aws_emulator: AwsImdsEmulator) -> None:
    det = detector(aws_emulator)
    aws_emulator.trigger_rebalance()
    advisory = det.poll()
    assert advisory is not None and advisory.kind is NoticeKind.ADVISORY
    assert advisory.deadline_monotonic is None and advisory.action == "rebalance"
    assert det.poll() is advisory
    aws_emulator.trigger_notice()
    assert det.poll().kind is NoticeKind.TERMINATE


def test_unknown_action_still_saves(aws_emulator: AwsImdsEmulator) -> None:
    aws_emulator.trigger_notice()
    aws_emulator._action_body = b'{"action": "evaporate", "time": "2099-01-01T00:00:00Z"}'
    notice = detector(aws_emulator).poll()
    assert notice is not None and notice.kind is NoticeKind.TERMINATE
    assert notice.action == "evaporate"
    assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(120.0)


def test_malformed_instance_action_counts_as_termination(
    aws_emulator: AwsImdsEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    aws_emulator.inject("malformed", on="instance-action")
    aws_emulator.trigger_notice()
    notice = detector(aws_emulator).poll()
    assert notice is not None and notice.kind is NoticeKind.TERMINATE
    assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(120.0)
    assert "unreadable" in caplog.text


@pytest.mark.parametrize("status", [429, 500, 503, 403])
def test_error_replies_back_off_and_recover(
    aws_emulator: AwsImdsEmulator, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    det = detector(aws_emulator)
    aws_emulator.inject(status, count=3, on="meta-data")
    aws_emulator.trigger_notice()
    intervals = []
    for _ in range(3):
        assert det.poll() is None
        intervals.append(det.poll_interval_s)
    assert intervals == sorted(intervals) and intervals[-1] > intervals[0]  # backing off
    notice = det.poll()
    assert notice is not None and notice.kind is NoticeKind.TERMINATE
    assert det.poll_interval_s == pytest.approx(0.05)
    assert caplog.text.count(f"answered {status}") == 1  # logged once


def test_expired_token_gets_a_new_one(aws_emulator: AwsImdsEmulator) -> None:
    aws_emulator.imdsv2_required = True
    det = detector(aws_emulator)
    assert det.poll() is None
    aws_emulator.expire_tokens()
    aws_emulator.trigger_notice()
    assert det.poll() is not None
    assert aws_emulator.count("/latest/api/token", 200) == 2
    assert aws_emulator.count("instance-action", 401) == 1


def test_token_put_that_hangs_falls_back_to_imdsv1(aws_emulator: AwsImdsEmulator) -> None:
    aws_emulator.inject("hang", on="/latest/api/token")  # hop limit 1 from a container
    det = AwsDetector(aws_emulator.url, poll_interval_s=0.05, timeout_s=0.3)
    aws_emulator.trigger_notice()
    notice = det.poll()
    assert notice is not None and notice.kind is NoticeKind.TERMINATE
    assert aws_emulator.count("instance-action", 200) == 1


def test_a_hanging_server_costs_one_timeout_per_poll(aws_emulator: AwsImdsEmulator) -> None:
    aws_emulator.inject("hang", on="meta-data")
    det = AwsDetector(aws_emulator.url, poll_interval_s=0.05, timeout_s=0.3)
    started = time.monotonic()
    assert det.poll() is None
    assert time.monotonic() - started < 2.0


def test_connection_refused_is_not_an_error(closed_port_url: str) -> None:
    det = AwsDetector(closed_port_url, timeout_s=0.3)
    assert det.poll() is None
    assert det.poll_interval_s > det.base_interval_s  # backs off


def test_probe(aws_emulator: AwsImdsEmulator, closed_port_url: str) -> None:
    assert probe(aws_emulator.url, 0.5) is True
    assert probe(closed_port_url, 0.5) is False


def test_probe_falls_back_to_v1_when_the_token_put_hangs(aws_emulator: AwsImdsEmulator) -> None:
    aws_emulator.inject("hang", on="/latest/api/token")
    assert probe(aws_emulator.url, 0.3) is True
