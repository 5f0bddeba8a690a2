"""A loopback Azure Resource Manager for the subset the ``azure`` provider uses, with machines.

No public emulator of ARM's compute API can be installed, so this one serves what the official
``azure-mgmt-compute`` / ``azure-mgmt-network`` clients send (``base_url`` pointed here):

- virtual machines: PUT (a long-running operation answered with ``Azure-AsyncOperation``, polled
  as ARM is, ``Retry-After`` included), GET, ``instanceView``, list, DELETE (202 with
  ``Azure-AsyncOperation`` and ``Location``); disks, network interfaces and public IP
  addresses: list and DELETE; resource SKUs by location;
- ARM's rules: ``api-version`` required (400 ``MissingApiVersionParameter``), a bearer token
  required (401 ``AuthenticationFailed``), unknown resource groups 404 ``ResourceGroupNotFound``,
  errors as ``{"error": {"code", "message"}}``.

Every request body and every response body is checked against the SDK's own models
(``azure.mgmt.compute.models.VirtualMachine`` and friends, field by field, recursively): a
field the SDK does not know is a 400 for a request and a 500 for a response, so a double that
drifts from the API, or a provider that sends something ARM would not accept, fails loudly.

Each VM that provisions runs its ``osProfile.customData`` (base64, as cloud-init would) as a
local process in a root of its own (``machine_root``), pointed at its own Scheduled Events
service (``AzureScheduledEventsEmulator``). A Spot VM with ``interrupt_after_s`` gets a
``Preempt`` event, ``notice_lead_s`` later its machine is killed and, ``evictionPolicy: Delete``,
the VM goes away with the disks and NICs whose ``deleteOption`` is ``Delete``. A DELETE gives the
machine SIGTERM (the OS shutting down), ``stop_grace_s`` later SIGKILL. ``fail_next`` injects
``SkuNotAvailable`` / ``OperationNotAllowed`` (409, at once) or ``AllocationFailed`` /
``ZonalAllocationFailed`` (the operation fails, the VM stays ``Failed`` until deleted, as ARM
leaves it); ``inject`` (the base class) answers 429/5xx. It shares no code with the provider.
"""

from __future__ import annotations

import base64
import functools
import importlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import typing
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotwise.emulators import machine_root
from spotwise.emulators._faults import Fault, take
from spotwise.emulators._server import LoopbackEmulator, Request, Response, json_body
from spotwise.emulators.azure import AzureScheduledEventsEmulator

SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
TOKEN = "spotwise-emulator-token"  # what the fake credential hands out; any bearer token works
LOOPBACK = "127.0.0.1"
SYNC_CAPACITY = ("SkuNotAvailable", "OperationNotAllowed")  # 409 on the PUT
ASYNC_CAPACITY = ("AllocationFailed", "ZonalAllocationFailed")  # the operation fails
DEFAULT_SKUS = {
    "eastus": ("Standard_NC4as_T4_v3", "Standard_NC6s_v3", "Standard_D2s_v5", "Standard_D4s_v5"),
    "westus2": ("Standard_NC4as_T4_v3", "Standard_NC6s_v3", "Standard_D2s_v5"),
    "westeurope": ("Standard_NC4as_T4_v3", "Standard_D2s_v5"),
}
_RG = r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers"
ROUTES = {
    "vms": re.compile(_RG + r"/Microsoft\.Compute/virtualMachines"),
    "vm": re.compile(_RG + r"/Microsoft\.Compute/virtualMachines/(?P<name>[^/]+)"),
    "view": re.compile(_RG + r"/Microsoft\.Compute/virtualMachines/(?P<name>[^/]+)/instanceView"),
    "disks": re.compile(_RG + r"/Microsoft\.Compute/disks"),
    "disk": re.compile(_RG + r"/Microsoft\.Compute/disks/(?P<name>[^/]+)"),
    "nics": re.compile(_RG + r"/Microsoft\.Network/networkInterfaces"),
    "nic": re.compile(_RG + r"/Microsoft\.Network/networkInterfaces/(?P<name>[^/]+)"),
    "ips": re.compile(_RG + r"/Microsoft\.Network/publicIPAddresses"),
    "ip": re.compile(_RG + r"/Microsoft\.Network/publicIPAddresses/(?P<name>[^/]+)"),
    "skus": re.compile(r"/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Compute/skus"),
    "op": re.compile(
        r"/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Compute/locations/[^/]+"
        r"/operations/(?P<name>[^/]+)"
    ),
}


# --- shapes, checked against the SDK's own models ------------------------------------------
class ShapeError(ValueError):
    """A body has a field the SDK's model does not (or a value of the wrong kind)."""


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    """``{rest name: the attribute's type}`` of one SDK model class."""
    cls()  # the model computes its field table on first use
    package = importlib.import_module(cls.__module__.rsplit(".", 1)[0])
    hints = typing.get_type_hints(
        cls, globalns={**vars(sys.modules[cls.__module__]), "_models": package}
    )
    table: dict[str, Any] = typing.cast(Any, cls)._attr_to_rest_field
    return {rf._rest_name: hints.get(attr, Any) for attr, rf in table.items()}


def _model_of(hint: Any) -> tuple[str, Any]:
    """``Optional[list[Model]]`` -> ("list", Model); the shape a hint asks for."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        models = [a for a in args if _is_model(a)]
        nested = [a for a in args if typing.get_origin(a) in (list, dict)]
        return _model_of(models[0] if models else nested[0] if nested else Any)
    if origin is list:
        return "list", args[0] if args else Any
    if origin is dict:
        return "dict", args[-1] if args else Any
    if _is_model(hint):
        return "model", hint
    return "value", hint


def _is_model(hint: Any) -> bool:
    return isinstance(hint, type) and bool(getattr(hint, "_is_model", False))


def check_shape(cls: type, doc: Any, where: str = "") -> None:
    """Every field of ``doc`` is a field of the SDK model ``cls``, recursively."""
    where = where or cls.__name__
    if not isinstance(doc, dict):
        raise ShapeError(f"{where}: expected an object, got {type(doc).__name__}")
    fields = _fields(cls)
    for key, value in doc.items():
        if key not in fields:
            raise ShapeError(f"{where}.{key}: not a field of the SDK's {cls.__name__}")
        _check_value(fields[key], value, f"{where}.{key}")


def _check_value(hint: Any, value: Any, where: str) -> None:
    kind, inner = _model_of(hint)
    if value is None:
        return
    if kind == "model":
        check_shape(inner, value, where)
    elif kind == "list":
        if not isinstance(value, list):
            raise ShapeError(f"{where}: expected a list")
        for i, item in enumerate(value):
            _check_value(inner, item, f"{where}[{i}]")
    elif kind == "dict":
        if not isinstance(value, dict):
            raise ShapeError(f"{where}: expected an object")
        for k, item in value.items():
            _check_value(inner, item, f"{where}.{k}")


def _models() -> Any:
    import azure.mgmt.compute.models as compute
    import azure.mgmt.network.models as network

    return compute, network


# --- state ---------------------------------------------------------------------------------
@dataclass
class Vm:
    """One virtual machine: its ARM document, its schedule (wall times) and its machine."""

    rg: str
    name: str
    doc: dict[str, Any]
    index: int  # creation order: which entry of the eviction schedule applies
    state: str = "Creating"  # provisioningState: Creating, Succeeded, Failed, Deleting
    power: str = "starting"  # PowerState/...: starting, running, stopped
    ready_at: float = 0.0
    failure: str = ""  # an allocation failure planned for this create
    proc: subprocess.Popen[bytes] | None = None
    imds: AzureScheduledEventsEmulator | None = None
    notice_at: float | None = None
    kill_at: float | None = None
    evicted: bool = False


@dataclass
class Operation:
    """A long-running operation: done when ``done()`` says so, then Succeeded or Failed."""

    vm: tuple[str, str]
    kind: str  # "create" | "delete"
    error: dict[str, str] | None = None


class AzureComputeEmulator(LoopbackEmulator):
    """``AzureComputeEmulator(workdir=...).start()`` -> base URL for ``base_url``.

    ``interrupt_after_s[i]``: seconds after the i-th VM runs that its Preempt event appears
    (None or missing: never). ``machine_env``: what the VMs' processes get besides their
    metadata service (the object store's endpoint and credentials, as a managed identity would
    supply them). ``image``: the job's code on the VM image (default: the working directory).
    """

    platform = "azure-compute"

    def __init__(
        self,
        workdir: Path,
        *,
        port: int = 0,
        interrupt_after_s: Sequence[float | None] = (),
        notice_lead_s: float = 30.0,
        stop_grace_s: float = 10.0,
        provision_s: float = 0.3,
        retry_after_s: int = 1,
        resource_groups: Sequence[str] = ("spotwise-rg",),
        skus: Mapping[str, Sequence[str]] | None = None,
        machine_env: Mapping[str, str] | None = None,
        python_bin: str | None = None,
        image: Sequence[Path] | None = None,
        tick_s: float = 0.1,
    ) -> None:
        super().__init__(port)
        self.workdir = workdir
        self.interrupt_after_s = list(interrupt_after_s)
        self.notice_lead_s, self.stop_grace_s = notice_lead_s, stop_grace_s
        self.provision_s, self.retry_after_s, self.tick_s = provision_s, retry_after_s, tick_s
        self.resource_groups = tuple(resource_groups)
        self.skus = dict(skus if skus is not None else DEFAULT_SKUS)
        self.machine_env = dict(machine_env or {})
        self.python_bin = python_bin
        self.vms: dict[tuple[str, str], Vm] = {}
        self.disks: dict[tuple[str, str], dict[str, Any]] = {}
        self.nics: dict[tuple[str, str], dict[str, Any]] = {}
        self.ops: dict[str, Operation] = {}
        self.preempted: list[str] = []  # names of the VMs that got a Preempt event
        self.evicted: list[str] = []  # ... and were taken back before anyone deleted them
        self.created: list[str] = []  # names of every VM that provisioned, in order
        self._create_faults: list[Fault] = []
        self._count = itertools.count()
        self._image = machine_root.machine_image(image)
        self._ticker: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> str:
        url = super().start()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._ticker = threading.Thread(target=self._loop, name="azure-compute-vms", daemon=True)
        self._ticker.start()
        return url

    def stop(self) -> None:
        super().stop()
        if self._ticker is not None:
            self._ticker.join(timeout=30)
        with self._lock:
            for vm in self.vms.values():
                self._power_off(vm)

    def fail_next(self, code: str, count: int = 1, name: str = "") -> None:
        """The next ``count`` VM creates (of VMs whose name the pattern ``name`` finds, e.g.
        ``-1$``: a rank 1) fail with ``code`` (see the module's docstring)."""
        if code not in SYNC_CAPACITY + ASYNC_CAPACITY:
            raise ValueError(f"unknown fault {code!r}; use one of {SYNC_CAPACITY + ASYNC_CAPACITY}")
        with self._lock:
            self._create_faults.append(Fault(code, count, {"name": name}))

    def evict(self, name: str, now: float | None = None) -> None:
        """Evict a running Spot VM now: its Preempt event, the kill ``notice_lead_s`` later."""
        with self._lock:
            vm = next(v for v in self.vms.values() if v.name == name)
            self._schedule_eviction(vm, time.time() if now is None else now)

    def live(self) -> list[str]:
        """Names of the VMs that exist (any state), the disks and the NICs: what is billed."""
        with self._lock:
            return sorted(
                [f"vm/{n}" for _, n in self.vms]
                + [f"disk/{n}" for _, n in self.disks]
                + [f"nic/{n}" for _, n in self.nics]
            )

    # --- the machines ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                now = time.time()
                for vm in list(self.vms.values()):
                    self._tick(vm, now)
            self._stopping.wait(self.tick_s)

    def _tick(self, vm: Vm, now: float) -> None:
        if vm.state == "Creating" and now >= vm.ready_at:
            if vm.failure:
                vm.state, vm.power = "Failed", "stopped"
                return
            vm.state = "Succeeded"
            self._boot(vm, now)
            return
        if vm.proc is None:
            if vm.state == "Deleting":
                self._remove(vm)
            return
        code = vm.proc.poll()
        if code is not None and vm.power == "running":
            vm.power = "stopped"  # the custom data ended: the OS shut itself down
            self._power_off(vm)
        if vm.state == "Deleting" and vm.proc.poll() is not None:
            self._remove(vm)
            return
        if vm.notice_at is not None and now >= vm.notice_at and not vm.evicted:
            vm.evicted = True
            self.preempted.append(vm.name)
            assert vm.imds is not None
            vm.imds.trigger_notice()
        if vm.kill_at is not None and now >= vm.kill_at:
            self._power_off(vm)
            if vm.evicted and vm.state != "Deleting":  # evictionPolicy Delete: the VM goes
                self.evicted.append(vm.name)
            self._remove(vm)

    def _boot(self, vm: Vm, now: float) -> None:
        props = vm.doc["properties"]
        script = base64.b64decode(props.get("osProfile", {}).get("customData", "") or b"")
        home = self.workdir / vm.name
        home.mkdir(parents=True, exist_ok=True)
        (home / "custom-data").write_bytes(script)
        vm.imds = AzureScheduledEventsEmulator(
            lead_s=self.notice_lead_s,
            vm_name=vm.name,
            location=vm.doc["location"],
            vm_size=props["hardwareProfile"]["vmSize"],
            zone=(vm.doc.get("zones") or [""])[0],
            rate_limit_per_s=0,
        )
        env = self._machine_env(vm.imds.start())
        with open(home / "console.log", "ab") as console:  # (as cloud-init runs custom data)
            vm.proc = machine_root.start(
                ["/bin/bash", "-c", script.decode(errors="replace"), "custom-data"],
                machine_dir=home / "machine",
                image=self._image,
                env=env,
                hide=[self.workdir],
                stdout=console,
            )
        vm.power = "running"
        self.created.append(vm.name)
        after = self.interrupt_after_s[vm.index] if vm.index < len(self.interrupt_after_s) else None
        if after is not None and props.get("priority") == "Spot":
            self._schedule_eviction(vm, now + after)

    def _schedule_eviction(self, vm: Vm, at: float) -> None:
        vm.notice_at = at
        vm.kill_at = at + self.notice_lead_s

    def _machine_env(self, imds_url: str) -> dict[str, str]:
        bin_dir = self.python_bin or os.path.dirname(sys.executable)
        env = {
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            **self.machine_env,
            "SPOTWISE_PLATFORM": "azure",
            "SPOTWISE_AZURE_METADATA_ENDPOINT": imds_url,
            "SPOTWISE_AZURE_EMULATED": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        if os.environ.get("PYTHONPATH"):  # where this spotwise lives, as installed on the image
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return env

    def _power_off(self, vm: Vm) -> None:
        if vm.proc is not None and vm.proc.poll() is None:
            _killpg(vm.proc.pid, signal.SIGKILL)
            vm.proc.wait()
        if vm.imds is not None:
            vm.imds.stop()
        machine_root.discard(self.workdir / vm.name / "machine")

    def _remove(self, vm: Vm) -> None:
        """The VM is gone; so are its disk and NIC where their deleteOption says Delete."""
        self._power_off(vm)
        self.vms.pop((vm.rg, vm.name), None)
        props = vm.doc["properties"]
        if props.get("storageProfile", {}).get("osDisk", {}).get("deleteOption") == "Delete":
            self.disks.pop((vm.rg, f"{vm.name}-osdisk"), None)
        nics = props.get("networkProfile", {}).get("networkInterfaceConfigurations", [])
        for nic in nics:
            if nic.get("properties", {}).get("deleteOption", "Delete") == "Delete":
                self.nics.pop((vm.rg, f"{vm.name}-{nic['name']}"), None)

    # --- the API ---------------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        if "api-version" not in request.query:
            return _error(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        if not (request.header("Authorization") or "").startswith("Bearer "):
            return _error(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
            )
        for route, pattern in ROUTES.items():
            match = pattern.fullmatch(request.path)
            if match is None:
                continue
            parts = match.groupdict()
            if parts["sub"] != SUBSCRIPTION:
                return _error(
                    404,
                    "SubscriptionNotFound",
                    f"The subscription '{parts['sub']}' could not be found.",
                )
            if "rg" in parts and parts["rg"] not in self.resource_groups:
                return _error(
                    404,
                    "ResourceGroupNotFound",
                    f"Resource group '{parts['rg']}' could not be found.",
                )
            try:
                with self._lock:
                    return getattr(self, f"_{route}")(request, parts)
            except ShapeError as exc:
                return _error(400, "InvalidRequestContent", str(exc))
            except RuntimeError as exc:  # this double's own answer was off the API
                return _error(500, "InternalServerError", str(exc))
        return _error(404, "InvalidResourceType", f"no route for {request.method} {request.path}")

    def _vms(self, request: Request, parts: dict[str, str]) -> Response:
        compute, _ = _models()
        docs = [self._vm_doc(v) for (rg, _), v in self.vms.items() if rg == parts["rg"]]
        return _listing(compute.VirtualMachine, docs)

    def _vm(self, request: Request, parts: dict[str, str]) -> Response:
        key = (parts["rg"], parts["name"])
        vm = self.vms.get(key)
        if request.method == "PUT":
            return self._create(request, parts)
        if request.method == "DELETE":
            if vm is None:
                return Response(204)
            if vm.state != "Deleting":
                vm.state = "Deleting"
                if vm.proc is not None and vm.proc.poll() is None:
                    _killpg(vm.proc.pid, signal.SIGTERM)  # the OS shuts down
                    vm.kill_at = min(vm.kill_at or float("inf"), time.time() + self.stop_grace_s)
            return self._accepted(request, key, "delete", status=202)
        if vm is None:
            return _not_found("Microsoft.Compute/virtualMachines", parts)
        compute, _ = _models()
        return _ok(compute.VirtualMachine, self._vm_doc(vm))

    def _view(self, request: Request, parts: dict[str, str]) -> Response:
        vm = self.vms.get((parts["rg"], parts["name"]))
        if vm is None:
            return _not_found("Microsoft.Compute/virtualMachines", parts)
        compute, _ = _models()
        return _ok(compute.VirtualMachineInstanceView, _instance_view(vm))

    def _create(self, request: Request, parts: dict[str, str]) -> Response:
        compute, _ = _models()
        try:
            doc = json.loads(request.body)
        except ValueError:
            return _error(400, "InvalidRequestContent", "The request content was invalid.")
        check_shape(compute.VirtualMachine, doc)
        key = (parts["rg"], parts["name"])
        if key in self.vms:
            return _error(
                409,
                "OperationNotAllowed",
                f"VM {parts['name']} exists "
                f"({self.vms[key].state}); this double creates, it does not update.",
            )
        props = doc.get("properties") or {}
        location, size = doc.get("location", ""), props.get("hardwareProfile", {}).get("vmSize")
        if location not in self.skus:
            return _error(
                400,
                "LocationNotAvailableForResourceType",
                f"The provided location "
                f"'{location}' is not available for resource type "
                "'Microsoft.Compute/virtualMachines'.",
            )
        problem = _invalid(props)
        if problem:
            return _error(400, "InvalidParameter", problem)
        taken = take(self._create_faults, {"name": parts["name"]})
        fault = "" if taken is None else taken.what
        if size not in self.skus[location] or fault == "SkuNotAvailable":
            return _error(
                409,
                "SkuNotAvailable",
                f"The requested VM size {size} is currently "
                f"not available in location '{location}' zones "
                f"'{','.join(doc.get('zones') or [])}'.",
            )
        if fault == "OperationNotAllowed":
            return _error(
                409,
                "OperationNotAllowed",
                "Operation could not be completed as it "
                "results in exceeding approved Total Regional Low-priority vCPUs quota.",
            )
        vm = Vm(parts["rg"], parts["name"], doc, next(self._count), failure=fault)
        vm.ready_at = time.time() + self.provision_s
        self.vms[key] = vm
        self._attach(vm)
        response = self._accepted(request, key, "create", status=201)
        return Response(201, json_body(self._vm_doc(vm)), response.headers)

    def _attach(self, vm: Vm) -> None:
        """The OS disk and the NICs the VM creates itself, tagged as the VM is."""
        props, tags = vm.doc["properties"], vm.doc.get("tags") or {}
        base = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{vm.rg}/providers"
        disk = f"{vm.name}-osdisk"
        self.disks[(vm.rg, disk)] = {
            "id": f"{base}/Microsoft.Compute/disks/{disk}",
            "name": disk,
            "location": vm.doc["location"],
            "tags": dict(tags),
            "properties": {"diskState": "Attached", "provisioningState": "Succeeded"},
        }
        for nic in props.get("networkProfile", {}).get("networkInterfaceConfigurations", []):
            name = f"{vm.name}-{nic['name']}"
            ip = {  # the VMs share this host's network: every private address is the loopback
                "name": nic["properties"]["ipConfigurations"][0]["name"],
                "properties": {"privateIPAddress": LOOPBACK, "primary": True},
            }
            self.nics[(vm.rg, name)] = {
                "id": f"{base}/Microsoft.Network/networkInterfaces/{name}",
                "name": name,
                "location": vm.doc["location"],
                "tags": dict(tags),
                "properties": {"provisioningState": "Succeeded", "ipConfigurations": [ip]},
            }

    def _accepted(self, request: Request, key: tuple[str, str], kind: str, status: int) -> Response:
        op = uuid.uuid4().hex
        self.ops[op] = Operation(key, kind)
        location = self.vms[key].doc.get("location", "eastus") if key in self.vms else "eastus"
        url = (
            f"{self.url}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/"
            f"{location}/operations/{op}?api-version={request.query['api-version']}"
        )
        headers = {"Azure-AsyncOperation": url, "Retry-After": str(self.retry_after_s)}
        if kind == "delete":
            headers["Location"] = url + "&monitor=true"
        return Response(status, b"", {"Content-Type": "application/json", **headers})

    def _op(self, request: Request, parts: dict[str, str]) -> Response:
        op = self.ops.get(parts["name"])
        if op is None:
            return _error(404, "NotFound", "operation not found")
        vm = self.vms.get(op.vm)
        status = "InProgress"
        error = None
        if op.kind == "delete" and vm is None:
            status = "Succeeded"
        elif op.kind == "create" and vm is None:
            status, error = "Canceled", {"code": "Canceled", "message": "the VM was deleted"}
        elif op.kind == "create" and vm is not None and vm.state == "Failed":
            status = "Failed"
            where = "zone" if vm.failure.startswith("Zonal") else "region"
            error = {
                "code": vm.failure,
                "message": "Allocation failed. We do not have sufficient capacity for the "
                f"requested VM size in this {where}.",
            }
        elif op.kind == "create" and vm is not None and vm.state != "Creating":
            status = "Succeeded"
        if "monitor" in request.query and status == "InProgress":  # a Location poll
            return Response(
                202,
                b"",
                {
                    "Location": f"{self.url}{request.path}?api-version="
                    f"{request.query['api-version']}&monitor=true",
                    "Retry-After": str(self.retry_after_s),
                },
            )
        if "monitor" in request.query:
            return Response(200 if status == "Succeeded" else 500, b"")
        body: dict[str, Any] = {"name": parts["name"], "status": status}
        if error:
            body["error"] = error
        return Response(
            200,
            json_body(body),
            {"Content-Type": "application/json", "Retry-After": str(self.retry_after_s)},
        )

    def _disks(self, request: Request, parts: dict[str, str]) -> Response:
        compute, _ = _models()
        return _listing(compute.Disk, [d for (rg, _), d in self.disks.items() if rg == parts["rg"]])

    def _disk(self, request: Request, parts: dict[str, str]) -> Response:
        return self._delete_plain(request, parts, self.disks, "Microsoft.Compute/disks")

    def _nics(self, request: Request, parts: dict[str, str]) -> Response:
        _, network = _models()
        docs = [n for (rg, _), n in self.nics.items() if rg == parts["rg"]]
        return _listing(network.NetworkInterface, docs)

    def _nic(self, request: Request, parts: dict[str, str]) -> Response:
        return self._delete_plain(request, parts, self.nics, "Microsoft.Network/networkInterfaces")

    def _ips(self, request: Request, parts: dict[str, str]) -> Response:
        _, network = _models()
        return _listing(network.PublicIPAddress, [])  # VMs here get none

    def _ip(self, request: Request, parts: dict[str, str]) -> Response:
        return Response(204) if request.method == "DELETE" else _not_found("ip", parts)

    def _delete_plain(
        self, request: Request, parts: dict[str, str], table: dict[Any, Any], kind: str
    ) -> Response:
        """DELETE of a disk or NIC: gone at once (200), or already (204)."""
        key = (parts["rg"], parts["name"])
        if request.method == "DELETE":
            return Response(200 if table.pop(key, None) is not None else 204)
        return _not_found(kind, parts) if key not in table else Response(200, json_body(table[key]))

    def _skus(self, request: Request, parts: dict[str, str]) -> Response:
        compute, _ = _models()
        match = re.fullmatch(r"location eq '([^']+)'", request.query.get("$filter", ""))
        places = [match.group(1)] if match else list(self.skus)
        docs = [
            {
                "resourceType": "virtualMachines",
                "name": size,
                "locations": [place],
                "locationInfo": [{"location": place, "zones": ["1", "2", "3"]}],
                "restrictions": [],
            }
            for place in places
            for size in self.skus.get(place, ())
        ]
        return _listing(compute.ResourceSku, docs)

    def _vm_doc(self, vm: Vm) -> dict[str, Any]:
        doc = json.loads(json.dumps(vm.doc))
        doc.update(
            id=f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{vm.rg}/providers/"
            f"Microsoft.Compute/virtualMachines/{vm.name}",
            name=vm.name,
            type="Microsoft.Compute/virtualMachines",
        )
        props = doc.setdefault("properties", {})
        props["provisioningState"] = vm.state
        props["vmId"] = str(uuid.uuid5(uuid.NAMESPACE_URL, doc["id"]))
        props.get("osProfile", {}).pop("customData", None)  # ARM never returns it
        network = props.get("networkProfile", {})
        base = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{vm.rg}/providers"
        network["networkInterfaces"] = [  # the NICs the VM made (``_attach``)
            {"id": f"{base}/Microsoft.Network/networkInterfaces/{vm.name}-{nic['name']}"}
            for nic in network.get("networkInterfaceConfigurations", [])
        ]
        return doc


def _invalid(props: dict[str, Any]) -> str:
    """What ARM itself refuses in a Spot VM's properties (so a provider bug shows here)."""
    if props.get("priority") == "Spot" and props.get("evictionPolicy") not in (
        "Delete",
        "Deallocate",
    ):
        return "Spot VMs require evictionPolicy Delete or Deallocate."
    price = props.get("billingProfile", {}).get("maxPrice")
    if price is not None and price != -1 and price <= 0:
        return "billingProfile.maxPrice must be -1 or greater than 0."
    custom = props.get("osProfile", {}).get("customData")
    if custom is not None:
        try:
            decoded = base64.b64decode(custom, validate=True)
        except ValueError:
            return "osProfile.customData must be base64."
        if len(decoded) > 64 * 1024:
            return "osProfile.customData is over 64 KiB."
    return ""


def _instance_view(vm: Vm) -> dict[str, Any]:
    codes = [(f"ProvisioningState/{vm.state.lower()}", vm.state)]
    if vm.state == "Failed":
        codes[0] = (f"ProvisioningState/failed/{vm.failure}", f"Provisioning failed: {vm.failure}")
    if vm.state != "Creating":
        codes.append((f"PowerState/{vm.power}", f"VM {vm.power}"))
    return {
        "computerName": vm.name,
        "osName": "ubuntu",
        "statuses": [
            {"code": code, "level": "Error" if "failed" in code else "Info", "displayStatus": text}
            for code, text in codes
        ],
    }


def _listing(cls: type, docs: list[dict[str, Any]]) -> Response:
    for doc in docs:
        _checked(cls, doc)
    return Response(200, json_body({"value": docs}), {"Content-Type": "application/json"})


def _ok(cls: type, doc: dict[str, Any]) -> Response:
    return Response(200, json_body(_checked(cls, doc)), {"Content-Type": "application/json"})


def _checked(cls: type, doc: dict[str, Any]) -> dict[str, Any]:
    """A response of this double: it must be what the SDK's model knows (a drift is a bug)."""
    try:
        check_shape(cls, doc)
    except ShapeError as exc:
        raise RuntimeError(f"the azure-compute double answers outside the API: {exc}") from exc
    return doc


def _error(status: int, code: str, message: str) -> Response:
    return Response(
        status,
        json_body({"error": {"code": code, "message": message}}),
        {"Content-Type": "application/json", "x-ms-error-code": code},
    )


def _not_found(kind: str, parts: dict[str, str]) -> Response:
    return _error(
        404,
        "ResourceNotFound",
        f"The Resource '{kind}/{parts.get('name')}' under "
        f"resource group '{parts.get('rg')}' was not found.",
    )


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return
