"""The unsupervised-machine watchdog: a terminate notice once the control plane is gone.

The controller (``spotwise launch`` or ``spotwise server``) renews a small object,
:data:`HEARTBEAT_KEY`, in the job's checkpoint storage (:mod:`spotwise.control.heartbeat`). A
machine reads it every :func:`beat_every_s`; when it has not *changed* for the job's
``unsupervised_limit`` the detector raises a terminate notice, so the training process saves and
exits 75 as on a preemption, and the machine then ends (a cloud VM's boot script shuts it down
after the command; a ``sim``/``local`` machine process ends with its command).

Clock skew: the age is the machine's own monotonic time since it last saw the object's bytes
change, never the controller's written time against the machine's wall clock (the two hosts'
clocks may disagree by minutes) nor the store's modification time (S3's ``LastModified`` is the
store's clock, and a local file's mtime the controller host's). The price is that a machine
counts the age from its own first reading: one that starts after its controller died runs the
whole limit before it stops, never less. A heartbeat that cannot be read (missing, a storage
outage) is no change either: a machine that cannot see its control plane is unsupervised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spotwise import settings
from spotwise.errors import NoticeError, SpotwiseError
from spotwise.notices.base import LogOnce, Notice, NoticeKind
from spotwise.notices.signals import grace_from_env

if TYPE_CHECKING:
    from spotwise.storage import Storage

log = logging.getLogger("spotwise.notices")

HEARTBEAT_KEY = ".spotwise-heartbeat.json"  # in the job's checkpoint storage
BEATS_PER_LIMIT = 6  # renewals (and checks) per limit: a late renewal or two is no alarm
MAX_BEAT_S = 60.0  # renew and check at least this often (cheap: one small object)


def beat_every_s(limit_s: float) -> float:
    """How often the controller renews the heartbeat for a job with this limit, and how often
    a machine reads it (so a stale one is seen at most this late)."""
    return min(MAX_BEAT_S, limit_s / BEATS_PER_LIMIT)


def renew_due(last_s: float | None, now_s: float, limit_s: float) -> bool:
    """Whether the controller writes the heartbeat now (``last_s``: its previous write, on its
    own clock): not at every tick, a server ticks 1,000 jobs several times a second."""
    return last_s is None or now_s - last_s >= beat_every_s(limit_s) or now_s < last_s


@dataclass
class Unsupervised:
    """The machine's view of the heartbeat: when it last saw it change (monotonic)."""

    limit_s: float
    changed_at: float  # the watchdog's start counts as the first change
    seen: bytes | None = field(default=None, repr=False)

    def observe(self, content: bytes | None, now: float) -> bool:
        """Record one reading (None: none could be made) at ``now``; whether the machine has
        been unsupervised for the limit."""
        if content is not None and content != self.seen:
            self.seen, self.changed_at = content, now
        return now - self.changed_at >= self.limit_s


class HeartbeatDetector:
    """A notice detector (polled on its own thread) that reads the heartbeat from storage."""

    name = "heartbeat"

    def __init__(
        self,
        location: str,
        limit_s: float,
        grace_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.location = location
        self.limit_s = limit_s
        self.grace_s = grace_s
        self.poll_interval_s = beat_every_s(limit_s)
        self._clock = clock
        self._watch = Unsupervised(limit_s, clock())
        self._storage: Storage | None = None
        self._notice: Notice | None = None
        self._log = LogOnce(log)

    def read(self) -> bytes | None:
        """The heartbeat's bytes, or None (absent, unreadable; logged once)."""
        from spotwise.storage import open_storage

        try:
            if self._storage is None:
                self._storage = open_storage(self.location)
            return self._storage.get(HEARTBEAT_KEY)
        except (SpotwiseError, OSError) as exc:
            what = getattr(exc, "message", None) or str(exc)
            self._log("read", "spotwise: cannot read the heartbeat in %s: %s", self.location, what)
            return None

    def poll(self) -> Notice | None:
        if self._notice is not None:  # latched: a heartbeat that comes back is too late
            return self._notice
        content = self.read()
        now = self._clock()
        if self._watch.observe(content, now):
            log.warning(
                "spotwise: no heartbeat from the controller in %s for %.0f s "
                "(unsupervised_limit): saving and stopping this machine",
                self.location,
                now - self._watch.changed_at,
            )
            self._notice = Notice(
                source=self.name,
                kind=NoticeKind.TERMINATE,
                received_monotonic=now,
                deadline_monotonic=now + self.grace_s,
                action="unsupervised",
            )
        return self._notice

    def acknowledge(self, notice: Notice) -> None:
        return None

    def close(self) -> None:
        return None


def heartbeat_detectors(env: Mapping[str, str]) -> list[HeartbeatDetector]:
    """The watchdog when the controller asked for one (``SPOTWISE_HEARTBEAT_URI`` and
    ``SPOTWISE_UNSUPERVISED_LIMIT_S`` set by it on the machine), else none."""
    location = settings.HEARTBEAT_URI.raw(env)
    limit_s = settings.UNSUPERVISED_LIMIT_S.seconds(env, 0.0, error=NoticeError)
    if not location or limit_s <= 0:
        return []
    return [HeartbeatDetector(location, limit_s, grace_from_env(env))]
