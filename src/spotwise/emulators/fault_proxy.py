"""A loopback HTTP proxy that forwards to a moto server and injects faults on the wire.

boto3 talks to the proxy as if it were the service (``endpoint_url=proxy.url``); matching
requests get an error reply (S3's or EC2's XML, whichever protocol the request spoke), a
connection reset, a stall, or a body cut off halfway, exactly as a real service or network would
deliver them. Nothing in spotwise is patched. EC2's query API names the operation in the POST
body (``Action=RunInstances``), so faults can match on the body too.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class Fault:
    """Apply ``action`` to the next ``times`` requests matching method/path/query substrings.

    action: "status" (reply ``status`` with S3 error ``code``), "reset" (drop the connection
    without a reply), "stall" (hold the request ``stall_s`` seconds, then drop it), "cut_body"
    (forward, then send only half of the response body and reset).
    """

    action: str
    method: str | None = None
    path_contains: str = ""
    query_contains: str = ""
    times: int = 1
    status: int = 503
    code: str = "SlowDown"
    stall_s: float = 5.0
    hits: int = 0
    body_contains: str = ""
    message: str = "injected by the fault proxy"

    def matches(self, method: str, path: str, query: str, body: str = "") -> bool:
        return (
            self.hits < self.times
            and (self.method is None or self.method == method)
            and self.path_contains in path
            and self.query_contains in query
            and self.body_contains in body
        )


@dataclass
class Seen:
    method: str
    path: str
    query: str
    fault: str | None


@dataclass
class FaultProxy:
    upstream: str
    require_access_key: str | None = None  # reply 403 InvalidAccessKeyId to any other key
    faults: list[Fault] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

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
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path, query, body):
                    fault.hits += 1
                    self.seen.append(Seen(method, path, query, fault.action))
                    return fault
            self.seen.append(Seen(method, path, query, None))
            return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        return

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length", 0) or 0)
        return self.rfile.read(length) if length else b""

    def _reset(self) -> None:
        """Close with RST (SO_LINGER 0), as a dying load balancer or a network cut does."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _handle(self) -> None:
        split = urlsplit(self.path)
        body = self._body()
        owner = self.owner
        text = body[:4096].decode("latin-1")
        if owner.require_access_key is not None:
            auth = self.headers.get("Authorization", "")
            if f"Credential={owner.require_access_key}/" not in auth:
                owner.pick(self.command, split.path, "denied")
                ec2 = "Action=" in text  # EC2 says AuthFailure where S3 says InvalidAccessKeyId
                self._reply_error(403, "AuthFailure" if ec2 else "InvalidAccessKeyId",
                                  "The AWS Access Key Id you provided does not exist in our "
                                  "records.", ec2=ec2)  # fmt: skip
                return
        fault = owner.pick(self.command, split.path, split.query, text)
        if fault is not None and fault.action == "status":
            self._reply_error(fault.status, fault.code, fault.message, ec2="Action=" in text)
            return
        if fault is not None and fault.action == "reset":
            self._reset()
            return
        if fault is not None and fault.action == "stall":
            time.sleep(fault.stall_s)
            self._reset()
            return
        status, headers, payload = self._forward(body)
        self.send_response_only(status)
        for name, value in headers:
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
            elif name.lower() == "content-length" and self.command == "HEAD":
                self.send_header(name, value)  # HEAD announces the object's size, sends no body
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if fault is not None and fault.action == "cut_body" and self.command != "HEAD":
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self._reset()
            return
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        up = urlsplit(self.owner.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
            if body or "Content-Length" in headers:
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    def _reply_error(self, status: int, code: str, message: str, ec2: bool = False) -> None:
        error = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
        payload = (
            f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors>{error}</Errors>'
            "<RequestID>fault-proxy</RequestID></Response>"
            if ec2
            else f'<?xml version="1.0" encoding="UTF-8"?>{error[:-8]}'
            "<RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
