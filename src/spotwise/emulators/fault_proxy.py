"""A loopback HTTP proxy that forwards to a moto server and injects faults on the wire.

boto3 talks to the proxy as if it were the service (``endpoint_url=proxy.url``); matching
requests get an error reply (S3's or EC2's XML, whichever protocol the request spoke), a
connection reset, a stall, or a body cut off halfway, exactly as a real service or network would
deliver them. Nothing in spotwise is patched. EC2's query API names the operation in the POST
body (``Action=RunInstances``), so faults can match on the body too.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from spotwise.emulators import _faults
from spotwise.emulators._server import Hangup, LoopbackServer, Request, Response


@dataclass
class Fault(_faults.Fault):
    """Apply ``what`` to the next ``times`` requests matching method/path/query/body substrings.

    what: "status" (reply ``status`` with S3 error ``code``), "reset" (drop the connection
    without a reply), "stall" (hold the request ``stall_s`` seconds, then drop it), "cut_body"
    (forward, then send only half of the response body and reset).
    """

    method: str | None = None
    path_contains: str = ""
    query_contains: str = ""
    status: int = 503
    code: str = "SlowDown"
    stall_s: float = 5.0
    body_contains: str = ""
    message: str = "injected by the fault proxy"

    def __post_init__(self) -> None:
        self.where = {
            "path": self.path_contains,
            "query": self.query_contains,
            "body": self.body_contains,
        }
        if self.method is not None:
            self.where["method"] = f"<{self.method}>"  # the whole method, not a part of it


@dataclass
class Seen:
    method: str
    path: str
    query: str
    fault: str | None


@dataclass(eq=False)
class FaultProxy(LoopbackServer):
    upstream: str
    require_access_key: str | None = None  # reply 403 InvalidAccessKeyId to any other key
    faults: list[Fault] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    server_name = "fault-proxy"
    stamp_headers = False  # the upstream's own Server and Date pass through

    def __post_init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.start()

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.seen.clear()

    def count(self, method: str, path_contains: str = "", query_contains: str = "") -> int:
        with self._lock:
            return sum(
                1
                for s in self.seen
                if s.method == method and path_contains in s.path and query_contains in s.query
            )

    def pick(self, method: str, path: str, query: str, body: str = "") -> Fault | None:
        fields = {"method": f"<{method}>", "path": path, "query": query, "body": body}
        with self._lock:
            fault = _faults.take(self.faults, fields)
            self.seen.append(Seen(method, path, query, None if fault is None else fault.what))
            return fault

    def close(self) -> None:
        self.stop()

    def serve(self, request: Request) -> Response | Hangup:
        text = request.body[:4096].decode("latin-1")
        ec2 = "Action=" in text  # EC2 names the operation in the body and answers its own XML
        if self.require_access_key is not None:
            auth = request.header("Authorization") or ""
            if f"Credential={self.require_access_key}/" not in auth:
                self.pick(request.method, request.path, "denied")
                return _error(403, "AuthFailure" if ec2 else "InvalidAccessKeyId",
                              "The AWS Access Key Id you provided does not exist in our "
                              "records.", ec2=ec2)  # fmt: skip
        fault = self.pick(request.method, request.path, urlsplit(request.target).query, text)
        if fault is not None and fault.what == "status":
            return _error(fault.status, fault.code, fault.message, ec2=ec2)
        if fault is not None and fault.what == "reset":
            return "reset"
        if fault is not None and fault.what == "stall":
            self._stopping.wait(fault.stall_s)
            return "reset"
        status, upstream_headers, payload = self._forward(request)
        headers: dict[str, str] = {}
        for name, value in upstream_headers:
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                headers[name] = value
            elif name.lower() == "content-length" and request.method == "HEAD":
                headers["Content-Length"] = value  # HEAD announces the object's size, no body
        cut = fault is not None and fault.what == "cut_body"
        return Response(status, payload, headers, reset_after=len(payload) // 2 if cut else None)

    def _forward(self, request: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=60)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "transfer-encoding"}
            if request.body or "Content-Length" in headers:
                headers["Content-Length"] = str(len(request.body))
            conn.request(request.method, request.target, body=request.body, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()


def _error(status: int, code: str, message: str, ec2: bool) -> Response:
    """S3's error document, or EC2's (``<Response><Errors>``) for a query-API request."""
    error = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    payload = (
        f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors>{error}</Errors>'
        "<RequestID>fault-proxy</RequestID></Response>"
        if ec2
        else f'<?xml version="1.0" encoding="UTF-8"?>{error[:-8]}'
        "<RequestId>fault-proxy</RequestId></Error>"
    ).encode()
    return Response(status, payload, {"Content-Type": "application/xml"})
