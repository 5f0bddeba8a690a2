"""The Detector contract: what the notice watcher relies on from every platform's detector.

Subclass :class:`DetectorContract` and define a ``case`` fixture returning a fresh
:class:`DetectorCase`: the detector, and how to make its platform announce the end (send the
signal, flip the metadata emulator's event). The watcher relies on these promises: quiet until
the platform speaks; then a notice named after the detector, received now, with a deadline no
further out than the platform's nominal notice, which stays pending; ``poll`` never raises when
the platform's endpoint is in trouble; ``acknowledge`` and ``close`` are safe to repeat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spotwise.notices.base import Detector, Notice, NoticeKind

ANNOUNCE_TIMEOUT_S = 15.0  # generous: a loaded CI machine delays loopback replies


@dataclass
class DetectorCase:
    """One detector under test. ``nominal_s`` is the platform's notice length (the deadline is
    at most that far after reception); ``disturb``, when the detector talks to an endpoint,
    puts it in trouble (errors, refused connections) so the suite can check ``poll`` survives."""

    detector: Detector
    announce: Callable[[], None]
    nominal_s: float | None = None
    kind: NoticeKind = NoticeKind.TERMINATE
    disturb: Callable[[], None] | None = None


class ScriptedDetector:
    """An in-memory detector whose notice a test announces: the smallest detector there is, and
    the stand-in for a platform in tests of the code that consumes notices."""

    name = "scripted"
    poll_interval_s = 0.01

    def __init__(self, notice_s: float = 30.0, kind: NoticeKind = NoticeKind.TERMINATE) -> None:
        self.notice_s = notice_s
        self.kind = kind
        self.acknowledged: list[Notice] = []
        self._notice: Notice | None = None
        self._lock = threading.Lock()

    def announce(self) -> None:
        now = time.monotonic()
        deadline = now + self.notice_s if self.kind is NoticeKind.TERMINATE else None
        with self._lock:
            if self._notice is None:
                self._notice = Notice(self.name, self.kind, now, deadline, action="scripted")

    def poll(self) -> Notice | None:
        with self._lock:
            return self._notice

    def acknowledge(self, notice: Notice) -> None:
        self.acknowledged.append(notice)

    def close(self) -> None:
        pass


def _await_notice(detector: Detector) -> Notice:
    end = time.monotonic() + ANNOUNCE_TIMEOUT_S
    while True:
        notice = detector.poll()
        if notice is not None:
            return notice
        assert time.monotonic() < end, (
            f"{detector.name}: no notice {ANNOUNCE_TIMEOUT_S:g}s after it"
        )
        time.sleep(max(detector.poll_interval_s, 0.01))


class DetectorContract:
    """Needs a ``case`` fixture: a fresh :class:`DetectorCase` (the suite closes its detector)."""

    def test_is_a_detector(self, case: DetectorCase) -> None:
        try:
            assert isinstance(case.detector, Detector)
            assert isinstance(case.detector.name, str) and case.detector.name
            assert case.detector.poll_interval_s >= 0
        finally:
            case.detector.close()

    def test_quiet_until_the_platform_speaks(self, case: DetectorCase) -> None:
        try:
            assert case.detector.poll() is None
            assert case.detector.poll() is None
        finally:
            case.detector.close()

    def test_an_announcement_becomes_a_pending_notice(self, case: DetectorCase) -> None:
        det = case.detector
        try:
            det.poll()  # a first read before the event, as the watcher does
            before = time.monotonic()
            case.announce()
            notice = _await_notice(det)
            assert notice.source == det.name and notice.kind is case.kind
            assert before - 1.0 <= notice.received_monotonic <= time.monotonic()
            if notice.deadline_monotonic is not None:
                lead = notice.deadline_monotonic - notice.received_monotonic
                assert lead >= 0
                if case.nominal_s is not None:
                    assert lead <= case.nominal_s + 1.0, f"{lead:.1f}s > {case.nominal_s}s"
            again = det.poll()  # still pending: the loop may look twice before it saves
            assert again is not None and again.kind is notice.kind
        finally:
            det.close()

    def test_acknowledge_and_close_are_safe_to_repeat(self, case: DetectorCase) -> None:
        det = case.detector
        case.announce()
        notice = _await_notice(det)
        det.acknowledge(notice)
        det.close()
        det.close()

    def test_poll_survives_trouble_at_the_endpoint(self, case: DetectorCase) -> None:
        det = case.detector
        try:
            if case.disturb is not None:  # a signal-driven detector has no endpoint
                det.poll()
                case.disturb()
            for _ in range(3):
                det.poll()  # must return (None or a notice), never raise
        finally:
            det.close()
