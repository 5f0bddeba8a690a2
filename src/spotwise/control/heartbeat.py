"""The controller's side of the unsupervised-machine watchdog (:mod:`spotwise.notices.heartbeat`).

Each controller tick calls :meth:`Heartbeat.beat`, which writes the job's heartbeat object only
every :func:`~spotwise.notices.heartbeat.beat_every_s` (a few seconds to a minute): a write per
tick would cost a server driving 1,000 jobs thousands of writes a second. The object lives in
the job's checkpoint storage, where its machines already read and write (a local run directory
through the durable atomic write, or ``s3://``); a job whose machines save where the controller
cannot reach (a Kubernetes volume) gets no heartbeat and no watchdog.
"""

from __future__ import annotations

import json
import os
import socket

from spotwise import settings
from spotwise.errors import SpotwiseError
from spotwise.notices.heartbeat import HEARTBEAT_KEY, renew_due
from spotwise.storage import Storage, open_storage


def heartbeat_location(checkpoint_dir: str, same_host: bool) -> str | None:
    """Where the controller and the job's machines both reach the heartbeat: the machines'
    checkpoint directory when it is on the controller's host or an object store; else None."""
    return checkpoint_dir if same_host or "://" in checkpoint_dir else None


def machine_env(limit_s: float | None, location: str | None) -> dict[str, str]:
    """The variables that start the watchdog on a machine (none: no watchdog)."""
    if limit_s is None or location is None:
        return {}
    return {
        settings.HEARTBEAT_URI.name: location,
        settings.UNSUPERVISED_LIMIT_S.name: f"{limit_s:g}",
    }


class Heartbeat:
    """Renews one job's heartbeat; a write that fails is reported once, never raised (the
    machines stop after the limit, which is what an unreachable control plane should cost)."""

    def __init__(self, location: str | None, limit_s: float | None) -> None:
        self.location = location if limit_s is not None else None
        self.limit_s = limit_s
        self.identity = f"{socket.gethostname()} pid {os.getpid()}"
        self._storage: Storage | None = None
        self._last: float | None = None
        self._failing = False

    def beat(self, now: float) -> str | None:
        """Renew the heartbeat if it is due at ``now`` (the controller's clock); a message for
        the job's events when a write first fails or works again, else None."""
        if self.location is None or self.limit_s is None:
            return None
        if not renew_due(self._last, now, self.limit_s):
            return None
        doc = {
            "written_unix": now,
            "controller": self.identity,
            "unsupervised_limit_s": self.limit_s,
        }
        try:
            if self._storage is None:
                self._storage = open_storage(self.location)
            self._storage.put(HEARTBEAT_KEY, json.dumps(doc).encode())
        except (SpotwiseError, OSError) as exc:
            self._last = now  # try again at the next renewal, not at every tick
            if self._failing:
                return None
            self._failing = True
            what = getattr(exc, "message", None) or str(exc)
            return (
                f"cannot renew the heartbeat in {self.location}: {what}; the job's machines "
                f"stop after {self.limit_s:g}s without one (unsupervised_limit)"
            )
        self._last = now
        if self._failing:
            self._failing = False
            return f"heartbeat in {self.location} renewed again"
        return None
