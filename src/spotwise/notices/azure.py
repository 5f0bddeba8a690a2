"""Azure Scheduled Events: Preempt (Spot eviction, 30 s), Terminate, Reboot, Redeploy.

Events go to every VM of an availability set, so only those naming this VM count (its name from
the instance metadata, or ``SPOTWISE_AZURE_VM_NAME``). ``NotBefore`` is RFC 1123 and empty once an
event has Started. After the emergency checkpoint commits, the event is acknowledged with a
``StartRequests`` POST so the platform can go ahead without waiting out the notice.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from spotwise import settings
from spotwise.notices.base import (
    CloudPlatform,
    Detector,
    LogOnce,
    Notice,
    NoticeKind,
    deadline_from_wall,
    most_urgent,
)
from spotwise.notices.http import NetworkTrouble, normalize_base, request

log = logging.getLogger("spotwise.notices")

DEFAULT_BASE = "http://169.254.169.254"
API_VERSION = "2020-07-01"
EVENTS_PATH = f"/metadata/scheduledevents?api-version={API_VERSION}"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
HEADERS = {"Metadata": "true"}
# Event type -> the longest notice it normally comes with (clock-skew clamp), seconds.
TERMINATE_TYPES = {"Preempt": 30.0, "Terminate": 900.0, "Reboot": 900.0, "Redeploy": 600.0}
ADVISORY_TYPES = ("Freeze",)
DEFAULT_POLL_S = 1.0  # Microsoft: poll once per second
FIRST_CALL_TIMEOUT_S = 120.0  # the first call enables the service and can take 2 minutes
MAX_BACKOFF_S = 10.0


@dataclass(frozen=True)
class ScheduledEvent:
    event_id: str
    event_type: str
    resources: tuple[str, ...]
    status: str
    not_before: float | None  # POSIX seconds; None once Started (or empty)


def parse_not_before(text: str) -> float | None:
    """RFC 1123 (``"Mon, 19 Sep 2016 18:29:47 GMT"``) -> POSIX seconds; ``""`` -> None."""
    if not text.strip():
        return None
    return parsedate_to_datetime(text).timestamp()


def parse_document(body: bytes) -> tuple[int, list[ScheduledEvent]]:
    """The Scheduled Events document -> (incarnation, events); ValueError if malformed."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("Events"), list):
        raise ValueError("scheduled events document has no 'Events' list")
    events = []
    for raw in doc["Events"]:
        if not isinstance(raw, dict) or not isinstance(raw.get("EventId"), str):
            raise ValueError("scheduled event without an 'EventId'")
        try:
            not_before = parse_not_before(str(raw.get("NotBefore") or ""))
        except (TypeError, ValueError):
            not_before = None  # unreadable: treat as due now (the safe side)
        events.append(
            ScheduledEvent(
                event_id=raw["EventId"],
                event_type=str(raw.get("EventType", "")),
                resources=tuple(str(r) for r in raw.get("Resources") or ()),
                status=str(raw.get("EventStatus", "")),
                not_before=not_before,
            )
        )
    return int(doc.get("DocumentIncarnation", 0)), events


class AzureDetector:
    name = "azure"

    def __init__(
        self,
        base: str = DEFAULT_BASE,
        *,
        vm_name: str | None = None,
        poll_interval_s: float = DEFAULT_POLL_S,
        timeout_s: float = 2.0,
        first_timeout_s: float = FIRST_CALL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.base = normalize_base(base)
        self.vm_name = vm_name
        self.base_interval_s = poll_interval_s
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self._first_timeout_s = first_timeout_s
        self._answered_once = False
        self._name_tried_at: float | None = None
        self._clock = clock
        self._wall = wall
        self._notices: dict[str, Notice] = {}  # EventId -> notice, deadline fixed at first sight
        self._current: Notice | None = None
        self._log = LogOnce(log)

    def poll(self) -> Notice | None:
        self._learn_vm_name()
        timeout = self.timeout_s if self._answered_once else self._first_timeout_s
        try:
            reply = request("GET", self.base + EVENTS_PATH, headers=HEADERS, timeout_s=timeout)
        except NetworkTrouble as exc:
            self._log("network", "spotwise: azure scheduled events unreachable (%s)", exc)
            return self._back_off()
        if reply.status != 200:
            self._log(
                f"status-{reply.status}",
                "spotwise: azure scheduled events answered %s; retrying with backoff",
                reply.status,
            )
            return self._back_off()
        self._answered_once = True
        try:
            _, events = parse_document(reply.body)
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            self._log("malformed", "spotwise: azure scheduled events unreadable (%s)", exc)
            return self._back_off()
        self.poll_interval_s = self.base_interval_s
        current = [self._notice_for(e) for e in events if self._is_mine(e)]
        self._current = most_urgent(current)
        return self._current

    def _back_off(self) -> Notice | None:
        self.poll_interval_s = min(max(self.poll_interval_s, 0.5) * 2, MAX_BACKOFF_S)
        return self._current

    def _is_mine(self, event: ScheduledEvent) -> bool:
        if self.vm_name is None:
            self._log(
                "no-name",
                "spotwise: azure VM name unknown; every scheduled event counts as ours "
                "(set SPOTWISE_AZURE_VM_NAME to filter)",
            )
            return True
        if self.vm_name in event.resources:
            return True
        self._log.info(
            f"other-{event.event_id}",
            "spotwise: azure %s event %s is for %s, not this VM (%s); ignored",
            event.event_type,
            event.event_id,
            ",".join(event.resources),
            self.vm_name,
        )
        return False

    def _notice_for(self, event: ScheduledEvent) -> Notice | None:
        known = self._notices.get(event.event_id)
        if known is not None:
            return known
        now, wall_now = self._clock(), self._wall()
        if event.event_type in TERMINATE_TYPES:
            if event.not_before is None or event.status == "Started":
                deadline = now
            else:
                deadline = deadline_from_wall(
                    event.not_before,
                    wall_now=wall_now,
                    mono_now=now,
                    nominal_s=TERMINATE_TYPES[event.event_type],
                )
            kind = NoticeKind.TERMINATE
            log.warning(
                "spotwise: azure %s event %s; %.0f s left",
                event.event_type,
                event.event_id,
                deadline - now,
            )
        else:
            if event.event_type not in ADVISORY_TYPES:
                self._log(
                    f"type-{event.event_type}",
                    "spotwise: unknown azure event type %r; treated as advisory",
                    event.event_type,
                )
            kind, deadline = NoticeKind.ADVISORY, None
        notice = Notice(
            source=self.name,
            kind=kind,
            received_monotonic=now,
            deadline_monotonic=deadline,
            action=event.event_type,
            detail={"event_id": event.event_id},
        )
        self._notices[event.event_id] = notice
        return notice

    def _learn_vm_name(self) -> None:
        now = self._clock()
        if self.vm_name is not None or (
            self._name_tried_at is not None and now - self._name_tried_at < 30.0
        ):
            return
        self._name_tried_at = now
        try:
            reply = request("GET", self.base + NAME_PATH, headers=HEADERS, timeout_s=self.timeout_s)
        except NetworkTrouble as exc:
            self._log("name", "spotwise: azure VM name not available yet (%s)", exc)
            return
        if reply.status == 200 and reply.text:
            self.vm_name = reply.text

    def acknowledge(self, notice: Notice) -> None:
        """Start the event now that our checkpoint is safe (``StartRequests``)."""
        event_id = notice.detail.get("event_id")
        if not event_id or not notice.is_terminate:
            return
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        try:
            reply = request(
                "POST",
                self.base + EVENTS_PATH,
                headers={**HEADERS, "Content-Type": "application/json"},
                body=body,
                timeout_s=self.timeout_s,
            )
        except NetworkTrouble as exc:
            self._log("ack", "spotwise: azure acknowledgement of %s failed (%s)", event_id, exc)
            return
        if reply.status != 200:
            self._log(
                "ack-status",
                "spotwise: azure acknowledgement of %s answered %s",
                event_id,
                reply.status,
            )
        else:
            log.info("spotwise: azure event %s acknowledged", event_id)

    def close(self) -> None:
        """Nothing held between polls."""


def probe(base: str, timeout_s: float) -> bool:
    """Azure is confirmed by ``/metadata/versions`` answering with ``apiVersions``."""
    try:
        reply = request(
            "GET", normalize_base(base) + "/metadata/versions", headers=HEADERS, timeout_s=timeout_s
        )
        return reply.status == 200 and "apiVersions" in json.loads(reply.body)
    except (NetworkTrouble, ValueError, TypeError):
        return False


def detectors(base: str, env: Mapping[str, str]) -> list[Detector]:
    name = settings.AZURE_VM_NAME.text(env)
    return [AzureDetector(base, vm_name=name)]


PLATFORM = CloudPlatform(
    name="azure",
    override_var=settings.AZURE_METADATA_ENDPOINT.name,
    default_base=DEFAULT_BASE,
    base_from_override=normalize_base,
    probe=probe,
    detectors=detectors,
)
