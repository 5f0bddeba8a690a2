"""A loopback AWS EC2 instance metadata service (IMDSv1 + IMDSv2) that can announce a spot
interruption, for rehearsals and tests.

Follows real IMDS where the AWS mock (AEMM) differs: the instance-action ``time`` is fixed when
the notice appears (not recomputed per request) and any number of clients may ask. It also
answers the identity paths the official SDKs read (instance type, placement, the instance
identity document), so botocore finds its region here and the ``ec2-metadata`` package works:
an emulator that a real client rejects rehearses nothing.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import datetime, timezone

from spotwise.emulators._server import LoopbackEmulator, Request, Response, json_body

ACTIONS = ("terminate", "stop", "hibernate")
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
NOT_FOUND = (
    b'<?xml version="1.0" encoding="iso-8859-1"?>\n'
    b'<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
    b'\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
    b'<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n'
    b" <head>\n  <title>404 - Not Found</title>\n </head>\n <body>\n"
    b"  <h1>404 - Not Found</h1>\n </body>\n</html>\n"
)


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class AwsImdsEmulator(LoopbackEmulator):
    """``AwsImdsEmulator(port=0).start()`` -> ``"http://127.0.0.1:PORT"``; point
    ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` at it.

    ``notice_after``: seconds until ``spot/instance-action`` appears (None: only on
    :meth:`trigger_notice`). ``lead_s``: the action ``time`` is that far after the notice
    appears (AWS: 120; negative = a notice in the past; hibernate always has no lead).
    ``rebalance_after``: seconds until the rebalance recommendation appears.
    ``imdsv2_required``: a GET without a token gets 401 (``HttpTokens=required``).
    """

    platform = "aws"

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        notice_after: float | None = None,
        action: str = "terminate",
        lead_s: float = 120.0,
        rebalance_after: float | None = None,
        imdsv2_required: bool = False,
        instance_id: str = "i-0a1b2c3d4e5f67890",
        instance_type: str = "p3.2xlarge",
        region: str = "us-east-1",
        zone: str | None = None,
        ami_id: str = "ami-0abcdef1234567890",
        clock_skew_s: float = 0.0,
        hang_s: float = 60.0,
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(f"unknown spot action {action!r}; use one of {ACTIONS}")
        zone = zone or f"{region}a"
        if not zone.startswith(region) or len(zone) <= len(region):
            raise ValueError(f"zone {zone!r} is not a zone of region {region!r} (e.g. {region}a)")
        self.action = action
        self.instance_type = instance_type
        self.region = region
        self.zone = zone
        self.ami_id = ami_id
        self.pending_time = _iso(time.time())
        self.lead_s = lead_s
        self.imdsv2_required = imdsv2_required
        self.instance_id = instance_id
        self._tokens: dict[str, float] = {}  # token -> monotonic expiry
        self._action_body: bytes | None = None
        self._action_time = ""
        self._rebalance_body: bytes | None = None
        super().__init__(
            port, host, notice_after=notice_after, clock_skew_s=clock_skew_s, hang_s=hang_s
        )
        if rebalance_after is not None:
            self.schedule_rebalance(rebalance_after)

    # --- scheduling ---------------------------------------------------------------------------
    def on_notice(self) -> None:
        lead = 0.0 if self.action == "hibernate" else self.lead_s
        self._action_time = _iso(self.now_wall() + lead)
        doc = {"action": self.action, "time": self._action_time}
        self._action_body = json_body(doc).replace(b",", b", ").replace(b'":', b'": ')

    def schedule_rebalance(self, after_s: float) -> None:
        timer = threading.Timer(max(after_s, 0.0), self._rebalance_due)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def trigger_rebalance(self) -> None:
        self._rebalance_due()

    def _rebalance_due(self) -> None:
        with self._lock:
            self._rebalance_body = b'{"noticeTime": "' + _iso(self.now_wall()).encode() + b'"}'

    def expire_tokens(self) -> None:
        """Invalidate every session token (the next GET with one gets 401)."""
        with self._lock:
            self._tokens.clear()

    # --- protocol -----------------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        if request.method == "PUT":
            return self._put_token(request)
        if request.method != "GET":
            return Response(405, b"", {"Allow": "GET, PUT"})
        token = request.header(TOKEN_HEADER)
        if token is not None:
            with self._lock:
                expiry = self._tokens.get(token)
            if expiry is None or time.monotonic() >= expiry:
                return Response(401, b"", {"Content-Type": "text/plain"})
        elif self.imdsv2_required:
            return Response(401, b"", {"Content-Type": "text/plain"})
        value = self._value(request.path)
        if value is None:
            return Response(404, NOT_FOUND, {"Content-Type": "text/html"})
        return Response(200, value, {"Content-Type": "text/plain"})

    def _put_token(self, request: Request) -> Response:
        if request.header("X-Forwarded-For") is not None:
            return Response(403, b"", {"Content-Type": "text/plain"})
        if request.path != "/latest/api/token":
            return Response(403, b"", {"Content-Type": "text/plain"})
        raw = request.header(TTL_HEADER)
        if raw is None or not raw.strip().isdigit() or not 1 <= int(raw) <= 21600:
            return Response(400, b"", {"Content-Type": "text/plain"})
        ttl = int(raw)
        token = secrets.token_urlsafe(42)
        with self._lock:
            self._tokens[token] = time.monotonic() + ttl
        return Response(200, token.encode(), {"Content-Type": "text/plain", TTL_HEADER: str(ttl)})

    def _value(self, path: str) -> bytes | None:
        """A leaf (also with the trailing ``/`` botocore sends) or a directory listing."""
        if path == "/":
            return b"latest"
        leaves = self._leaves()
        key = path.removeprefix("/")
        if key.rstrip("/") in leaves:
            return leaves[key.rstrip("/")]
        if not key.endswith("/"):
            return None
        children = {k[len(key) :].partition("/") for k in leaves if k.startswith(key)}
        listing = sorted(head + ("/" if sep else "") for head, sep, _ in children)
        return "\n".join(listing).encode() if listing else None

    def _leaves(self) -> dict[str, bytes]:
        """Every path this instance answers now, as IMDS documents them (relative to ``/``)."""
        visible = self.notice_visible()
        with self._lock:
            action = self._action_body if visible else None
            rebalance = self._rebalance_body
        meta = "latest/meta-data/"
        ip = "10.0.0.12"
        domain = "ec2.internal" if self.region == "us-east-1" else f"{self.region}.compute.internal"
        hostname = f"ip-{ip.replace('.', '-')}.{domain}".encode()
        leaves = {
            meta + "ami-id": self.ami_id.encode(),
            meta + "hostname": hostname,
            meta + "local-hostname": hostname,
            meta + "local-ipv4": ip.encode(),
            meta + "instance-id": self.instance_id.encode(),
            meta + "instance-type": self.instance_type.encode(),
            meta + "instance-life-cycle": b"spot",
            meta + "placement/availability-zone": self.zone.encode(),
            meta + "placement/region": self.region.encode(),
            "latest/dynamic/instance-identity/document": self._identity_document(ip),
        }
        if action is not None:
            leaves[meta + "spot/instance-action"] = action
            leaves[meta + "spot/termination-time"] = self._action_time.encode()
        if rebalance is not None:
            leaves[meta + "events/recommendations/rebalance"] = rebalance
        return leaves

    def _identity_document(self, ip: str) -> bytes:
        """The JSON document of ``dynamic/instance-identity/document`` (unsigned here)."""
        doc = {
            "accountId": "123456789012",
            "architecture": "x86_64",
            "availabilityZone": self.zone,
            "billingProducts": None,
            "devpayProductCodes": None,
            "marketplaceProductCodes": None,
            "imageId": self.ami_id,
            "instanceId": self.instance_id,
            "instanceType": self.instance_type,
            "kernelId": None,
            "pendingTime": self.pending_time,
            "privateIp": ip,
            "ramdiskId": None,
            "region": self.region,
            "version": "2017-09-30",
        }
        return json.dumps(doc, indent=2).encode()
