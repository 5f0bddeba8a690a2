"""AWS EC2 spot notices from the instance metadata service (IMDS).

IMDSv2 first (a session token from ``PUT /latest/api/token``), IMDSv1 as the fallback when the
token PUT does not answer (hop limit 1 seen from a container) or is refused. Polls
``spot/instance-action`` (terminate/stop/hibernate, 2 minutes ahead) and
``events/recommendations/rebalance`` (advisory). The presence of instance-action is the signal,
so a reply we cannot parse still counts as a termination with the nominal 2-minute deadline.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone

from spotwise import settings
from spotwise.errors import NoticeError
from spotwise.notices.base import (
    CloudPlatform,
    Detector,
    LogOnce,
    Notice,
    NoticeKind,
    deadline_from_wall,
)
from spotwise.notices.http import NetworkTrouble, Reply, normalize_base, request

log = logging.getLogger("spotwise.notices")

DEFAULT_BASE = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_TTL_S = 21600
NOMINAL_NOTICE_S = 120.0  # AWS gives 2 minutes before stop/terminate
DEFAULT_POLL_S = 1.0  # AWS suggests every 5 s; 1 s (2 local GETs) keeps detection under 1 s
MAX_BACKOFF_S = 30.0
V1_RETRY_TOKEN_AFTER_S = 300.0
ACTIONS = ("terminate", "stop", "hibernate")


def parse_time(text: str) -> float:
    """``"2017-09-18T08:22:00Z"`` -> POSIX seconds (UTC)."""
    text = text.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def parse_instance_action(body: bytes) -> tuple[str, float]:
    """``{"action": "terminate", "time": "..."}`` -> ``("terminate", posix)``; ValueError if bad."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("action"), str):
        raise ValueError("instance-action has no 'action' string")
    if not isinstance(doc.get("time"), str):
        raise ValueError("instance-action has no 'time' string")
    return doc["action"].lower(), parse_time(doc["time"])


def parse_rebalance(body: bytes) -> float:
    """``{"noticeTime": "..."}`` -> POSIX seconds; ValueError if bad."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("noticeTime"), str):
        raise ValueError("rebalance recommendation has no 'noticeTime' string")
    return parse_time(doc["noticeTime"])


class _Skip(Exception):
    """This poll could not get an answer; keep the last state and back off."""


class AwsDetector:
    name = "aws"

    def __init__(
        self,
        base: str = DEFAULT_BASE,
        *,
        poll_interval_s: float = DEFAULT_POLL_S,
        timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.base = normalize_base(base)
        self.base_interval_s = poll_interval_s
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._wall = wall
        self._token: str | None = None
        self._token_expiry = 0.0
        self._v1_until = 0.0  # use IMDSv1 until then (token PUT timed out or was refused)
        self._terminate: Notice | None = None
        self._advisory: Notice | None = None
        self._advisory_body: bytes | None = None
        self._log = LogOnce(log)

    # --- Detector ---------------------------------------------------------------------------
    def poll(self) -> Notice | None:
        if self._terminate is not None:
            return self._terminate  # the instance is going away; nothing can cancel that
        try:
            action = self._get(ACTION_PATH)
            if action is None:
                self._update_advisory(self._get(REBALANCE_PATH))
        except _Skip:
            self.poll_interval_s = min(self.poll_interval_s * 2, MAX_BACKOFF_S)
            return self._advisory
        self.poll_interval_s = self.base_interval_s
        if action is not None:
            self._terminate = self._terminate_notice(action.body)
            return self._terminate
        return self._advisory

    def acknowledge(self, notice: Notice) -> None:
        """IMDS has nothing to acknowledge."""

    def close(self) -> None:
        """Nothing held between polls."""

    # --- notices ----------------------------------------------------------------------------
    def _terminate_notice(self, body: bytes) -> Notice:
        now, wall_now = self._clock(), self._wall()
        try:
            action, when = parse_instance_action(body)
        except (ValueError, UnicodeDecodeError) as exc:
            self._log(
                "bad-action",
                "spotwise: aws instance-action is present but unreadable (%s); assuming "
                "termination in %.0f s",
                exc,
                NOMINAL_NOTICE_S,
            )
            action, when = "terminate", wall_now + NOMINAL_NOTICE_S
        if action not in ACTIONS:
            self._log("unknown-action", "spotwise: unknown aws spot action %r; saving", action)
        if action == "hibernate":
            deadline = now  # hibernation notices come with no lead time
        else:
            deadline = deadline_from_wall(
                when, wall_now=wall_now, mono_now=now, nominal_s=NOMINAL_NOTICE_S
            )
        log.warning("spotwise: aws spot %s notice; %.0f s left", action, max(deadline - now, 0.0))
        return Notice(
            source=self.name,
            kind=NoticeKind.TERMINATE,
            received_monotonic=now,
            deadline_monotonic=deadline,
            action=action,
            detail={"body": body.decode("utf-8", errors="replace")[:512]},
        )

    def _update_advisory(self, reply: Reply | None) -> None:
        if reply is None:
            self._advisory, self._advisory_body = None, None
            return
        if reply.body == self._advisory_body:
            return
        try:
            parse_rebalance(reply.body)
        except (ValueError, UnicodeDecodeError) as exc:
            self._log("bad-rebalance", "spotwise: aws rebalance body unreadable (%s)", exc)
        self._log.info("rebalance", "spotwise: aws rebalance recommendation (advisory)")
        self._advisory_body = reply.body
        self._advisory = Notice(
            source=self.name,
            kind=NoticeKind.ADVISORY,
            received_monotonic=self._clock(),
            deadline_monotonic=None,
            action="rebalance",
            detail={"body": reply.text[:512]},
        )

    # --- IMDS protocol ----------------------------------------------------------------------
    def _get(self, path: str) -> Reply | None:
        """The reply for 200, None for 404; raises _Skip for anything else."""
        reply = self._send_get(path, self._session_token())
        if reply.status == 401:  # token expired or required: get a fresh one, once
            self._token, self._v1_until = None, 0.0
            reply = self._send_get(path, self._session_token())
        if reply.status == 200:
            return reply
        if reply.status == 404:
            return None
        self._log(
            f"status-{reply.status}",
            "spotwise: aws metadata answered %s for %s; retrying with backoff",
            reply.status,
            path,
        )
        raise _Skip

    def _send_get(self, path: str, token: str | None) -> Reply:
        headers = {"X-aws-ec2-metadata-token": token} if token else {}
        try:
            return request("GET", self.base + path, headers=headers, timeout_s=self.timeout_s)
        except NetworkTrouble as exc:
            self._log("network", "spotwise: aws metadata unreachable (%s)", exc)
            raise _Skip from None

    def _session_token(self) -> str | None:
        now = self._clock()
        if self._token is not None and now < self._token_expiry:
            return self._token
        if now < self._v1_until:
            return None
        try:
            reply = request(
                "PUT",
                self.base + TOKEN_PATH,
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
                timeout_s=self.timeout_s,
            )
        except NetworkTrouble as exc:
            self._log(
                "token-timeout",
                "spotwise: IMDSv2 token request failed (%s; from a container the hop limit "
                "may be 1); falling back to IMDSv1",
                exc,
            )
            self._v1_until = now + V1_RETRY_TOKEN_AFTER_S
            return None
        if reply.status == 200 and reply.text:
            ttl = _int(reply.headers.get("x-aws-ec2-metadata-token-ttl-seconds"), TOKEN_TTL_S)
            self._token = reply.text
            self._token_expiry = now + max(1.0, ttl * 0.9)  # renew before it expires
            return self._token
        self._log(
            f"token-{reply.status}",
            "spotwise: IMDSv2 token request answered %s; trying IMDSv1",
            reply.status,
        )
        if reply.status in (403, 404, 405):
            self._v1_until = now + V1_RETRY_TOKEN_AFTER_S
        return None


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def probe(base: str, timeout_s: float) -> bool:
    """Is there an AWS IMDS at ``base``? The token PUT; on timeout an IMDSv1 instance-id GET."""
    base = normalize_base(base)
    try:
        reply = request(
            "PUT",
            base + TOKEN_PATH,
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
            timeout_s=timeout_s,
        )
        if reply.status == 200 and reply.body:
            return True
    except NetworkTrouble as exc:
        if "timed out" not in str(exc) and "timeout" not in str(exc).lower():
            return False  # refused / unreachable: no IMDS here
    try:
        reply = request("GET", base + "/latest/meta-data/instance-id", timeout_s=timeout_s)
    except NetworkTrouble:
        return False
    return reply.status == 200 and reply.text.startswith("i-")


def detectors(base: str, env: Mapping[str, str]) -> list[Detector]:
    interval = settings.AWS_POLL_S.seconds(env, DEFAULT_POLL_S, error=NoticeError)
    return [AwsDetector(base, poll_interval_s=max(interval, 0.05))]


PLATFORM = CloudPlatform(
    name="aws",
    override_var="AWS_EC2_METADATA_SERVICE_ENDPOINT",
    default_base=DEFAULT_BASE,
    base_from_override=normalize_base,
    probe=probe,
    detectors=detectors,
)
