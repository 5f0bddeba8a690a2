"""GCP Compute Engine preemption and host-maintenance notices from the metadata server.

Two keys, each watched by its own detector (so each gets its own thread and long-poll):
``instance/preempted`` (TRUE once the Spot/preemptible VM is being stopped: 30 s left) and
``instance/maintenance-event`` (TERMINATE_ON_HOST_MAINTENANCE 60 s ahead; MIGRATE is advisory).
The first read is a plain GET (the maintenance warning is skipped unless the key was read since
the last event), then ``wait_for_change`` long-polls with the last ETag.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from urllib.parse import quote

from spotwise import settings
from spotwise.errors import NoticeError
from spotwise.notices.base import (
    CloudPlatform,
    Detector,
    LogOnce,
    Notice,
    NoticeKind,
)
from spotwise.notices.http import NetworkTrouble, normalize_base, request

log = logging.getLogger("spotwise.notices")

DEFAULT_BASE = "http://169.254.169.254"  # = metadata.google.internal, without a DNS lookup
PREFIX = "/computeMetadata/v1/"
HEADERS = {"Metadata-Flavor": "Google"}
PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"
PREEMPT_NOTICE_S = 30.0
MAINTENANCE_NOTICE_S = 60.0  # GPU VMs get an hour; SPOTWISE_GCP_MAINTENANCE_NOTICE_S=3600
DEFAULT_WAIT_S = 30.0
MAX_BACKOFF_S = 30.0


def interpret(key: str, value: str) -> tuple[NoticeKind, str] | None:
    """What a key's value means: ``(kind, action)``, or None for "nothing is happening".

    Raises ValueError for a value the spec does not list (logged by the caller).
    """
    value = value.strip().upper()
    if key == PREEMPTED:
        if value == "TRUE":
            return NoticeKind.TERMINATE, "preempted"
        if value == "FALSE":
            return None
        raise ValueError(f"unexpected preempted value {value!r}")
    if value == "NONE":
        return None
    if value == "TERMINATE_ON_HOST_MAINTENANCE":
        return NoticeKind.TERMINATE, value
    if value == "MIGRATE_ON_HOST_MAINTENANCE":
        return NoticeKind.ADVISORY, value
    raise ValueError(f"unexpected maintenance-event value {value!r}")


class GcpDetector:
    name = "gcp"

    def __init__(
        self,
        base: str = DEFAULT_BASE,
        key: str = PREEMPTED,
        *,
        wait_s: float = DEFAULT_WAIT_S,
        timeout_s: float = 1.0,
        maintenance_notice_s: float = MAINTENANCE_NOTICE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = normalize_base(base)
        self.key = key
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self.lead_s = PREEMPT_NOTICE_S if key == PREEMPTED else maintenance_notice_s
        self.poll_interval_s = 0.0
        self._clock = clock
        self._etag: str | None = None
        self._value: str | None = None
        self._notice: Notice | None = None
        self._backoff_s = 1.0
        self._log = LogOnce(log)

    def poll(self) -> Notice | None:
        if self._notice is not None and self._notice.is_terminate:
            return self._notice
        url = self.base + PREFIX + self.key
        timeout = self.timeout_s
        if self._etag is not None:
            url += (
                f"?wait_for_change=true&last_etag={quote(self._etag)}"
                f"&timeout_sec={int(self.wait_s)}"
            )
            timeout = self.wait_s + 5.0
        started = self._clock()
        try:
            reply = request("GET", url, headers=HEADERS, timeout_s=timeout)
        except NetworkTrouble as exc:
            self._log("network", "spotwise: gcp metadata unreachable (%s)", exc)
            return self._back_off()
        if reply.status != 200:
            self._log(
                f"status-{reply.status}",
                "spotwise: gcp metadata answered %s for %s; retrying with backoff",
                reply.status,
                self.key,
            )
            return self._back_off()
        if reply.headers.get("metadata-flavor") != "Google":
            self._log("flavor", "spotwise: reply without Metadata-Flavor: Google ignored")
            return self._back_off()
        self._backoff_s = 1.0
        changed = reply.headers.get("etag") != self._etag or reply.text != self._value
        self._etag, self._value = reply.headers.get("etag"), reply.text
        # A server that ignores wait_for_change must not turn this into a busy loop.
        quick = self._clock() - started < 0.5
        self.poll_interval_s = 1.0 if quick and not changed else 0.0
        if changed:
            self._notice = self._notice_for(reply.text)
        return self._notice

    def _back_off(self) -> Notice | None:
        self.poll_interval_s = self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, MAX_BACKOFF_S)
        return self._notice

    def _notice_for(self, value: str) -> Notice | None:
        try:
            meaning = interpret(self.key, value)
        except ValueError as exc:
            self._log(f"value-{value}", "spotwise: gcp %s; ignored", exc)
            return self._notice
        if meaning is None:
            return None
        kind, action = meaning
        now = self._clock()
        if kind is NoticeKind.TERMINATE:
            log.warning("spotwise: gcp %s; %.0f s left", action, self.lead_s)
        else:
            self._log.info(action, "spotwise: gcp %s (advisory)", action)
        return Notice(
            source=self.name,
            kind=kind,
            received_monotonic=now,
            deadline_monotonic=now + self.lead_s if kind is NoticeKind.TERMINATE else None,
            action=action,
            detail={"key": self.key, "value": value},
        )

    def acknowledge(self, notice: Notice) -> None:
        """GCP has nothing to acknowledge."""

    def close(self) -> None:
        """Nothing held between polls."""


def probe(base: str, timeout_s: float) -> bool:
    """GCP is confirmed by the ``Metadata-Flavor: Google`` reply header."""
    try:
        reply = request("GET", normalize_base(base) + PREFIX, headers=HEADERS, timeout_s=timeout_s)
    except NetworkTrouble:
        return False
    return reply.headers.get("metadata-flavor") == "Google"


def detectors(base: str, env: Mapping[str, str]) -> list[Detector]:
    wait_s = max(1.0, settings.GCP_WAIT_S.seconds(env, DEFAULT_WAIT_S, error=NoticeError))
    lead = settings.GCP_MAINTENANCE_NOTICE_S.seconds(env, MAINTENANCE_NOTICE_S, error=NoticeError)
    return [
        GcpDetector(base, PREEMPTED, wait_s=wait_s),
        GcpDetector(base, MAINTENANCE, wait_s=wait_s, maintenance_notice_s=lead),
    ]


PLATFORM = CloudPlatform(
    name="gcp",
    override_var="GCE_METADATA_HOST",
    default_base=DEFAULT_BASE,
    base_from_override=normalize_base,
    probe=probe,
    detectors=detectors,
)
