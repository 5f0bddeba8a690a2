"""A loopback Compute Engine API (the subset the ``gcp`` provider uses) with machines behind it.

No public emulator of the Compute API exists, so this is one, driven by the official
``google-cloud-compute`` clients (``client_options={"api_endpoint": url}``): REST + JSON under
``/compute/v1/projects/{project}/...``. Every request body is parsed into the SDK's own
proto-plus model (``compute_v1.Instance``) with unknown fields refused, and every answer is
built from those models, so a field the real API does not have fails here instead of passing.

Served: ``zones.get``, ``machineTypes.get``, ``acceleratorTypes.get``,
``images.getFromFamily``, ``instances.insert|get|list|delete`` and
``zoneOperations.get|list|wait``. Zones, machine types and GPUs come from the shipped catalog's
``gcp`` offers (a GPU is in a zone where the catalog sells it), plus the N1/E2 general types.

Each instance is a machine as on ``spotwise emulate ec2``: its ``startup-script`` metadata runs
as a local process in a root of its own (``machine_root``), with its own GCP metadata server
(``GCE_METADATA_HOST``, :class:`GcpMetadataEmulator`), and what a service account would give
it (here: the job store's endpoint and test credentials, ``machine_env``, never in the
script). Then it
behaves as Compute Engine does:

- the script ends: the guest powers off, the instance is ``TERMINATED`` (and stays, billed for
  its disk, until deleted);
- ``instances.delete``: ``STOPPING``, the guest's SIGTERM, ``stop_grace_s`` later off; the
  instance is gone and the delete operation ``DONE``;
- a Spot preemption (``interrupt_after_s``, or :meth:`preempt`): ``instance/preempted`` turns
  TRUE on its metadata server and the guest gets its ACPI shutdown (SIGTERM), ``notice_lead_s``
  later it is off, a ``compute.instances.preempted`` operation is recorded, and
  (``instanceTerminationAction: DELETE``) the instance is deleted.

Faults (:meth:`fail`): a stockout or quota error ends an insert's operation with
``ZONE_RESOURCE_POOL_EXHAUSTED`` / ``QUOTA_EXCEEDED`` as the real API does, an HTTP status
(429, 500, 503) answers the call with Google's error JSON and does nothing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spotwise.emulators import machine_root
from spotwise.emulators._faults import Fault, take
from spotwise.emulators._server import LoopbackEmulator, Request, Response, json_body
from spotwise.emulators.gcp import GcpMetadataEmulator
from spotwise.market.catalog import GCP_ACCELERATORS

API = "/compute/v1/projects/"
GENERAL_TYPES = tuple(f"n1-standard-{n}" for n in (1, 2, 4, 8, 16, 32, 64, 96)) + tuple(
    f"e2-standard-{n}" for n in (2, 4, 8, 16, 32)
)
IMAGE_FAMILIES = {  # project -> families the double knows (public images a job may name)
    "debian-cloud": ("debian-12", "debian-11"),
    "deeplearning-platform-release": ("common-cu123", "common-cu121", "pytorch-latest-gpu"),
    "ubuntu-os-cloud": ("ubuntu-2204-lts",),
}
CAPACITY_STATUS = {"ZONE_RESOURCE_POOL_EXHAUSTED": 503, "QUOTA_EXCEEDED": 403}
LOOPBACK = "127.0.0.1"
WAIT_MAX_S = 120.0  # zoneOperations.wait answers within two minutes, done or not


def accelerator_name(gpu: str) -> str:
    """The catalog's GPU name -> Compute Engine's accelerator type."""
    return GCP_ACCELERATORS.get(gpu, f"nvidia-{gpu.lower()}")


def _catalog_places() -> dict[str, tuple[set[str], set[str]]]:
    """zone -> (machine types, accelerator types) the catalog sells there."""
    from spotwise.market import load_catalog

    offers = [o for o in load_catalog().offers if o.cloud == "gcp"]
    zones = {o.zone for o in offers if o.zone}
    places: dict[str, tuple[set[str], set[str]]] = {z: (set(GENERAL_TYPES), set()) for z in zones}
    for o in offers:
        for zone in [o.zone] if o.zone else [z for z in zones if z.rsplit("-", 1)[0] == o.region]:
            types, gpus = places[zone]
            if o.host_included:
                types.add(o.instance_type)
            else:
                gpus.add(accelerator_name(o.gpu))
    return places


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Machine:
    """One instance's guest: its process, metadata server and schedule (wall times)."""

    proc: subprocess.Popen[bytes]
    metadata: GcpMetadataEmulator
    home: Path
    notice_at: float | None = None
    off_at: float | None = None
    preempting: bool = False


@dataclass
class _Vm:
    doc: Any  # compute_v1.Instance
    zone: str
    booted_at: float | None = None
    machine: Machine | None = None
    pending_ops: list[str] = field(default_factory=list)  # done when the guest is up / gone


class GcpComputeEmulator(LoopbackEmulator):
    """``GcpComputeEmulator(workdir, machine_env=...).start()`` -> the ``api_endpoint``.

    ``interrupt_after_s[i]``: seconds after the i-th instance boots that it is preempted (None
    or missing: never). ``machine_env``: what the guests get besides their metadata server (the
    job store's endpoint and test credentials, as a service account would reach it:
    ``STORAGE_EMULATOR_HOST`` for a ``gs://`` store on the GCS double, ``AWS_*`` for moto).
    ``image``: the job's code on the machine image (default: the working directory)."""

    platform = "gcp-compute"

    def __init__(
        self,
        workdir: Path,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        project: str = "spotwise-project",
        interrupt_after_s: Sequence[float | None] = (),
        notice_lead_s: float = 30.0,
        stop_grace_s: float = 90.0,
        machine_env: Mapping[str, str] | None = None,
        image: Sequence[Path] | None = None,
        python_bin: str | None = None,
        poll_s: float = 0.2,
    ) -> None:
        super().__init__(port, host)
        self.workdir, self.project = workdir, project
        self.interrupt_after_s = list(interrupt_after_s)
        self.notice_lead_s, self.stop_grace_s, self.poll_s = notice_lead_s, stop_grace_s, poll_s
        self.machine_env, self.python_bin = dict(machine_env or {}), python_bin
        self.places = _catalog_places()
        self.vms: dict[tuple[str, str], _Vm] = {}  # (zone, name) -> instance
        self.operations: dict[str, tuple[str, Any]] = {}  # name -> (zone, compute_v1.Operation)
        self.booted = 0
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._image = machine_root.machine_image(image)
        self._next_id = 4_000_000_000_000_000_000 + os.getpid() * 1000
        self._loop_thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> str:
        from google.cloud import compute_v1  # noqa: F401  (seconds to import: not in a request)

        self.workdir.mkdir(parents=True, exist_ok=True)
        url = super().start()
        self._loop_thread = threading.Thread(target=self._loop, name="gce-data-plane", daemon=True)
        self._loop_thread.start()
        return url

    def stop(self) -> None:
        super().stop()
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=30)
        with self._lock:
            for vm in self.vms.values():
                if vm.machine is not None:
                    self._power_off(vm.machine)

    def fail(
        self, operation: str, code: str, times: int = 1, zone: str = "", name: str = ""
    ) -> None:
        """Make the next ``times`` calls of ``operation`` (in ``zone``; an insert: of an
        instance whose name the pattern ``name`` finds, e.g. ``-1$``: a rank 1) fail with
        ``code``."""
        if code not in CAPACITY_STATUS and not (code.isdigit() and 400 <= int(code) <= 599):
            raise ValueError(
                f"unknown fault {code!r}: use {', '.join(CAPACITY_STATUS)} or an HTTP status"
            )
        with self._lock:
            where = {"operation": operation, "zone": zone, "name": name}
            self.faults.append(Fault(code, times, where))

    def preempt(self, name: str) -> None:
        """Preempt a running Spot instance now (what ``interrupt_after_s`` schedules)."""
        with self._lock:
            vm = next(v for (_, n), v in self.vms.items() if n == name)
            assert vm.machine is not None, f"{name} has not booted"
            vm.machine.notice_at = time.time()

    def live(self) -> list[str]:
        """Names of the instances that exist (any status): what a user is billed for."""
        with self._lock:
            return sorted(name for _, name in self.vms)

    # --- the API ---------------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        if not request.path.startswith(API):
            return _error(404, "notFound", f"The requested URL {request.path} was not found")
        parts = request.path[len(API) :].split("/")
        project, rest = parts[0], parts[1:]
        with self._lock:
            try:
                return self._route(request, project, rest)
            except _ApiError as exc:
                return _error(exc.status, exc.reason, exc.message)

    def _route(self, request: Request, project: str, rest: list[str]) -> Response:
        from google.cloud import compute_v1 as gce

        method = request.method
        if rest[:3] == ["global", "images", "family"] and len(rest) == 4 and method == "GET":
            return _image_family(project, rest[3])
        if project != self.project:
            raise _ApiError(404, "notFound", f"The resource 'projects/{project}' was not found")
        if rest[:1] != ["zones"] or len(rest) < 2:
            raise _ApiError(404, "notFound", f"The requested URL {request.path} was not found")
        zone = rest[1]
        if zone not in self.places:
            raise _ApiError(404, "notFound", f"The resource '{self._link(zone)}' was not found")
        kind, name = (rest[2] if len(rest) > 2 else ""), (rest[3] if len(rest) > 3 else "")
        op = {"GET": "get" if name else "list", "POST": "insert", "DELETE": "delete"}[method]
        self._api_fault(kind, op, zone)
        if not kind and method == "GET":
            region = zone.rsplit("-", 1)[0]
            return _ok(
                gce.Zone(
                    name=zone,
                    status="UP",
                    region=f"https://www.googleapis.com{API}{project}/regions/{region}",
                    self_link=self._link(zone),
                    kind="compute#zone",
                )
            )
        if kind in ("machineTypes", "acceleratorTypes") and name and method == "GET":
            types, gpus = self.places[zone]
            if name not in (types if kind == "machineTypes" else gpus):
                what = f"{self._link(zone)}/{kind}/{name}"
                raise _ApiError(404, "notFound", f"The resource '{what}' was not found")
            if kind == "machineTypes":
                return _ok(gce.MachineType(name=name, zone=zone, kind="compute#machineType"))
            return _ok(gce.AcceleratorType(name=name, zone=zone, maximum_cards_per_instance=8))
        answer = None
        if kind == "instances":
            answer = self._instances(request, zone, name)
        elif kind == "operations":
            answer = self._operations(request, zone, name, rest[4:] == ["wait"])
        if answer is not None:
            return answer
        raise _ApiError(400, "badRequest", f"{method} {request.path} is not served by this double")

    def _instances(self, request: Request, zone: str, name: str) -> Response | None:
        """instances.insert, list (filtered), get and delete; None: not served."""
        from google.cloud import compute_v1 as gce

        method = request.method
        if method == "POST" and not name:
            return self._insert(request, zone)
        if method == "GET" and not name:
            found = [v.doc for (z, _), v in sorted(self.vms.items()) if z == zone]
            matched = [d for d in found if _matches(d, request.query.get("filter", ""))]
            return _ok(gce.InstanceList(items=matched, kind="compute#instanceList"))
        vm = self.vms.get((zone, name))
        if vm is None:
            where = f"{self._link(zone)}/instances/{name}"
            raise _ApiError(404, "notFound", f"The resource '{where}' was not found")
        if method == "GET":
            return _ok(vm.doc)
        if method == "DELETE":
            return _ok(self._delete(vm, name))
        return None

    def _operations(self, request: Request, zone: str, name: str, wait: bool) -> Response:
        """zoneOperations.list (filtered), get, and wait (until done, or two minutes)."""
        from google.cloud import compute_v1 as gce

        if not name and request.method == "GET":
            ops = [o for z, o in self.operations.values() if z == zone]
            matched = [o for o in ops if _matches(o, request.query.get("filter", ""))]
            return _ok(gce.OperationList(items=matched, kind="compute#operationList"))
        if name not in self.operations:
            where = f"{self._link(zone)}/operations/{name}"
            raise _ApiError(404, "notFound", f"The resource '{where}' was not found")
        if request.method == "POST" and wait:
            end = time.monotonic() + WAIT_MAX_S
            while self.operations[name][1].status != gce.Operation.Status.DONE:
                if self._stopping.is_set() or not self._changed.wait(end - time.monotonic()):
                    break
        return _ok(self.operations[name][1])

    def _api_fault(self, kind: str, op: str, zone: str) -> None:
        if kind != "instances":
            return
        errors = [f for f in self.faults if f.what.isdigit()]  # capacity ends an operation
        fault = take(errors, {"operation": op, "zone": zone})
        if fault is not None:
            reason = "rateLimitExceeded" if fault.what == "429" else "backendError"
            raise _ApiError(int(fault.what), reason, f"injected {fault.what} (spotwise emulate)")

    def _capacity_fault(self, zone: str, name: str) -> str | None:
        stockouts = [f for f in self.faults if f.what in CAPACITY_STATUS]
        fault = take(stockouts, {"operation": "insert", "zone": zone, "name": name})
        return None if fault is None else fault.what

    def _insert(self, request: Request, zone: str) -> Response:
        from google.cloud import compute_v1 as gce

        try:  # the SDK's own model, unknown fields refused: shape drift fails here
            doc = gce.Instance.from_json(request.body.decode() or "{}")
        except Exception as exc:
            raise _ApiError(400, "invalid", f"Invalid JSON payload received. {exc}") from None
        self._validate(doc, zone)
        if (zone, doc.name) in self.vms:
            where = f"{self._link(zone)}/instances/{doc.name}"
            raise _ApiError(409, "alreadyExists", f"The resource '{where}' already exists")
        self._next_id += 1
        doc.id = self._next_id
        doc.kind = "compute#instance"
        doc.zone = self._link(zone)
        doc.self_link = f"{self._link(zone)}/instances/{doc.name}"
        doc.status = "PROVISIONING"
        doc.creation_timestamp = _rfc3339(time.time())
        for k, nic in enumerate(doc.network_interfaces):
            # the machines share this host's network: every internal IP is the loopback (two
            # cannot listen on one port, as two VMs on one subnet could)
            nic.name, nic.network_i_p = f"nic{k}", LOOPBACK
        op = self._operation(zone, "insert", doc)
        code = self._capacity_fault(zone, doc.name)
        if code is not None:  # the operation fails; no instance is left behind
            op.status = gce.Operation.Status.DONE
            op.end_time = _rfc3339(time.time())
            op.http_error_status_code = CAPACITY_STATUS[code]
            op.error = gce.Error(
                errors=[gce.Errors(code=code, message=_capacity_message(code, zone))]
            )
            return _ok(op)
        self.vms[(zone, doc.name)] = _Vm(doc, zone, pending_ops=[op.name])
        return _ok(op)

    def _validate(self, doc: Any, zone: str) -> None:
        """What the real API checks before it accepts an insert, in its words."""
        types, gpus = self.places[zone]
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", doc.name or ""):
            raise _ApiError(
                400,
                "invalid",
                f"Invalid value for field 'resource.name': "
                f"'{doc.name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}"
                "[a-z0-9])?)'",
            )
        machine_type = (doc.machine_type or "").rsplit("/", 1)[-1]
        if machine_type not in types:
            raise _ApiError(
                400,
                "invalid",
                f"Invalid value for field 'resource.machineType': "
                f"'{doc.machine_type}'. Machine type with name '{machine_type}' "
                f"does not exist in zone '{zone}'.",
            )
        for acc in doc.guest_accelerators:
            name = (acc.accelerator_type or "").rsplit("/", 1)[-1]
            if name not in gpus:
                raise _ApiError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource."
                    f"guestAccelerators[0].acceleratorType': '{acc.accelerator_type}'"
                    f". Accelerator type '{name}' does not exist in zone '{zone}'.",
                )
        if not doc.disks or not any(d.boot for d in doc.disks):
            raise _ApiError(
                400,
                "invalid",
                "Invalid value for field 'resource.disks': ''. Boot disk must be specified.",
            )

    def _operation(self, zone: str, kind: str, doc: Any) -> Any:
        from google.cloud import compute_v1 as gce

        self._next_id += 1
        now = time.time()
        name = f"operation-{int(now * 1000)}-{self._next_id}"
        op = gce.Operation(
            kind="compute#operation",
            id=self._next_id,
            name=name,
            zone=self._link(zone),
            operation_type=kind,
            target_link=doc.self_link,
            target_id=doc.id,
            status=gce.Operation.Status.RUNNING,
            progress=0,
            insert_time=_rfc3339(now),
            start_time=_rfc3339(now),
            self_link=f"{self._link(zone)}/operations/{name}",
            user="system" if kind.startswith("compute.") else "spotwise@emulated",
        )
        self.operations[name] = (zone, op)
        self._changed.notify_all()
        return op

    def _done(self, name: str) -> None:
        from google.cloud import compute_v1 as gce

        op = self.operations[name][1]
        op.status, op.progress, op.end_time = gce.Operation.Status.DONE, 100, _rfc3339(time.time())
        self._changed.notify_all()

    def _delete(self, vm: _Vm, name: str) -> Any:
        op = self._operation(vm.zone, "delete", vm.doc)
        vm.pending_ops.append(op.name)
        if vm.doc.status in ("TERMINATED", "PROVISIONING", "STAGING"):
            self._gone(vm)  # nothing runs: deleted at once
        elif vm.doc.status != "STOPPING":
            vm.doc.status = "STOPPING"
            if vm.machine is not None:  # the guest's ACPI shutdown, then off
                _killpg(vm.machine.proc.pid, signal.SIGTERM)
                vm.machine.off_at = time.time() + self.stop_grace_s
        return op

    def _gone(self, vm: _Vm) -> None:
        if vm.machine is not None:
            self._power_off(vm.machine)
        for name in vm.pending_ops:
            self._done(name)
        self.vms.pop((vm.zone, vm.doc.name), None)

    def _link(self, zone: str) -> str:
        return f"https://www.googleapis.com{API}{self.project}/zones/{zone}"

    # --- the machines ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                with self._lock:
                    self.tick(time.time())
            except Exception as exc:  # keep the machines supervised
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stopping.wait(self.poll_s)

    def tick(self, now: float) -> None:
        for vm in list(self.vms.values()):
            if vm.doc.status == "PROVISIONING":
                self._boot(vm, now)
                continue
            m = vm.machine
            if m is None or vm.doc.status == "TERMINATED":
                continue
            due = m.notice_at is not None and now >= m.notice_at and not m.preempting
            if due and vm.doc.status == "RUNNING":
                m.preempting = True
                m.metadata.trigger_notice()
                _killpg(m.proc.pid, signal.SIGTERM)  # ACPI soft off: the guest shuts down
                m.off_at = now + self.notice_lead_s
                vm.doc.status = "STOPPING"
            ended = m.proc.poll() is not None
            if ended or (m.off_at is not None and now >= m.off_at):
                self._off(vm)

    def _off(self, vm: _Vm) -> None:
        """The guest has powered off (its script ended, or the deadline came)."""
        assert vm.machine is not None
        self._power_off(vm.machine)
        if vm.machine.preempting:
            # Spot with instanceTerminationAction DELETE: recorded, then deleted
            self._done(self._operation(vm.zone, "compute.instances.preempted", vm.doc).name)
            self._gone(vm)
        elif vm.doc.status == "STOPPING":  # instances.delete
            self._gone(vm)
        else:  # shut down from inside: the instance stays, TERMINATED
            vm.doc.status = "TERMINATED"

    def _boot(self, vm: _Vm, now: float) -> None:
        name = vm.doc.name
        items = {i.key: i.value for i in vm.doc.metadata.items}
        home = self.workdir / f"{vm.zone}-{name}-{vm.doc.id}"
        home.mkdir(parents=True, exist_ok=True)
        script = items.get("startup-script", "")
        (home / "startup-script").write_text(script)
        spot = vm.doc.scheduling.provisioning_model == "SPOT"
        metadata = GcpMetadataEmulator(
            name=name,
            zone=vm.zone,
            preemptible=spot,
            machine_type=vm.doc.machine_type.rsplit("/", 1)[-1],
            project=self.project,
        )
        metadata.start()
        with open(home / "console.log", "ab") as console:  # (the serial port's output)
            proc = machine_root.start(
                ["/bin/bash", "-c", script, "startup-script"],
                machine_dir=home / "machine",
                image=self._image,
                env=self._guest_env(metadata.host_port),
                hide=[self.workdir],
                stdout=console,
            )
        m = Machine(proc, metadata, home)
        index, self.booted = self.booted, self.booted + 1
        after = self.interrupt_after_s[index] if index < len(self.interrupt_after_s) else None
        if after is not None and spot:
            m.notice_at = now + after
        vm.machine, vm.booted_at = m, now
        vm.doc.status = "RUNNING"
        vm.doc.last_start_timestamp = _rfc3339(now)
        for op in vm.pending_ops:
            self._done(op)
        vm.pending_ops.clear()

    def _guest_env(self, metadata_host: str) -> dict[str, str]:
        """What the guest's processes see: the image's PATH, its metadata server, and what its
        service account would reach (the job store, ``machine_env``)."""
        bin_dir = self.python_bin or os.path.dirname(sys.executable)
        env = {
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            **self.machine_env,
            "GCE_METADATA_HOST": metadata_host,
            "SPOTWISE_PLATFORM": "gcp",
            "SPOTWISE_GCE_EMULATED": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        if os.environ.get("PYTHONPATH"):  # where this spotwise lives, as installed on the image
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return env

    def _power_off(self, m: Machine) -> None:
        if m.proc.poll() is None:
            _killpg(m.proc.pid, signal.SIGKILL)
            m.proc.wait()
        m.metadata.stop()
        machine_root.discard(m.home / "machine")


class _ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def _ok(message: Any) -> Response:
    body = type(message).to_json(message, use_integers_for_enums=False, indent=None)
    return Response(200, body.encode(), {"Content-Type": "application/json; charset=UTF-8"})


def _error(status: int, reason: str, message: str) -> Response:
    """Google's error JSON (what ``google.api_core.exceptions.from_http_response`` reads)."""
    domain = "usageLimits" if status == 429 else "global"
    doc = {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": domain, "reason": reason}],
        }
    }
    return Response(status, json_body(doc), {"Content-Type": "application/json; charset=UTF-8"})


def _capacity_message(code: str, zone: str) -> str:
    if code == "QUOTA_EXCEEDED":
        return f"Quota 'PREEMPTIBLE_NVIDIA_GPUS' exceeded. Limit: 0.0 in region {zone[:-2]}."
    return (
        f"The zone 'projects/spotwise-project/zones/{zone}' does not have enough resources "
        "available to fulfill the request. Try a different zone, or try again later."
    )


def _matches(message: Any, text: str) -> bool:
    """The list ``filter`` subset: ``field = "value"`` terms (``labels.KEY``, ``!=``), each in
    parentheses when there are several, joined by AND (implicit or written). Exact matches."""
    doc = type(message).to_dict(message, use_integers_for_enums=False)
    for path, op, want in _terms(text):
        head, *keys = path.split(".")
        value: Any = doc.get(re.sub(r"(?<!^)(?=[A-Z])", "_", head).lower())
        for key in keys:  # map keys (labels.KEY) as written
            value = value.get(key) if isinstance(value, dict) else None
        if (str(value) == want) != (op == "="):
            return False
    return True


def _terms(text: str) -> list[tuple[str, str, str]]:
    text = text.strip()
    if not text:
        return []
    parts = re.split(r"\)\s*(?:AND\s*)?\(", text.strip("()")) if text.startswith("(") else [text]
    terms = []
    for part in parts:
        m = re.fullmatch(r'\s*([A-Za-z][\w.-]*)\s*(!?=)\s*(?:"([^"]*)"|(\S+))\s*', part)
        if m is None:
            raise _ApiError(400, "invalid", f"Invalid list filter expression '{text}'.")
        terms.append((m[1], m[2], m[3] if m[3] is not None else m[4]))
    return terms


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return


def _image_family(project: str, family: str) -> Response:
    """images.getFromFamily of the public image projects the provider boots from."""
    from google.cloud import compute_v1 as gce

    if family not in IMAGE_FAMILIES.get(project, ()):
        raise _ApiError(
            404,
            "notFound",
            f"The resource '{API[1:]}{project}/global/images/family/{family}' was not found",
        )
    return _ok(gce.Image(name=f"{family}-v20261201", family=family, status="READY"))
