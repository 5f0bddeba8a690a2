"""``gcp``: each attempt is one Compute Engine VM (Spot, deleted on preemption, or on-demand),
or, with ``nodes: N``, N VMs of one zone launched as one (``cloud_nodes``: rank 0 first, its
internal IP in the others' rendezvous, all or none, labels ``spotwise-rank`` /
``spotwise-nodes`` / ``spotwise-launch``; the loss of any VM ends the attempt as on ``sim``).

The VM boots an image family (a Deep Learning VM image by default) and runs its
``startup-script`` metadata, which runs the job's command with ``SPOTWISE_CHECKPOINT_DIR`` in
the job's object store (``store:``: ``gs://``, or any scheme the Storage seam serves) and,
when the command ends, writes the attempt's exit record and output there (``remote_boot``'s
reporter) before the VM powers itself off. The script carries no
credentials: the VM's service account (least scopes) supplies them. Status comes from
``instances.get`` plus that exit record; a VM that is gone without one was preempted when its
zone recorded a ``compute.instances.preempted`` operation for it (a preemption, never an error).

Every VM is labelled ``spotwise-job`` / ``spotwise-attempt`` (labels allow only lowercase, so
the exact job id is also in its ``spotwise-job`` metadata item, which ``find`` matches), which
is how a restarted controller finds the one it lost and deletes the rest. Stockouts and quota
errors (``ZONE_RESOURCE_POOL_EXHAUSTED``, ``QUOTA_EXCEEDED``), in the call or in the insert's
operation, become :class:`CapacityError`: the controller tries the next placement.

``google-cloud-compute`` is imported only when a provider is built (``pip install
'spotwise[gcp]'``). Credentials are Application Default Credentials; ``SPOTWISE_GCP_COMPUTE_
ENDPOINT`` (``spotwise.settings``) points the clients at another API endpoint (``spotwise
emulate gcp-compute``) with anonymous credentials.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import Field

from spotwise.control.pricing import catalog_usd_per_hour
from spotwise.control.providers import cloud_nodes
from spotwise.control.providers.base import (
    MARKETS,
    AttemptStatus,
    Features,
    Handle,
    LaunchRequest,
    NoticeKind,
    Options,
    Phase,
    Prices,
    Pricing,
    parse_options,
)
from spotwise.control.providers.cloud_nodes import Node
from spotwise.control.providers.jobstore import JobStore
from spotwise.control.providers.remote_boot import boot_script, copy_log, exit_record
from spotwise.errors import (
    CapacityError,
    ConfigError,
    ProviderError,
    ProviderUnavailableError,
    SpotwiseError,
    TransientProviderError,
)
from spotwise.market.catalog import GCP_ACCELERATORS
from spotwise.registry import require
from spotwise.retry import RetryPolicy
from spotwise.settings import GCP_COMPUTE_ENDPOINT

if TYPE_CHECKING:
    from spotwise.control.spec import Resources

T = TypeVar("T")

JOB_LABEL, ATTEMPT_LABEL = "spotwise-job", "spotwise-attempt"
# a node of a multi-node attempt: its rank, the attempt's size, and which launch of the attempt
RANK_LABEL, NODES_LABEL, LAUNCH_LABEL = "spotwise-rank", "spotwise-nodes", "spotwise-launch"
# insert errors (the call's or its operation's) that mean "no machine here, now"
CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "QUOTA_EXCEEDED", "quotaExceeded", "RESOURCE_NOT_FOUND_IN_ZONE", "STOCKOUT",
    "resourcePoolExhausted",
})  # fmt: skip
PREEMPTED_OP = "compute.instances.preempted"
BUNDLED_GPU = ("a2-", "a3-", "a4-", "g2-")  # machine types with their GPUs built in
STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
LOGGING_SCOPE = "https://www.googleapis.com/auth/logging.write"
# never written into a startup script: the service account gives the VM its credentials
_SECRET_ENV = re.compile(r"SECRET|TOKEN|PASSWORD|CREDENTIALS|CONNECTION_STRING|^AWS_ACCESS_KEY_ID$")
OP_WAIT_S = 600.0  # longest an insert may take before the launch gives up


class GcpOptions(Options):
    project: str = Field(pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
    zones: list[str] = Field(min_length=1)
    store: str | None = None  # gs://bucket/prefix (any object store): see JobStore
    s3: str | None = None  # store's old spelling (s3:// only), still read
    machine_type: str | None = None  # default: resources.instance_type
    accelerator_type: str | None = None  # default: resources.gpu on an N1 machine type
    accelerator_count: int | None = Field(default=None, ge=1, le=16)
    image_family: str = "common-cu123"
    image_project: str = "deeplearning-platform-release"
    boot_disk_gb: int = Field(default=100, ge=10, le=65536)
    boot_disk_type: str = "pd-balanced"
    kms_key: str | None = None  # a customer-managed key for the boot disk (else Google's)
    service_account: str | None = None  # email; default: the project's compute default
    scopes: list[str] = Field(default_factory=lambda: [STORAGE_SCOPE, LOGGING_SCOPE])
    network: str = "global/networks/default"
    subnetwork: str | None = None
    external_ip: bool = True  # off: the subnet needs Private Google Access / Cloud NAT
    spot_usd_per_hour: float | None = Field(default=None, ge=0)  # default: the catalog's
    ondemand_usd_per_hour: float | None = Field(default=None, ge=0)
    workdir: str | None = None  # on the VM; default: the job's workdir
    setup: list[str] = Field(default_factory=list)  # shell lines run before the command
    python: str = "python3"
    poll_s: float = Field(default=5.0, gt=0)
    grace_s: float = Field(default=30.0, ge=0)  # Compute Engine's 30-second Spot notice


def instance_name(job_id: str, n: int, node: tuple[str, int] | None = None) -> str:
    """A valid, unique VM name for attempt ``n`` or its node ``(launch, rank)`` (names allow
    ``[a-z0-9-]``, 63 characters: the job id's readable part plus a hash of the exact id)."""
    tail = "" if node is None else f"-{node[0]}-{node[1]}"
    slug = re.sub(r"[^a-z0-9-]", "-", job_id.lower())[: 36 - len(tail)].strip("-")
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
    return f"spotwise-{slug}-{n}-{digest}{tail}"


def label_value(job_id: str) -> str:
    """A job id as a label value (lowercase letters, digits, ``_``, ``-``; 63 characters)."""
    return re.sub(r"[^a-z0-9_-]", "_", job_id.lower())[:63]


def _codes(exc: BaseException) -> set[str]:
    """The reasons and codes a Google API error carries."""
    found = {str(e.get("reason", "")) for e in getattr(exc, "errors", None) or [] if e}
    found |= {c for c in CAPACITY_CODES if c in str(getattr(exc, "message", exc))}
    return found - {""}


class GcpProvider:
    name = "gcp"
    Options = GcpOptions

    def __init__(
        self,
        options: dict[str, Any],
        *,
        epoch: float,
        instance_type: str | None,
        preflight: bool = False,
        resources: Resources | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.opts = o = parse_options(GcpOptions, self.name, options)
        self.machine_type = o.machine_type or instance_type or ""
        if not self.machine_type:
            raise ConfigError(
                "provider.gcp.machine_type is not set (nor resources.instance_type)",
                hint="e.g. machine_type: g2-standard-4 (one L4) or n1-standard-8 with "
                "resources.gpu: T4",
            )
        self.gpu, self.gpus = self._accelerator(resources)
        self.zones = tuple(o.zones)
        for zone in self.zones:
            if not re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", zone):
                raise ConfigError(
                    f"provider.gcp.zones: {zone!r} is not a Compute Engine zone",
                    hint="zones are named like us-central1-a (gcloud compute zones list)",
                )
        self.store = JobStore(self.name, o.store, o.s3)
        self.features = Features(
            zones=self.zones,
            spot=True,
            notice=NoticeKind.GCP_METADATA,
            poll_s=o.poll_s,
            grace_s=o.grace_s,
            same_host=False,
            multi_node=True,
            checkpoints=self.store.checkpoints(),
        )
        self.retry = RetryPolicy.from_env()
        self._sleep, self._rand = sleep, random.Random()
        self._gce = require("google.cloud.compute_v1", "gcp", "the gcp provider")
        self._errors = require("google.api_core.exceptions", "gcp", "the gcp provider")
        self._kwargs = self._client_kwargs()
        self.instances = self._client("InstancesClient")
        self.operations = self._client("ZoneOperationsClient")
        if preflight:
            self._preflight()
        self.prices = Prices(
            {
                (m, z): Pricing(self._price(m, z), self._price("on-demand", z))
                for m in MARKETS
                for z in self.zones
            }
        )

    # --- settings --------------------------------------------------------------------------
    def _accelerator(self, resources: Resources | None) -> tuple[str | None, int]:
        """The guest accelerator to attach: none on machine types with built-in GPUs."""
        o = self.opts
        if self.machine_type.startswith(BUNDLED_GPU):
            if o.accelerator_type:
                raise ConfigError(
                    f"provider.gcp.accelerator_type: {self.machine_type} has its GPUs built in",
                    hint="remove accelerator_type (or use an N1 machine type)",
                )
            return None, 0
        gpu = o.accelerator_type
        if gpu is None and resources is not None and resources.gpu and resources.gpu_count:
            gpu = GCP_ACCELERATORS.get(resources.gpu)
            if gpu is None:
                raise ConfigError(
                    f"resources.gpu: {resources.gpu!r} is not a GPU Compute Engine attaches",
                    hint=f"one of {', '.join(GCP_ACCELERATORS)}, or a machine type with built-in "
                    "GPUs (a2-, a3-, g2-) in provider.gcp.machine_type",
                )
        count = o.accelerator_count or (resources.gpu_count if resources else 0) or 1
        return gpu, count if gpu else 0

    def _price(self, market: str, zone: str) -> float:
        """Given in the job file, else the catalog's (an N1 machine: its GPUs' price)."""
        o = self.opts
        given = o.spot_usd_per_hour if market == "spot" else o.ondemand_usd_per_hour
        if given is not None:
            return given
        key = self.machine_type
        if self.gpu:
            gpu = next((k for k, v in GCP_ACCELERATORS.items() if v == self.gpu), self.gpu)
            key = f"n1+{gpu}:{self.gpus}"
        try:
            return catalog_usd_per_hour(key, zone, market, cloud="gcp")
        except ConfigError as exc:
            raise ConfigError(
                exc.message,
                hint="give provider.gcp.spot_usd_per_hour and ondemand_usd_per_hour, or a "
                "machine type the catalog prices (spotwise gpus --json)",
            ) from None

    def _client_kwargs(self) -> dict[str, Any]:
        """Application Default Credentials, or an endpoint override with no credentials."""
        endpoint = GCP_COMPUTE_ENDPOINT.text()
        if endpoint:
            from google.auth.credentials import AnonymousCredentials

            return {
                "credentials": AnonymousCredentials(),
                "client_options": {"api_endpoint": endpoint},
                "transport": "rest",
            }
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        try:
            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        except DefaultCredentialsError as exc:
            raise ProviderUnavailableError(
                f"no Google Cloud credentials: {exc}",
                hint="run `gcloud auth application-default login`, or set "
                "GOOGLE_APPLICATION_CREDENTIALS, with the roles in docs/control.md",
            ) from None
        return {"credentials": credentials, "transport": "rest"}

    def _client(self, kind: str) -> Any:
        return getattr(self._gce, kind)(**self._kwargs)

    # --- calls -----------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """One Compute call: retry 429/5xx with backoff, translate the final failure."""
        e = self._errors
        attempt = 1
        while True:
            try:
                return fn()
            except (SpotwiseError, e.NotFound, e.Conflict):
                raise  # ours, or what the caller handles (gone / already there)
            except Exception as exc:  # vendor errors are translated right here, at the edge
                codes = _codes(exc)
                message = f"{what}: {getattr(exc, 'message', None) or exc}"
                if codes & CAPACITY_CODES:
                    raise CapacityError(
                        f"{message} ({', '.join(sorted(codes))})",
                        hint="another zone or market may have capacity",
                    ) from exc
                retry = isinstance(exc, (e.TooManyRequests, e.ServerError, OSError))
                if retry and attempt < self.retry.max_attempts:
                    self._sleep(self.retry.delay_s(attempt, self._rand.random()))
                    attempt += 1
                    continue
                if retry:
                    raise TransientProviderError(f"{message} after {attempt} tries") from exc
                if isinstance(exc, (e.Unauthenticated, e.Forbidden)):
                    raise ProviderUnavailableError(
                        f"Google Cloud refused the credentials: {message}",
                        hint="grant the roles in docs/control.md to the account running spotwise",
                    ) from exc
                raise ProviderError(message) from exc

    def _preflight(self) -> None:
        """Project, zones, machine type, GPU, image and bucket, before anything is paid."""
        o, e = self.opts, self._errors
        zones = self._client("ZonesClient")
        types = self._client("MachineTypesClient")
        gpus = self._client("AcceleratorTypesClient")
        for zone in self.zones:
            try:
                self._call("zones.get", partial(zones.get, project=o.project, zone=zone))
            except e.NotFound as exc:
                if f"projects/{o.project}'" in str(exc.message):
                    raise ConfigError(
                        f"provider.gcp.project: no project {o.project!r} (or no access to it)",
                        hint="give the project id (gcloud projects list)",
                    ) from None
                raise ConfigError(
                    f"provider.gcp.zones: {zone!r} is not a zone of Compute Engine",
                    hint="gcloud compute zones list",
                ) from None
            try:
                self._call(
                    "machineTypes.get",
                    partial(
                        types.get, project=o.project, zone=zone, machine_type=self.machine_type
                    ),
                )
            except e.NotFound:
                raise ConfigError(
                    f"provider.gcp.machine_type: {self.machine_type!r} is not offered in {zone}",
                    hint=f"gcloud compute machine-types list --zones {zone}",
                ) from None
            if self.gpu:
                try:
                    self._call(
                        "acceleratorTypes.get",
                        partial(gpus.get, project=o.project, zone=zone, accelerator_type=self.gpu),
                    )
                except e.NotFound:
                    key = "accelerator_type" if o.accelerator_type else "zones"
                    raise ConfigError(
                        f"provider.gcp.{key}: GPU {self.gpu!r} is not offered in {zone}",
                        hint=f"gcloud compute accelerator-types list --filter zone:{zone}",
                    ) from None
        images = self._client("ImagesClient")
        try:
            self._call(
                "images.getFromFamily",
                lambda: images.get_from_family(project=o.image_project, family=o.image_family),
            )
        except e.NotFound:
            raise ConfigError(
                f"provider.gcp.image_family: no image family {o.image_family!r} in project "
                f"{o.image_project!r}",
                hint="gcloud compute images list --project " + o.image_project,
            ) from None
        self.store.check()

    # --- the protocol ----------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> Handle:
        zone = req.placement.zone or self.zones[0]
        handle = {
            "n": req.n,
            "job": req.job_id,
            "zone": zone,
            "market": req.placement.market,
            "log": str(req.log_path),
        }
        if req.nodes > 1:
            return {**handle, **self._launch_nodes(req, zone)}
        name = instance_name(req.job_id, req.n)
        vm = self._insert(zone, self._instance(req, name, zone, self.startup_script(req)))
        return {**handle, "id": str(vm.id), "name": name}

    def _insert(self, zone: str, body: Any) -> Any:
        """instances.insert of one VM, waited for: the VM (one an earlier launch of the same
        name made, after a controller's crash, is adopted)."""
        request_id = str(uuid.uuid4())  # the same for each retry of this insert: no duplicate
        try:
            op = self._call(
                "instances.insert",
                lambda: self.instances.insert_unary(
                    request=self._gce.InsertInstanceRequest(
                        project=self.opts.project,
                        zone=zone,
                        instance_resource=body,
                        request_id=request_id,
                    )
                ),
            )
            self._finish(op, zone)
        except self._errors.Conflict:
            pass  # an earlier launch of this attempt (a crashed controller) made it: adopt it
        got = self._get(zone, body.name)
        if got is None:
            raise ProviderError(f"instances.insert: {body.name} in {zone} vanished after insert")
        return got

    def _launch_nodes(self, req: LaunchRequest, zone: str) -> Handle:
        """The attempt's ``req.nodes`` VMs as one launch (``cloud_nodes.start_nodes``: rank 0
        first, its internal IP in the others' rendezvous, all or none), in one zone of the
        job's network (its firewall must let them reach each other: docs/control.md)."""

        def start(k: int, endpoint: str, launch: str) -> tuple[Node, str]:
            name = instance_name(req.job_id, req.n, (launch, k))
            script = self.startup_script(req, node=k, endpoint=endpoint, launch=launch)
            labels = {
                RANK_LABEL: str(k),
                NODES_LABEL: str(req.nodes),
                LAUNCH_LABEL: launch,
            }
            vm = self._insert(zone, self._instance(req, name, zone, script, labels))
            return {"id": str(vm.id), "name": name}, str(vm.network_interfaces[0].network_i_p)

        return cloud_nodes.start_nodes(
            req, start, lambda node: self.terminate({**node, "zone": zone})
        )

    def _finish(self, op: Any, zone: str) -> None:
        """Wait for the insert's operation; its errors are the launch's (capacity or not)."""
        deadline = time.monotonic() + OP_WAIT_S
        done = self._gce.Operation.Status.DONE
        while op.status != done:
            if time.monotonic() > deadline:
                raise TransientProviderError(f"instances.insert: {op.name} not done in time")
            op = self._call(
                "zoneOperations.wait",
                partial(
                    self.operations.wait, project=self.opts.project, zone=zone, operation=op.name
                ),
            )
        errors = list(op.error.errors) if op.error else []
        if not errors:
            return
        codes = {err.code for err in errors}
        message = "; ".join(f"{err.code}: {err.message}" for err in errors)
        if codes & CAPACITY_CODES:
            raise CapacityError(
                f"instances.insert in {zone}: {message}",
                hint="another zone or market may have capacity",
            )
        raise ProviderError(f"instances.insert in {zone}: {message}")

    def _get(self, zone: str, name: str) -> Any | None:
        try:
            return self._call(
                "instances.get",
                lambda: self.instances.get(project=self.opts.project, zone=zone, instance=name),
            )
        except self._errors.NotFound:
            return None

    def status(self, handle: Handle) -> AttemptStatus:
        if "nodes" in handle:
            return cloud_nodes.nodes_status(
                handle, self.status, self.terminate, self.features.grace_s
            )
        vm = self._get(handle["zone"], handle["name"])
        node = cloud_nodes.node_of(handle)
        store = self.store.attempt(handle["job"], handle["n"], node)
        record = exit_record(store)
        if record is not None:
            if handle.get("log"):
                where, rank = self._where(handle), None if node is None else node[1]
                copy_log(store, Path(handle["log"]), handle["n"], where, rank)
            if vm is not None and vm.status != "STOPPING":
                self.terminate(handle)  # done (powered off, TERMINATED): stop paying for its disk
            code, ended = int(record["exit_code"]), float(record["ended_at"])
            started = float(record.get("started_at", ended))
            if record.get("stopping") and code > 128:  # killed by the shutdown's SIGTERM
                return AttemptStatus(
                    Phase.LOST, code, ended, started, detail="stopped before it could save"
                )
            return AttemptStatus(Phase.EXITED, exit_code=code, ended_at=ended, running_at=started)
        if vm is None:
            what = "preempted (Spot)" if self._preempted(handle) else "deleted"
            return AttemptStatus(Phase.LOST, detail=f"{handle['name']} {what}")
        if vm.status in ("PROVISIONING", "STAGING"):
            return AttemptStatus(Phase.STARTING, detail=vm.status)
        if vm.status in ("RUNNING", "STOPPING"):  # stopping: the exit record may still come
            started = vm.last_start_timestamp or vm.creation_timestamp
            running_at = datetime.fromisoformat(started).timestamp() if started else None
            return AttemptStatus(Phase.RUNNING, running_at=running_at, detail=vm.status)
        return AttemptStatus(
            Phase.LOST, detail=f"{handle['name']} {vm.status} without an exit record"
        )

    def _list_instances(self, zone: str, query: str) -> list[Any]:
        request = self._gce.ListInstancesRequest(project=self.opts.project, zone=zone, filter=query)
        return list(self.instances.list(request=request))

    def _preempted(self, handle: Handle) -> bool:
        """Whether the VM's zone recorded its preemption (a ``compute.instances.preempted``
        operation targeting it)."""
        query = f'(operationType = "{PREEMPTED_OP}") (targetId = "{handle["id"]}")'
        ops = self._call(
            "zoneOperations.list",
            lambda: list(
                self.operations.list(
                    request=self._gce.ListZoneOperationsRequest(
                        project=self.opts.project, zone=handle["zone"], filter=query
                    )
                )
            ),
        )
        return any(str(op.target_id) == str(handle["id"]) for op in ops)

    def terminate(self, handle: Handle) -> None:
        """instances.delete (the guest gets its ACPI shutdown, then is off); idempotent."""
        if "nodes" in handle:
            cloud_nodes.terminate_nodes(handle, self.terminate)
            return
        vm = self._get(handle["zone"], handle["name"])
        if vm is None or vm.status == "STOPPING" or str(vm.id) != str(handle["id"]):
            return
        try:
            self._call(
                "instances.delete",
                lambda: self.instances.delete_unary(
                    project=self.opts.project, zone=handle["zone"], instance=handle["name"]
                ),
            )
        except self._errors.NotFound:
            return

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        """The job's VMs that exist, in every zone of the job (matched by the exact id); the
        nodes of a multi-node attempt as its launches (``cloud_nodes.launches``)."""
        query = f'labels.{JOB_LABEL} = "{label_value(job_id)}"'
        found: list[Handle] = []
        nodes: list[cloud_nodes.FoundNode] = []
        for zone in self.zones:
            vms = self._call(
                "instances.list",
                partial(self._list_instances, zone, query),
            )
            for vm in vms:
                meta = {i.key: i.value for i in vm.metadata.items}
                if meta.get(JOB_LABEL) != job_id:
                    continue
                handle = {
                    "n": int(vm.labels.get(ATTEMPT_LABEL, "0")),
                    "id": str(vm.id),
                    "name": vm.name,
                    "job": job_id,
                    "zone": zone,
                    "log": str(attempts_dir.with_name("job.log")),  # as launch's handle
                }
                if NODES_LABEL not in vm.labels:
                    found.append(handle)
                    continue
                nodes.append(
                    cloud_nodes.FoundNode(
                        {k: v for k, v in handle.items() if k != "name"},
                        {"id": handle["id"], "name": vm.name},
                        rank=int(vm.labels[RANK_LABEL]),
                        nodes=int(vm.labels[NODES_LABEL]),
                        launch=vm.labels.get(LAUNCH_LABEL, ""),
                        ending=vm.status == "STOPPING",  # being deleted or preempted
                    )
                )
        return found + cloud_nodes.launches(nodes)

    # --- pieces ----------------------------------------------------------------------------
    def _instance(
        self,
        req: LaunchRequest,
        name: str,
        zone: str,
        script: str,
        node_labels: dict[str, str] | None = None,
    ) -> Any:
        """The ``instances.insert`` body of one attempt's VM (``node_labels``: of one node)."""
        g, o = self._gce, self.opts
        labels = {**self._labels(req), **(node_labels or {})}
        spot = req.placement.market == "spot"
        scheduling = g.Scheduling(
            on_host_maintenance="TERMINATE",  # GPUs cannot live-migrate
            automatic_restart=False,
            provisioning_model="SPOT" if spot else "STANDARD",
        )
        if spot:
            scheduling.instance_termination_action = "DELETE"
        disk = g.AttachedDisk(
            boot=True,
            auto_delete=True,
            initialize_params=g.AttachedDiskInitializeParams(
                source_image=f"projects/{o.image_project}/global/images/family/{o.image_family}",
                disk_size_gb=o.boot_disk_gb,
                disk_type=f"zones/{zone}/diskTypes/{o.boot_disk_type}",
                labels=labels,
            ),
        )
        if o.kms_key:
            disk.disk_encryption_key = g.CustomerEncryptionKey(kms_key_name=o.kms_key)
        body = g.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{self.machine_type}",
            labels=labels,
            scheduling=scheduling,
            disks=[disk],
            network_interfaces=[self._nic()],
            service_accounts=[
                g.ServiceAccount(email=o.service_account or "default", scopes=list(o.scopes))
            ],
            metadata=g.Metadata(
                items=[
                    g.Items(key="startup-script", value=script),
                    g.Items(key=JOB_LABEL, value=req.job_id),
                ]
            ),
        )
        if self.gpu:
            body.guest_accelerators = [
                g.AcceleratorConfig(
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{self.gpu}",
                    accelerator_count=self.gpus,
                )
            ]
        return body

    def _nic(self) -> Any:
        """The VM's network interface: the network (and subnetwork) set, an external IP only
        when asked."""
        g, o = self._gce, self.opts
        nic = g.NetworkInterface(network=o.network)
        if o.subnetwork:
            nic.subnetwork = o.subnetwork
        if o.external_ip:
            nic.access_configs = [g.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        return nic

    def _labels(self, req: LaunchRequest) -> dict[str, str]:
        return {JOB_LABEL: label_value(req.job_id), ATTEMPT_LABEL: str(req.n)}

    def startup_script(
        self, req: LaunchRequest, node: int = 0, endpoint: str = "", launch: str = ""
    ) -> str:
        """The VM's startup script, or that of node ``node`` of the multi-node launch
        ``launch`` whose rendezvous is at ``endpoint`` (bash; no credentials in it: the
        service account's)."""
        if req.env_from:
            raise ConfigError(
                f"env_from {sorted(req.env_from)}: the gcp provider resolves no secret "
                "references on the VM",
                hint="give the VM's service account access to the secret and fetch it in "
                "provider.gcp.setup",
            )
        leaked = sorted(k for k in req.env if _SECRET_ENV.search(k))
        if leaked:
            raise ConfigError(
                f"env {leaked} would be written into the VM's startup script (its metadata)",
                hint="remove them from the job's env: the VM's service account "
                "(provider.gcp.service_account) gives it credentials",
            )
        where = (launch, node) if req.nodes > 1 else None
        return boot_script(
            cloud_nodes.node_request(req, self.opts.python, node, endpoint),
            python=self.opts.python,
            workdir=self.opts.workdir,
            setup=self.opts.setup,
            report_uri=self.store.attempt_uri(req.job_id, req.n, where),
            shutdown_if='[ "${SPOTWISE_GCE_EMULATED:-0}" != 1 ]',
        )

    def _where(self, handle: Handle) -> str:
        node = "" if handle.get("node") is None else f" (node {handle['node']})"
        return f"gcp {handle['zone']}/{handle['name']}{node}"
