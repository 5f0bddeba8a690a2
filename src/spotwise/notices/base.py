"""The notice seam: detectors report that the machine will go away, and by when.

Deadlines are on the *monotonic* clock (``time.monotonic()``), so wall-clock skew between the
platform and this machine cannot move them after they are received.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable


class NoticeKind(str, Enum):
    TERMINATE = "terminate"  # the machine goes away at the deadline: save and exit 75
    ADVISORY = "advisory"  # elevated risk (e.g. AWS rebalance): save early, keep training


@dataclass(frozen=True)
class Notice:
    source: str  # detector name: "signal", "aws", "gcp", "azure", "slurm", "kubernetes"
    kind: NoticeKind
    received_monotonic: float
    deadline_monotonic: float | None  # None: no known deadline (advisory, or unknown)
    action: str = ""  # platform words: "terminate", "stop", "Preempt", "SIGTERM"...
    detail: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_terminate(self) -> bool:
        return self.kind is NoticeKind.TERMINATE


@runtime_checkable
class Detector(Protocol):
    """One platform's way of announcing the end.

    ``poll`` never raises on network trouble: it returns the detector's current notice (or
    None) and logs a problem once. It may block for at most its own short timeout (or a
    long-poll's ``timeout_sec``), because the watcher gives every network detector its own
    daemon thread; the training loop never waits on it. ``acknowledge`` is called once the
    emergency checkpoint has committed (Azure wants it); ``close`` releases what the detector
    holds (signal handlers, sockets)."""

    name: str
    poll_interval_s: float

    def poll(self) -> Notice | None: ...

    def acknowledge(self, notice: Notice) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class NoticeSource(Protocol):
    """What the training loop (``spotwise.runtime.Run``) consumes: the merged view of all
    detectors. ``acknowledge`` is called once the emergency checkpoint has committed (Azure
    Scheduled Events wants an explicit acknowledgement)."""

    def current(self) -> Notice | None:
        """The most urgent pending notice, or None. Cheap: called at every step boundary."""
        ...

    def acknowledge(self, notice: Notice) -> None: ...

    def close(self) -> None: ...


def most_urgent(notices: Iterable[Notice | None]) -> Notice | None:
    """The notice the training loop must act on.

    Terminate notices win over advisory ones; among them the earliest deadline wins (a terminate
    notice without a deadline counts as due now). Advisory notices set no deadline, so among
    them the first received wins. This is the deadline merge: the effective deadline is the
    minimum over terminate-type notices.
    """
    terminate: Notice | None = None
    advisory: Notice | None = None
    for notice in notices:
        if notice is None:
            continue
        if notice.is_terminate:
            if terminate is None or _due(notice) < _due(terminate):
                terminate = notice
        elif advisory is None or notice.received_monotonic < advisory.received_monotonic:
            advisory = notice
    return terminate if terminate is not None else advisory


def effective_deadline(notices: Iterable[Notice | None]) -> float | None:
    """Minimum deadline over terminate-type notices; None when no terminate notice is pending."""
    urgent = most_urgent(notices)
    if urgent is None or not urgent.is_terminate:
        return None
    return _due(urgent)


def _due(notice: Notice) -> float:
    return (
        notice.deadline_monotonic
        if notice.deadline_monotonic is not None
        else notice.received_monotonic
    )


def deadline_from_wall(
    wall_deadline: float, *, wall_now: float, mono_now: float, nominal_s: float
) -> float:
    """Convert a platform's wall-clock deadline to the monotonic clock at detection time.

    ``mono_now + clamp(wall_deadline - wall_now, 0, nominal_s)``: a deadline in the past means
    now, and clock skew can never push a deadline further out than the platform's nominal
    notice (AWS 120 s, GCP/Azure Preempt 30 s).
    """
    remaining = min(max(wall_deadline - wall_now, 0.0), nominal_s)
    return mono_now + remaining


class LogOnce:
    """Log each distinct problem once at WARNING, repeats at DEBUG: a flapping endpoint polled
    every second must not flood the training log."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()

    def __call__(self, key: str, message: str, *args: object) -> None:
        level = logging.DEBUG if key in self._seen else logging.WARNING
        self._seen.add(key)
        self._logger.log(level, message, *args)

    def info(self, key: str, message: str, *args: object) -> None:
        level = logging.DEBUG if key in self._seen else logging.INFO
        self._seen.add(key)
        self._logger.log(level, message, *args)


@dataclass(frozen=True)
class CloudPlatform:
    """How the watcher finds and builds one cloud's detectors.

    ``override_var`` names the endpoint variable (the platform's own convention where there is
    one); ``probe`` answers within ``timeout_s`` whether the metadata service at ``base`` is
    really that cloud's; ``detectors`` builds the pollers for a base URL.
    """

    name: str
    override_var: str
    default_base: str
    base_from_override: Callable[[str], str]
    probe: Callable[[str, float], bool]
    detectors: Callable[[str, Mapping[str, str]], list[Detector]]
