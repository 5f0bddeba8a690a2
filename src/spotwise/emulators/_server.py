"""What the three emulators share: a loopback threading HTTP server, a notice schedule, fault
injection and a request log. Nothing here is shared with the detectors they exercise."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

FAULTS = ("hang", "malformed", "close")  # plus any HTTP status code, e.g. "503"


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    method: str
    path: str  # without the query
    query: dict[str, str]
    headers: dict[str, str]  # as sent (case-insensitive lookups via .get_header)
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


@dataclass
class _Fault:
    kind: str
    remaining: int | None  # None: forever
    on: str  # path substring it applies to ("" = every request)


class LoopbackEmulator:
    """Base of the platform emulators: start/stop, URL, schedule, faults, request log.

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
        self.host = host
        self.port = port
        self.clock_skew_s = clock_skew_s  # this emulator's wall clock runs ahead by this much
        self.hang_s = hang_s
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status) served
        self.notice_visible_wall: float | None = None  # true wall time the notice appeared
        self._notice_at: float | None = None  # monotonic time the notice becomes visible
        self._faults: list[_Fault] = []
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        if notice_after is not None:
            self.schedule_notice(notice_after)

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> str:
        """Bind and serve on a daemon thread; returns the base URL (``http://127.0.0.1:PORT``)."""
        handler = _make_handler(self)
        self._server = http.server.ThreadingHTTPServer((self.host, self.port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"spotwise-emulate-{self.platform}",
            daemon=True,
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        for timer in self._timers:
            timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LoopbackEmulator:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
            self._faults.append(_Fault(kind, count, on))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, path: str) -> str | None:
        with self._lock:
            for fault in self._faults:
                if fault.on in path and (fault.remaining is None or fault.remaining > 0):
                    if fault.remaining is not None:
                        fault.remaining -= 1
                    return fault.kind
        return None

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

    def _serve(self, request: Request, send: Callable[[Response], None]) -> str | None:
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
        send(response)
        return None


def _status_body(status: int) -> bytes:
    return f"{status} {http.HTTPStatus(status).phrase}\n".encode()


def json_body(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _make_handler(emulator: LoopbackEmulator) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = emulator.platform
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            return

        def _dispatch(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            request = Request(self.command, parts.path, query, dict(self.headers.items()), body)
            if emulator._serve(request, self._send) == "close":
                self.close_connection = True

        def _send(self, response: Response) -> None:
            self.send_response(response.status)
            for key, value in response.headers.items():
                self.send_header(key, value)
            if "Content-Length" not in response.headers:  # a HEAD states the GET's length
                self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _dispatch

    return Handler
