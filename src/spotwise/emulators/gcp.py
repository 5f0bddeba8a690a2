"""A loopback GCP Compute Engine metadata server that can preempt the "VM" or announce host
maintenance, with ``wait_for_change`` long-polls and ETags like the real one.

It answers what Google's own client library asks before anything else: ``/`` with 200 and
``Metadata-Flavor: Google`` (``google.auth.compute_engine._metadata.ping``, hence
``is_on_gce``), the instance's identity (id, name, zone, machine type, hostname), the project,
and the default service account (``?recursive=true`` JSON and an access token that is only
a placeholder), so ``google.auth.default()`` accepts it as a Compute Engine VM.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from spotwise.emulators._server import LoopbackEmulator, Request, Response, json_body

EVENTS = {
    "preempted": ("instance/preempted", "TRUE"),
    "maintenance-terminate": ("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE"),
    "maintenance-migrate": ("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE"),
}
PREFIX = "/computeMetadata/v1/"
MAX_WAIT_S = 3600.0
LISTS = ("scopes", "aliases")  # leaves whose text is one item per line, and a list in JSON
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
TOKEN_LIFETIME_S = 3599


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
        zone: str = "us-central1-a",
        machine_type: str = "n1-standard-8",
        project: str = "spotwise-project",
        project_number: str = "123456789012",
        hang_s: float = 60.0,
    ) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; use one of {', '.join(EVENTS)}")
        if not re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", zone):
            raise ValueError(f"zone {zone!r} is not a Compute Engine zone such as us-central1-a")
        self.event = event
        self.service_account = f"{project_number}-compute@developer.gserviceaccount.com"
        self._values = {
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/scheduling/preemptible": "TRUE" if preemptible else "FALSE",
            "instance/name": name,
            "instance/id": "4520031799277581759",
            "instance/zone": f"projects/{project_number}/zones/{zone}",
            "instance/machine-type": f"projects/{project_number}/machineTypes/{machine_type}",
            "instance/hostname": f"{name}.{zone}.c.{project}.internal",
            "project/project-id": project,
            "project/numeric-project-id": project_number,
        }
        for alias in ("default", self.service_account):
            account = f"instance/service-accounts/{alias}/"
            self._values[account + "email"] = self.service_account
            self._values[account + "aliases"] = "default\n"
            self._values[account + "scopes"] = "".join(f"{scope}\n" for scope in SCOPES)
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
        text = {**base, "Content-Type": "application/text"}
        if request.header("X-Forwarded-For") is not None:
            return Response(403, b"Request denied: X-Forwarded-For header present.\n", base)
        if request.path == "/":  # how clients detect a VM; answered before the header rule
            return Response(200, b"computeMetadata/\n", text)
        if request.header("Metadata-Flavor") != "Google":
            body = b"Missing required header: Metadata-Flavor: Google\n"
            return Response(403, body, {**base, "Content-Type": "text/html"})
        if request.method != "GET":
            return Response(405, b"", base)
        if request.path == "/computeMetadata/":
            return Response(200, b"v1/\n", text)
        key = request.path.removeprefix(PREFIX) if request.path != PREFIX.rstrip("/") else ""
        as_json = (
            request.query.get("alt") == "json"
            or request.query.get("recursive", "").lower() == "true"
        )
        with self._changed:
            token = self._token(key)
            if token is not None:
                return Response(200, json_body(token), {**base, "Content-Type": "application/json"})
            if key in self._values:
                if request.query.get("wait_for_change", "").lower() == "true":
                    self._wait(key, request)
                value, etag = self._values[key], self._etag(key)
                if as_json:
                    body = json_body(_leaf_json(key, value))
                    return Response(200, body, {**base, "Content-Type": "application/json"})
                return Response(200, value.encode(), {**text, "ETag": etag})
            tree = self._subtree(key)
        if tree is None:
            return Response(404, b"Not Found\n", {**base, "Content-Type": "text/html"})
        if as_json:
            return Response(200, json_body(tree), {**base, "Content-Type": "application/json"})
        listing = "".join(
            f"{name}/\n" if isinstance(sub, dict) else f"{name}\n"
            for name, sub in self._children(key).items()
        )
        return Response(200, listing.encode(), text)

    def _children(self, key: str) -> dict[str, object]:
        """Direct children of a directory, as their path names: a dict for a subdirectory."""
        prefix = key.rstrip("/") + "/" if key else ""
        children: dict[str, object] = {}
        for path in sorted(self._values):
            if path.startswith(prefix):
                head, sep, _ = path[len(prefix) :].partition("/")
                children[head] = {} if sep else path
        return children

    def _subtree(self, key: str) -> dict[str, object] | None:
        """A directory as the real server renders ``?recursive=true``: camelCase keys."""
        children = self._children(key)
        if not children:
            return None
        prefix = key.rstrip("/") + "/" if key else ""
        tree: dict[str, object] = {}
        for name, sub in children.items():
            value = (
                self._subtree(prefix + name)
                if isinstance(sub, dict)
                else _leaf_json(name, self._values[prefix + name])
            )
            tree[name if "@" in name else _camel(name)] = value
        return tree

    def _token(self, key: str) -> dict[str, object] | None:
        """An access token for the service account: a placeholder, never a credential."""
        match = re.fullmatch(r"instance/service-accounts/([^/]+)/token", key)
        if match is None or match.group(1) not in ("default", self.service_account):
            return None
        placeholder = "emulated-" + secrets.token_urlsafe(16)
        return {"access_token": placeholder, "expires_in": TOKEN_LIFETIME_S, "token_type": "Bearer"}

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


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(part.capitalize() for part in rest)


def _leaf_json(key: str, value: str) -> object:
    """A leaf in JSON: list leaves (scopes, aliases) become arrays, the rest strings."""
    if key.rsplit("/", 1)[-1] in LISTS:
        return value.splitlines()
    return value
