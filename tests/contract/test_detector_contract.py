"""The Detector contract (shipped in :mod:`spotwise.testing`) over every registered detector:
the cloud ones against their loopback metadata emulators, the signal ones with real signals to
this process."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from spotwise.emulators import AwsImdsEmulator, AzureScheduledEventsEmulator, GcpMetadataEmulator
from spotwise.emulators._server import LoopbackEmulator
from spotwise.notices import DETECTORS
from spotwise.notices.aws import NOMINAL_NOTICE_S, AwsDetector
from spotwise.notices.azure import TERMINATE_TYPES, AzureDetector
from spotwise.notices.gcp import PREEMPT_NOTICE_S, GcpDetector
from spotwise.notices.heartbeat import HeartbeatDetector
from spotwise.notices.kubernetes import KubernetesDetector
from spotwise.notices.signals import DEFAULT_GRACE_S, SignalDetector
from spotwise.notices.slurm import SIGNAL_LEAD_S, SlurmDetector
from spotwise.testing import DetectorCase, DetectorContract, ScriptedDetector


def _signal(signum: int) -> Callable[[], None]:
    return lambda: os.kill(os.getpid(), signum)


def _heartbeat() -> DetectorCase:
    """The watchdog on a heartbeat that never changes: its clock stands still until the
    announcement, then runs, and the limit (50 ms) has passed at once."""
    frozen = [time.monotonic()]
    det = HeartbeatDetector(
        f"memory://heartbeat-{uuid.uuid4().hex}",
        limit_s=0.05,
        grace_s=30.0,
        clock=lambda: frozen[0] if frozen else time.monotonic(),
    )
    return DetectorCase(det, announce=frozen.clear, nominal_s=30.0)


def _emulated(emu: LoopbackEmulator, build: Callable[[str], object], nominal_s: float):
    url = emu.start()
    return DetectorCase(
        build(url),  # type: ignore[arg-type]
        announce=emu.trigger_notice,
        nominal_s=nominal_s,
        disturb=lambda: emu.inject("close"),
    )


CASES: dict[str, Callable[[], DetectorCase]] = {
    "aws": lambda: _emulated(
        AwsImdsEmulator(port=0, hang_s=5.0),
        lambda url: AwsDetector(url, poll_interval_s=0.05, timeout_s=1.0),
        NOMINAL_NOTICE_S,
    ),
    "azure": lambda: _emulated(
        AzureScheduledEventsEmulator(port=0, hang_s=5.0, rate_limit_per_s=0),
        lambda url: AzureDetector(url, poll_interval_s=0.05, first_timeout_s=2.0),
        TERMINATE_TYPES["Preempt"],
    ),
    "gcp": lambda: _emulated(
        GcpMetadataEmulator(port=0, hang_s=5.0),
        lambda url: GcpDetector(url, wait_s=1, timeout_s=2.0),
        PREEMPT_NOTICE_S,
    ),
    "heartbeat": _heartbeat,
    "kubernetes": lambda: DetectorCase(
        KubernetesDetector(env={}), _signal(signal.SIGTERM), DEFAULT_GRACE_S
    ),
    "signal": lambda: DetectorCase(SignalDetector(env={}), _signal(signal.SIGINT), DEFAULT_GRACE_S),
    "slurm": lambda: DetectorCase(
        SlurmDetector(
            env={"SLURM_JOB_ID": "42"}, runner=lambda argv: None, refresh_in_background=False
        ),
        _signal(signal.SIGUSR1),
        SIGNAL_LEAD_S,
    ),
}


def _scripted() -> DetectorCase:
    det = ScriptedDetector(notice_s=30.0)
    return DetectorCase(det, det.announce, nominal_s=30.0)


class TestDetectors(DetectorContract):
    @pytest.fixture(params=[*sorted(CASES), "scripted"])
    def case(self, request: pytest.FixtureRequest) -> Iterator[DetectorCase]:
        made = _scripted() if request.param == "scripted" else CASES[request.param]()
        try:
            yield made
        finally:
            made.detector.close()  # also when a test failed before its own close
            emulator = getattr(made.announce, "__self__", None)
            if isinstance(emulator, LoopbackEmulator):
                emulator.stop()


def test_every_registered_detector_runs_the_contract() -> None:
    assert set(DETECTORS.names()) == set(CASES), "add the detector's case to CASES"
