"""The notice seam: detectors report that the machine will go away, and by when.

Deadlines are on the *monotonic* clock (``time.monotonic()``), so wall-clock skew between the
platform and this machine cannot move them after they are received.
"""

from __future__ import annotations

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
    detail: dict[str, str] = field(default_factory=dict)

    @property
    def is_terminate(self) -> bool:
        return self.kind is NoticeKind.TERMINATE


@runtime_checkable
class Detector(Protocol):
    """One platform's way of announcing the end. ``poll`` is non-blocking and never raises on
    network trouble: it returns None and logs once."""

    name: str

    def poll(self) -> Notice | None: ...


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
