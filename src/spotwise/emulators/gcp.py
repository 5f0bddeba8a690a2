"""A loopback GCP Compute Engine metadata server that can preempt the "VM" or announce host
maintenance, with ``wait_for_change`` long-polls and ETags like the real one."""

from __future__ import annotations

import hashlib
import time

from spotwise.emulators._server import LoopbackEmulator, Request, Response

EVENTS = {
    "preempted": ("instance/preempted", "TRUE"),
    "maintenance-terminate": ("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE"),
    "maintenance-migrate": ("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE"),
}
PREFIX = "/computeMetadata/v1/"
MAX_WAIT_S = 3600.0


class GcpMetadataEmulator(LoopbackEmulator):
    """``GcpMetadataEmulator(port=0).start()`` -> base URL; set ``GCE_METADATA_HOST`` to its
    ``host:port`` (:attr:`host_port`).

    ``notice_after``: seconds until ``event`` happens: ``preempted`` (``instance/preempted``
    becomes TRUE), ``maintenance-terminate`` or ``maintenance-migrate``
    (``instance/maintenance-event``).
    """

    platform = "gcp"

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        notice_after: float | None = None,
        event: str = "preempted",
        name: str = "spotwise-vm",
        preemptible: bool = True,
        hang_s: float = 60.0,
    ) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; use one of {', '.join(EVENTS)}")
        self.event = event
        self._values = {
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/scheduling/preemptible": "TRUE" if preemptible else "FALSE",
            "instance/name": name,
            "instance/id": "4520031799277581759",
            "instance/zone": "projects/000000000000/zones/us-central1-a",
        }
        self._versions = dict.fromkeys(self._values, 0)
        super().__init__(port, host, notice_after=notice_after, hang_s=hang_s)

    @property
    def host_port(self) -> str:
        return f"{self.host}:{self.port}"

    def on_notice(self) -> None:
        key, value = EVENTS[self.event]
        self._set(key, value)

    def set_value(self, key: str, value: str) -> None:
        """Change a metadata value now (waiters are woken), e.g. maintenance back to NONE."""
        with self._changed:
            self._set(key, value)
            self._changed.notify_all()

    def _set(self, key: str, value: str) -> None:
        if self._values.get(key) != value:
            self._values[key] = value
            self._versions[key] = self._versions.get(key, 0) + 1

    def _etag(self, key: str) -> str:
        seed = f"{key}\0{self._versions[key]}\0{self._values[key]}".encode()
        return hashlib.sha1(seed).hexdigest()[:16]

    def handle(self, request: Request) -> Response:
        base = {"Metadata-Flavor": "Google", "Server": "Metadata Server for VM"}
        if request.header("X-Forwarded-For") is not None:
            return Response(403, b"Request denied: X-Forwarded-For header present.\n", base)
        if request.header("Metadata-Flavor") != "Google":
            body = b"Missing required header: Metadata-Flavor: Google\n"
            return Response(403, body, {**base, "Content-Type": "text/html"})
        if request.method != "GET":
            return Response(405, b"", base)
        if request.path in (PREFIX, PREFIX.rstrip("/")):
            return Response(
                200, b"instance/\nproject/\n", {**base, "Content-Type": "application/text"}
            )
        key = request.path.removeprefix(PREFIX)
        with self._changed:
            if key not in self._values:
                return Response(404, b"Not Found\n", {**base, "Content-Type": "text/html"})
            if request.query.get("wait_for_change", "").lower() == "true":
                self._wait(key, request)
            value, etag = self._values[key], self._etag(key)
        return Response(
            200, value.encode(), {**base, "Content-Type": "application/text", "ETag": etag}
        )

    def _wait(self, key: str, request: Request) -> None:
        """Block (lock held by the condition) until the value's ETag differs or time is up."""
        try:
            timeout = min(float(request.query.get("timeout_sec", MAX_WAIT_S)), MAX_WAIT_S)
        except ValueError:
            timeout = MAX_WAIT_S
        last = request.query.get("last_etag") or self._etag(key)
        end = time.monotonic() + timeout
        while self._etag(key) == last and not self._stopping.is_set():
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._changed.wait(remaining)
