"""The watcher: merged view, cached current(), latching, acknowledgement, lifecycle."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from spotwise.emulators import AwsImdsEmulator, AzureScheduledEventsEmulator
from spotwise.notices.aws import AwsDetector
from spotwise.notices.base import NoticeKind, NoticeSource
from spotwise.notices.signals import SignalDetector
from spotwise.notices.watcher import Watcher, watch_from_environment


def test_watch_from_environment_is_a_notice_source_and_restores_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    source = watch_from_environment({"SPOTWISE_PLATFORM": "none"})
    assert isinstance(source, NoticeSource)
    assert source.detectors == ["signal"]
    assert signal.getsignal(signal.SIGTERM) is not before
    assert source.current() is None
    source.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_is_seen_at_once_through_the_watcher() -> None:
    with watch_from_environment({"SPOTWISE_PLATFORM": "none", "SPOTWISE_GRACE_S": "5"}) as w:
        os.kill(os.getpid(), signal.SIGTERM)
        notice = w.current()
        assert notice is not None and notice.is_terminate
        assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(5.0)


def test_merges_cloud_and_signal_into_the_earliest_deadline(
    aws_emulator: AwsImdsEmulator, wait_for
) -> None:
    env = {
        "SPOTWISE_PLATFORM": "none",
        "SPOTWISE_GRACE_S": "300",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": aws_emulator.url,
        "SPOTWISE_AWS_POLL_S": "0.05",
    }
    with watch_from_environment(env) as w:
        os.kill(os.getpid(), signal.SIGTERM)  # deadline +300 s
        assert w.current().source == "signal"
        aws_emulator.trigger_notice()  # deadline +120 s: earlier, wins
        notice = wait_for(lambda: (n := w.current()) is not None and n.source == "aws" and n)
        assert notice.is_terminate and notice.action == "terminate"


def test_current_never_waits_on_a_hanging_server(aws_emulator: AwsImdsEmulator, wait_for) -> None:
    aws_emulator.inject("hang")
    det = AwsDetector(aws_emulator.url, poll_interval_s=0.05, timeout_s=5.0)
    with Watcher(remote=[det]) as w:
        time.sleep(0.2)  # the poller is now stuck inside the hanging request
        worst = 0.0
        for _ in range(200):
            started = time.perf_counter()
            assert w.current() is None
            worst = max(worst, time.perf_counter() - started)
        assert worst < 0.05


def test_terminate_latches_even_if_the_endpoint_forgets(
    aws_emulator: AwsImdsEmulator, wait_for
) -> None:
    det = AwsDetector(aws_emulator.url, poll_interval_s=0.05)
    with Watcher(remote=[det]) as w:
        aws_emulator.trigger_notice()
        first = wait_for(w.current)
        aws_emulator.inject(503)
        time.sleep(0.3)
        assert w.current() == first


def test_acknowledged_advisory_is_not_repeated_but_terminate_still_comes(
    aws_emulator: AwsImdsEmulator, wait_for
) -> None:
    det = AwsDetector(aws_emulator.url, poll_interval_s=0.05)
    with Watcher(remote=[det]) as w:
        aws_emulator.trigger_rebalance()
        advisory = wait_for(w.current)
        assert advisory.kind is NoticeKind.ADVISORY
        w.acknowledge(advisory)
        assert w.current() is None
        aws_emulator.trigger_notice()
        assert wait_for(w.current).is_terminate


def test_acknowledge_reaches_azure(wait_for) -> None:
    with AzureScheduledEventsEmulator(port=0) as emu:
        env = {"SPOTWISE_PLATFORM": "none", "SPOTWISE_AZURE_METADATA_ENDPOINT": emu.url}
        with watch_from_environment(env) as w:
            emu.trigger_notice()
            notice = wait_for(w.current)
            w.acknowledge(notice)
            assert emu.acknowledged == [notice.detail["event_id"]]


def test_created_off_the_main_thread_still_polls_clouds(
    aws_emulator: AwsImdsEmulator, wait_for
) -> None:
    made: list[Watcher] = []
    env = {
        "SPOTWISE_PLATFORM": "none",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": aws_emulator.url,
        "SPOTWISE_AWS_POLL_S": "0.05",
    }
    thread = threading.Thread(target=lambda: made.append(watch_from_environment(env)))
    thread.start()
    thread.join()
    with made[0] as w:
        aws_emulator.trigger_notice()
        assert wait_for(w.current).source == "aws"


def test_threads_are_daemons_and_close_is_quick(aws_emulator: AwsImdsEmulator) -> None:
    aws_emulator.inject("hang")
    det = AwsDetector(aws_emulator.url, poll_interval_s=0.05, timeout_s=30.0)
    w = Watcher(local=[SignalDetector(env={})], remote=[det])
    time.sleep(0.1)
    threads = [t for t in threading.enumerate() if t.name.startswith("spotwise-notices")]
    assert threads and all(t.daemon for t in threads)
    started = time.monotonic()
    w.close()
    assert time.monotonic() - started < 1.0


def test_discovery_runs_in_the_background(wait_for) -> None:
    gate = threading.Event()

    def slow_discover() -> list:  # type: ignore[type-arg]
        gate.wait(5)
        return []

    started = time.monotonic()
    with Watcher(discover=slow_discover) as w:
        assert time.monotonic() - started < 0.1
        assert w.current() is None and not w.discovered.is_set()
        gate.set()
        assert wait_for(w.discovered.is_set)
