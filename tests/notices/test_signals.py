"""POSIX signal detection: handlers record only; deadlines; restore; off-main-thread."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from spotwise.errors import NoticeError
from spotwise.notices.base import NoticeKind
from spotwise.notices.kubernetes import KubernetesDetector
from spotwise.notices.signals import SignalDetector, parse_signal_names


def test_parse_signal_names() -> None:
    assert parse_signal_names("TERM,INT,USR1") == ("TERM", "INT", "USR1")
    assert parse_signal_names("sigterm, SIGUSR2 ,term") == ("TERM", "USR2")
    with pytest.raises(NoticeError, match="unknown signal 'KILL'") as err:
        parse_signal_names("TERM,KILL")
    assert "TERM,INT,USR1" in str(err.value)


def test_sigterm_becomes_a_terminate_notice_with_the_grace_deadline() -> None:
    det = SignalDetector(env={"SPOTWISE_GRACE_S": "12"})
    try:
        assert det.installed == ("TERM", "INT")
        assert det.poll() is None
        before = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        notice = det.poll()
        assert notice is not None
        assert notice.kind is NoticeKind.TERMINATE
        assert notice.action == "SIGTERM" and notice.source == "signal"
        assert before <= notice.received_monotonic <= time.monotonic()
        assert notice.deadline_monotonic == pytest.approx(notice.received_monotonic + 12.0)
        assert det.poll() is notice  # stable between polls
    finally:
        det.close()


def test_default_grace_is_the_kubernetes_default() -> None:
    det = KubernetesDetector(env={})
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        notice = det.poll()
        assert notice is not None and notice.source == "kubernetes"
        assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(30.0)
    finally:
        det.close()


def test_usr1_only_when_configured_and_handlers_restored_on_close() -> None:
    def sentinel(signum: int, frame: object) -> None:
        got.append(signum)

    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, sentinel)
    try:
        det = SignalDetector(env={})
        assert "USR1" not in det.installed
        os.kill(os.getpid(), signal.SIGUSR1)
        assert det.poll() is None and got == [signal.SIGUSR1]
        det.close()

        det = SignalDetector(env={"SPOTWISE_SIGNALS": "TERM,INT,USR1"})
        os.kill(os.getpid(), signal.SIGUSR1)
        notice = det.poll()
        assert notice is not None and notice.action == "SIGUSR1"
        assert got == [signal.SIGUSR1]  # the detector took it
        det.close()
        assert signal.getsignal(signal.SIGUSR1) is sentinel
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_second_sigint_aborts_with_keyboard_interrupt() -> None:
    # Ctrl-C as Python sets it up in a program started from a terminal; a test run started in
    # the background by a shell inherits SIGINT ignored, and then a second Ctrl-C is ignored too
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    det = SignalDetector(env={})
    try:
        os.kill(os.getpid(), signal.SIGINT)  # first: recorded, no exception
        assert det.poll() is not None
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs between bytecodes; give it the chance
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        det.close()
        signal.signal(signal.SIGINT, before)


def test_off_the_main_thread_it_watches_nothing_instead_of_failing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    made: list[SignalDetector] = []
    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=lambda: made.append(SignalDetector(env={})))
    thread.start()
    thread.join()
    assert made[0].installed == ()
    assert made[0].poll() is None
    assert signal.getsignal(signal.SIGTERM) is before
    assert "off the main thread" in caplog.text
    made[0].close()


def test_bad_grace_is_a_clear_error() -> None:
    with pytest.raises(NoticeError, match="SPOTWISE_GRACE_S='soon'"):
        SignalDetector(env={"SPOTWISE_GRACE_S": "soon"})
