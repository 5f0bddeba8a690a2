"""A loopback Azure Instance Metadata Service speaking Scheduled Events: one event (Preempt by
default) for this VM or another, RFC 1123 ``NotBefore``, acknowledgement by ``StartRequests``,
the ``Metadata: true`` header rule and the 5 requests/s limit.

It also serves the instance document, ``/metadata/instance?api-version=...``, with the
``compute`` fields clients read to learn where they run (location, vmId, vmSize, zone,
priority...) and ``network``; any node of it by path (``/metadata/instance/compute/vmSize``),
leaves only with ``format=text`` as the real service requires.
"""

from __future__ import annotations

import json
import time
import uuid
from email.utils import formatdate

from spotwise.emulators._faults import RateLimit
from spotwise.emulators._server import LoopbackEmulator, Request, Response, json_body

INSTANCE = "/metadata/instance"
EVENT_TYPES = ("Preempt", "Terminate", "Reboot", "Redeploy", "Freeze")
DURATIONS = {"Preempt": -1, "Terminate": -1, "Reboot": -1, "Redeploy": -1, "Freeze": 9}


class AzureScheduledEventsEmulator(LoopbackEmulator):
    """``AzureScheduledEventsEmulator(port=0).start()`` -> base URL; set
    ``SPOTWISE_AZURE_METADATA_ENDPOINT`` to it.

    ``notice_after``: seconds until the event is scheduled; ``lead_s``: its ``NotBefore`` is that
    far after it appears (Preempt: 30; negative = already past). ``resources``: the VMs it names
    (default: this VM, ``vm_name``). ``rate_limit_per_s``: above it, 429 (0 = no limit).
    """

    platform = "azure"

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        notice_after: float | None = None,
        event_type: str = "Preempt",
        lead_s: float = 30.0,
        vm_name: str = "spotwise-vm",
        resources: list[str] | None = None,
        location: str = "eastus",
        vm_size: str = "Standard_NC6s_v3",
        zone: str = "1",
        vm_id: str = "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
        rate_limit_per_s: int = 5,
        clock_skew_s: float = 0.0,
        hang_s: float = 60.0,
    ) -> None:
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {event_type!r}; use one of {EVENT_TYPES}")
        self.event_type = event_type
        self.lead_s = lead_s
        self.vm_name = vm_name
        self.resources = resources if resources is not None else [vm_name]
        self.instance = _instance_document(vm_name, location, vm_size, zone, vm_id)
        self.rate_limit = RateLimit(rate_limit_per_s)
        self.incarnation = 1
        self.events: list[dict[str, object]] = []
        self.acknowledged: list[str] = []
        super().__init__(
            port, host, notice_after=notice_after, clock_skew_s=clock_skew_s, hang_s=hang_s
        )

    def on_notice(self) -> None:
        self.events.append(
            {
                "EventId": str(uuid.uuid4()).upper(),
                "EventType": self.event_type,
                "ResourceType": "VirtualMachine",
                "Resources": list(self.resources),
                "EventStatus": "Scheduled",
                "NotBefore": formatdate(self.now_wall() + self.lead_s, usegmt=True),
                "Description": "Virtual machine is being evicted from Azure Spot.",
                "EventSource": "Platform",
                "DurationInSeconds": DURATIONS[self.event_type],
            }
        )
        self.incarnation += 1

    def handle(self, request: Request) -> Response:
        plain = {"Content-Type": "application/json; charset=utf-8"}
        if request.header("X-Forwarded-For") is not None:
            return Response(403, json_body({"error": "Forwarded requests are not allowed"}), plain)
        if (request.header("Metadata") or "").lower() != "true":
            missing = {"error": "Bad request. Required metadata header not specified"}
            return Response(400, json_body(missing), plain)
        if self._throttled():
            return Response(429, json_body({"error": "Too many requests"}), plain)
        if request.path == "/metadata/versions":
            return Response(200, json_body({"apiVersions": ["2019-08-01", "2020-07-01"]}), plain)
        if "api-version" not in request.query:
            body: dict[str, object] = {
                "error": "Bad request. api-version was not specified in the request",
                "newest-versions": ["2020-07-01"],
            }
            return Response(400, json_body(body), plain)
        if request.path == INSTANCE or request.path.startswith(INSTANCE + "/"):
            return self._instance(request, plain)
        if request.path != "/metadata/scheduledevents":
            return Response(404, json_body({"error": "Not found"}), plain)
        if request.method == "POST":
            return self._start_requests(request.body, plain)
        with self._lock:
            doc = {"DocumentIncarnation": self.incarnation, "Events": list(self.events)}
        return Response(200, json_body(doc), plain)

    def _instance(self, request: Request, plain: dict[str, str]) -> Response:
        """A node of the instance document: JSON for objects and lists, text for leaves."""
        node: object = self.instance
        for part in request.path.removeprefix(INSTANCE).strip("/").split("/"):
            if not part:
                continue
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return Response(404, json_body({"error": "Not found"}), plain)
        text = request.query.get("format") == "text"
        if isinstance(node, (dict, list)):
            if text:
                return Response(
                    400,
                    json_body(
                        {"error": "Bad request. format=text is only supported for leaf nodes"}
                    ),
                    plain,
                )
            return Response(200, json_body(node), plain)
        if not text:
            return Response(
                400, json_body({"error": "Bad request. Leaf nodes require format=text"}), plain
            )
        return Response(200, str(node).encode(), {"Content-Type": "text/plain; charset=utf-8"})

    def _throttled(self) -> bool:
        with self._lock:
            return not self.rate_limit.admit(time.monotonic())

    def _start_requests(self, body: bytes, plain: dict[str, str]) -> Response:
        try:
            ids = [item["EventId"] for item in json.loads(body)["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return Response(400, json_body({"error": "Bad request. Malformed body"}), plain)
        with self._lock:
            known = {str(e["EventId"]): e for e in self.events}
            if not ids or any(i not in known for i in ids):
                return Response(400, json_body({"error": "Bad request. Unknown EventId"}), plain)
            for event_id in ids:
                known[event_id]["EventStatus"] = "Started"
                known[event_id]["NotBefore"] = ""
                self.acknowledged.append(event_id)
            self.incarnation += 1
        return Response(200, b"", plain)


def _instance_document(
    vm_name: str, location: str, vm_size: str, zone: str, vm_id: str
) -> dict[str, object]:
    """The parts of IMDS's instance document that tell a VM where and what it is."""
    subscription = "00000000-0000-0000-0000-000000000000"
    group = "spotwise-rg"
    return {
        "compute": {
            "azEnvironment": "AzurePublicCloud",
            "evictionPolicy": "Deallocate",
            "location": location,
            "name": vm_name,
            "osType": "Linux",
            "priority": "Spot",
            "provider": "Microsoft.Compute",
            "resourceGroupName": group,
            "resourceId": f"/subscriptions/{subscription}/resourceGroups/{group}/providers/"
            f"Microsoft.Compute/virtualMachines/{vm_name}",
            "subscriptionId": subscription,
            "tags": "",
            "vmId": vm_id,
            "vmScaleSetName": "",
            "vmSize": vm_size,
            "zone": zone,
        },
        "network": {
            "interface": [
                {
                    "ipv4": {
                        "ipAddress": [{"privateIpAddress": "10.0.0.4", "publicIpAddress": ""}],
                        "subnet": [{"address": "10.0.0.0", "prefix": "24"}],
                    },
                    "ipv6": {"ipAddress": []},
                    "macAddress": "000D3A1B2C3D",
                }
            ]
        },
    }
