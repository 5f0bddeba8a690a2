"""The one loopback HTTP server every emulator stands on, and what the platform emulators share
on top of it: a notice schedule, fault injection and a request log. Nothing here is shared with
the detectors, providers or stores they exercise."""

from __future__ import annotations

import http.server
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from spotwise.emulators._faults import Fault, take

FAULTS = ("hang", "malformed", "close")  # plus any HTTP status code, e.g. "503"


@dataclass
class Response:
    """An answer. ``stream``: a chunked body written as it comes (a watch); ``reset_after``: send
    this many bytes of ``body`` and then reset the connection (a body cut off halfway)."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stream: Callable[[Callable[[bytes], None]], None] | None = None
    reset_after: int | None = None


# Hang up without answering: "close" (FIN) or "reset" (RST, as a dying load balancer does).
Hangup = Literal["close", "reset"]


@dataclass
class Request:
    method: str
    path: str  # without the query
    query: dict[str, str]
    headers: dict[str, str]  # as sent (case-insensitive lookups via .header)
    body: bytes
    target: str = ""  # the request target as sent, query included

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


class LoopbackServer:
    """A threading HTTP server on a daemon thread that hands each parsed :class:`Request` to
    :meth:`serve`; subclasses answer with a :class:`Response` or hang up.

    ``stamp_headers``: add ``Server`` and ``Date`` to every answer (a proxy that forwards the
    upstream's own sets it False)."""

    server_name = "spotwise-loopback"
    stamp_headers = True

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self._stopping = threading.Event()
        self._server: http.server.ThreadingHTTPServer | None = None

    def serve(self, request: Request) -> Response | Hangup:
        raise NotImplementedError

    def start(self) -> str:
        """Bind and serve on a daemon thread; returns the base URL (``http://127.0.0.1:PORT``)."""
        self._server = _HttpServer((self.host, self.port), _make_handler(self))
        self.port = self._server.server_address[1]
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"spotwise-serve-{self.server_name}",
            daemon=True,
        ).start()
        return self.url

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class LoopbackEmulator(LoopbackServer):
    """Base of the platform emulators: schedule, faults, request log on the loopback server.

    Subclasses implement :meth:`handle` (and :meth:`malformed_body`) for their protocol.
    """

    platform = "?"

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        notice_after: float | None = None,
        clock_skew_s: float = 0.0,
        hang_s: float = 60.0,
    ) -> None:
        super().__init__(port, host)
        self.server_name = self.platform
        self.clock_skew_s = clock_skew_s  # this emulator's wall clock runs ahead by this much
        self.hang_s = hang_s
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status) served
        self.notice_visible_wall: float | None = None  # true wall time the notice appeared
        self._notice_at: float | None = None  # monotonic time the notice becomes visible
        self._faults: list[Fault] = []
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._timers: list[threading.Timer] = []
        if notice_after is not None:
            self.schedule_notice(notice_after)

    # --- lifecycle ----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        for timer in self._timers:
            timer.cancel()
        super().stop()

    def __enter__(self) -> LoopbackEmulator:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the notice ---------------------------------------------------------------------------
    def schedule_notice(self, after_s: float) -> None:
        """Make the notice visible ``after_s`` seconds from now (0 = immediately)."""
        with self._changed:
            self._notice_at = time.monotonic() + max(after_s, 0.0)
        timer = threading.Timer(max(after_s, 0.0), self._notice_due)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def trigger_notice(self) -> None:
        """Make the notice visible now."""
        self.schedule_notice(0.0)

    def notice_visible(self) -> bool:
        with self._lock:
            return self._notice_at is not None and time.monotonic() >= self._notice_at

    def _notice_due(self) -> None:
        with self._changed:
            if self.notice_visible_wall is None:
                self.notice_visible_wall = time.time()
            self.on_notice()
            self._changed.notify_all()

    def on_notice(self) -> None:
        """Hook: update the platform's state when the notice becomes visible (lock held)."""

    def now_wall(self) -> float:
        """The emulated platform's wall clock (``clock_skew_s`` ahead of this machine)."""
        return time.time() + self.clock_skew_s

    # --- faults -------------------------------------------------------------------------------
    def inject(self, fault: str | int, count: int | None = None, on: str = "") -> None:
        """Answer the next ``count`` requests (all when None) whose path contains ``on`` with a
        fault: an HTTP status (``503``), ``"hang"`` (no answer for ``hang_s``), ``"malformed"``
        (a broken body with status 200) or ``"close"`` (drop the connection)."""
        kind = str(fault)
        if kind not in FAULTS and not (kind.isdigit() and 100 <= int(kind) <= 599):
            raise ValueError(f"unknown fault {fault!r}; use an HTTP status or one of {FAULTS}")
        with self._lock:
            self._faults.append(Fault(kind, count, {"path": on}))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, path: str) -> str | None:
        with self._lock:
            fault = take(self._faults, {"path": path})
        return None if fault is None else fault.what

    # --- protocol -----------------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        raise NotImplementedError

    def malformed_body(self, request: Request) -> bytes:
        return b'{"truncated": '

    def count(self, path_part: str, status: int | None = None) -> int:
        """How many requests touched ``path_part`` (and answered ``status``)."""
        with self._lock:
            return sum(
                1
                for _, path, code in self.requests
                if path_part in path and (status is None or code == status)
            )

    def serve(self, request: Request) -> Response | Hangup:
        fault = self._take_fault(request.path)
        if fault == "hang":
            self._stopping.wait(self.hang_s)
            return "close"
        if fault == "close":
            return "close"
        response = self.handle(request)
        if fault == "malformed" and response.status == 200:
            response = Response(200, self.malformed_body(request), response.headers)
        elif fault is not None and fault.isdigit():
            response = Response(
                int(fault), _status_body(int(fault)), {"Content-Type": "text/plain"}
            )
        with self._lock:
            self.requests.append((request.method, request.path, response.status))
        return response


def _status_body(status: int) -> bytes:
    return f"{status} {http.HTTPStatus(status).phrase}\n".encode()


def json_body(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


class _HttpServer(http.server.ThreadingHTTPServer):
    """The standard threading server, quiet about clients that hang up mid-answer (a client
    timing out, a test ending): the emulated service would not print a traceback either."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection to a loopback server: requests as ``Request``, answered by its ``serve``."""

    protocol_version = "HTTP/1.1"
    loopback: LoopbackServer  # set per server by _make_handler
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default
        return

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        headers = dict(self.headers.items())
        request = Request(self.command, parts.path, query, headers, self._body(), self.path)
        answer = self.loopback.serve(request)
        if answer == "reset":
            self._reset()
        elif answer == "close":
            self.close_connection = True
        elif answer.stream is not None:
            self._stream(answer)
        else:
            self._send(answer)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""
        out = bytearray()
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            out += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return bytes(out)

    def _head(self, response: Response) -> None:
        if self.loopback.stamp_headers:
            self.send_response(response.status)
        else:
            self.send_response_only(response.status)
        for key, value in response.headers.items():
            self.send_header(key, value)

    def _send(self, response: Response) -> None:
        self._head(response)
        if "Content-Length" not in response.headers:  # a HEAD states the GET's length
            self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if response.reset_after is None:
            self.wfile.write(response.body)
            return
        self.wfile.write(response.body[: response.reset_after])
        self.wfile.flush()
        self._reset()

    def _stream(self, response: Response) -> None:
        assert response.stream is not None
        self._head(response)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            response.stream(chunk)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def _reset(self) -> None:
        """Close with RST (SO_LINGER 0), as a dying load balancer or a network cut does."""
        linger = struct.pack("ii", 1, 0)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        self.close_connection = True
        self.connection.close()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _dispatch


def _make_handler(server: LoopbackServer) -> type[http.server.BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"loopback": server, "server_version": server.server_name})
