"""``azure``: each attempt is an Azure VM (Spot with ``evictionPolicy: Delete``, or regular).

The VM is created in the job's resource group with ``virtual_machines.begin_create_or_update``
(``azure-mgmt-compute``): ``priority: Spot``, ``billingProfile.maxPrice`` (-1: pay up to the
on-demand price, never evicted for price), a managed identity, an encrypted managed OS disk and
a NIC the VM makes itself, both ``deleteOption: Delete`` so they go with it, and tags
``spotwise-job`` / ``spotwise-attempt``. Its custom data (base64, run by cloud-init) is the
boot script of ``remote_boot``: the job's command with its checkpoint directory in the job's
object store (``store:``: ``az://container/prefix`` in the storage account the controller's
``AZURE_STORAGE_*`` variables name, or ``s3://``), then the exit record written there. No
credential is in it: the VM's identity supplies them (the account is passed by its URL).

Status comes from the instance view plus that exit record: a Spot eviction (the Scheduled
Events ``Preempt`` notice, 30 s, then the VM deleted) is a lost machine, a preemption, never
an error. ``SkuNotAvailable``, ``OperationNotAllowed`` (quota) and ``AllocationFailed`` /
``ZonalAllocationFailed`` become :class:`CapacityError` (the next placement is tried; a VM left
``Failed`` is deleted). ``find`` lists the job's VMs, disks, NICs and public IPs by tag.

With ``nodes: N`` an attempt is N VMs in the job's subnet launched as one (``cloud_nodes``:
rank 0 first, its NIC's private IP in the others' rendezvous, all or none, tags
``spotwise-rank`` / ``spotwise-nodes`` / ``spotwise-launch``); the loss of any VM ends the
attempt as on ``sim``.

The SDKs are imported only when a provider is built (``pip install 'spotwise[azure]'``).
Credentials are ``DefaultAzureCredential``'s (environment, managed identity, ``az login``).
``SPOTWISE_AZURE_ENDPOINT_URL`` (``spotwise.settings``) points the clients at another Resource
Manager (``base_url``):
on a loopback address (``spotwise emulate azure-compute``) they use a fixed test token and may
speak plain HTTP there, and only there.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

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
from spotwise.control.providers.jobstore import JobStore
from spotwise.control.providers.remote_boot import boot_script, copy_log, exit_record
from spotwise.errors import (
    CapacityError,
    ConfigError,
    ProviderError,
    ProviderUnavailableError,
    TransientProviderError,
)
from spotwise.registry import require
from spotwise.settings import AZURE_ENDPOINT_URL

if TYPE_CHECKING:
    from spotwise.control.spec import Resources

T = TypeVar("T")

JOB_TAG, ATTEMPT_TAG = "spotwise-job", "spotwise-attempt"
# a node of a multi-node attempt: its rank, the attempt's size, and which launch of the attempt
RANK_TAG, NODES_TAG, LAUNCH_TAG = "spotwise-rank", "spotwise-nodes", "spotwise-launch"
# create errors that mean "no machine of that kind here, now": try another placement
CAPACITY_CODES = frozenset({
    "SkuNotAvailable", "OperationNotAllowed", "AllocationFailed", "ZonalAllocationFailed",
    "OverconstrainedAllocationRequest", "OverconstrainedZonalAllocationRequest",
})  # fmt: skip
ACCOUNT_URL_ENV = "AZURE_STORAGE_ACCOUNT_URL"  # read by the az:// backend on the VM
LOOPBACK_TOKEN = "spotwise-emulator-token"  # good only on a loopback Resource Manager
# never written into custom data: the VM's managed identity is its credential
_SECRET_ENV = re.compile(
    r"^(AZURE_(CLIENT_SECRET|CLIENT_CERTIFICATE_PASSWORD|PASSWORD|STORAGE_KEY|ACCESS_TOKEN"
    r"|STORAGE_CONNECTION_STRING|STORAGE_SAS_TOKEN)"
    r"|AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN|SECURITY_TOKEN))$"
)


class AzureOptions(Options):
    subscription_id: str = Field(pattern=r"^[0-9a-fA-F-]{36}$")
    resource_group: str = Field(pattern=r"^[-\w._()]{1,90}$")
    region: str = Field(pattern=r"^[a-z][a-z0-9]+$")  # e.g. eastus, westeurope
    zones: list[str] = Field(default_factory=lambda: ["1"])  # availability zones; []: regional
    vm_size: str | None = None  # default: resources.instance_type
    # the image: "publisher:offer:sku:version" or a custom image / gallery version resource id
    image: str
    subnet_id: str  # the VM's NIC goes here (no public IP is made)
    ssh_public_key: str  # the admin user's key (password login is disabled)
    admin_username: str = "spotwise"
    identity: str | None = None  # a user-assigned identity's resource id; default: system
    os_disk_gb: int = Field(default=128, ge=30, le=4095)
    disk_type: str = "Premium_LRS"
    # OS disks are always encrypted at rest (platform keys); these add customer keys / host
    disk_encryption_set_id: str | None = None
    encryption_at_host: bool = False
    max_price: float = Field(default=-1, ge=-1)  # USD/hour; -1: up to the on-demand price
    store: str | None = None  # az://container/prefix (any object store): see JobStore
    s3: str | None = None  # store's old spelling (s3:// only), still read
    spot_usd_per_hour: float | None = Field(default=None, ge=0)  # default: the catalog's
    ondemand_usd_per_hour: float | None = Field(default=None, ge=0)
    workdir: str | None = None  # on the VM; default: the job's workdir
    setup: list[str] = Field(default_factory=list)  # shell lines run before the command
    python: str = "python3"
    poll_s: float = Field(default=5.0, gt=0)
    grace_s: float = Field(default=30.0, ge=0)  # Azure's Preempt notice: 30 s at least


def arm_endpoint() -> str | None:
    """The Resource Manager to use instead of Azure's (``SPOTWISE_AZURE_ENDPOINT_URL``)."""
    return AZURE_ENDPOINT_URL.text()


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _LoopbackToken:
    """The credential for a loopback Resource Manager (a double): a fixed token, no secret."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken(LOOPBACK_TOKEN, int(time.time()) + 3600)


def _plain_http_on_loopback() -> Any:
    """A per-call policy that lets the bearer token go over plain HTTP to a loopback address
    (azure-core's supported switch: the ``enforce_https`` request option), nowhere else."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    class PlainHttpOnLoopback(SansIOHTTPPolicy):
        def on_request(self, request: Any) -> None:
            if _loopback(request.http_request.url):
                request.context.options["enforce_https"] = False

    return PlainHttpOnLoopback()


@functools.cache
def _clients(subscription_id: str, endpoint: str | None) -> tuple[Any, Any]:
    """The compute and network clients of a subscription (built once per process: building
    them takes seconds). A loopback ``endpoint`` gets the test token and plain HTTP."""
    compute = require("azure.mgmt.compute", "azure", "the azure provider")
    network = require("azure.mgmt.network", "azure", "the azure provider")
    kwargs: dict[str, Any] = {"retry_total": 4, "retry_backoff_factor": 0.5}
    credential: Any
    if endpoint is not None and _loopback(endpoint):
        credential = _LoopbackToken()
        kwargs["per_call_policies"] = [_plain_http_on_loopback()]
    else:
        identity = require("azure.identity", "azure", "the azure provider")
        credential = identity.DefaultAzureCredential()
    if endpoint is not None:
        kwargs["base_url"] = endpoint
    return (
        compute.ComputeManagementClient(credential, subscription_id, **kwargs),
        network.NetworkManagementClient(credential, subscription_id, **kwargs),
    )


def _code(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None) if error is not None else None
    if code:
        return str(code)
    found = re.search(r"\b(" + "|".join(sorted(CAPACITY_CODES)) + r")\b", str(exc))
    return found.group(1) if found else ""


def _message(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    return str(getattr(error, "message", None) or str(exc).splitlines()[0])


class AzureProvider:
    name = "azure"
    Options = AzureOptions

    def __init__(
        self,
        options: dict[str, Any],
        *,
        epoch: float,
        instance_type: str | None,
        preflight: bool = False,
        resources: Resources | None = None,
    ):
        self.opts = o = parse_options(AzureOptions, self.name, options)
        require("azure.mgmt.compute", "azure", "the azure provider")
        self.store = JobStore(self.name, o.store, o.s3)
        # the VM learns which storage account an az:// store is in by its URL, never a key
        self.account = storage_account_url(self.store) if self.store.scheme == "az" else None
        size = o.vm_size or instance_type or (resources.instance_type if resources else None)
        if not size:
            raise ConfigError(
                "provider.azure.vm_size is not set (nor resources.instance_type)",
                hint="give the VM size, e.g. vm_size: Standard_NC4as_T4_v3",
            )
        self.vm_size = size
        _image(o.image)  # a malformed image name is refused now, not at the first launch
        self.features = Features(
            zones=tuple(f"{o.region}-{z}" for z in o.zones) or (o.region,),
            spot=True,
            notice=NoticeKind.SIGNAL,  # Scheduled Events' Preempt, read by the runtime itself
            poll_s=o.poll_s,
            grace_s=o.grace_s,
            same_host=False,
            multi_node=True,
            checkpoints=self.store.checkpoints(),
        )
        self.compute, self.network = _clients(o.subscription_id, arm_endpoint())
        if preflight:
            self._preflight()
        self.prices = Prices(
            {(m, z): Pricing(self._price(m), self._price("on-demand")) for m in MARKETS
             for z in self.features.zones}
        )  # fmt: skip

    def _price(self, market: str) -> float:
        given = self.opts.spot_usd_per_hour if market == "spot" else self.opts.ondemand_usd_per_hour
        if given is not None:
            return given
        return catalog_usd_per_hour(self.vm_size, self.opts.region, market, cloud="azure")

    # --- calls -----------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """One Resource Manager call (the SDK already retried 429 and 5xx), its failure
        translated: capacity, credentials, transient, or the provider's own message."""
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ServiceRequestError,
            ServiceResponseError,
        )

        try:
            return fn()
        except (ServiceRequestError, ServiceResponseError) as exc:
            raise TransientProviderError(f"{what}: {type(exc).__name__}: {exc}") from exc
        except ClientAuthenticationError as exc:
            raise ProviderUnavailableError(
                f"{what}: Azure refused the credentials: {_message(exc)}",
                hint="sign in (az login, a managed identity or AZURE_CLIENT_ID/AZURE_TENANT_ID "
                "with a federated token) with the RBAC role in docs/control.md",
            ) from exc
        except HttpResponseError as exc:
            code, status = _code(exc), exc.status_code or 0
            if code in CAPACITY_CODES:
                raise CapacityError(
                    f"{what}: {code}: {_message(exc)}",
                    hint="another zone or market may have capacity",
                ) from exc
            if status == 429 or status >= 500:
                raise TransientProviderError(f"{what}: {status} {code}: {_message(exc)}") from exc
            if status == 403 or code == "AuthorizationFailed":
                raise ProviderUnavailableError(
                    f"{what}: {code or status}: {_message(exc)}",
                    hint="grant the identity the RBAC role in docs/control.md on the "
                    "resource group",
                ) from exc
            raise ProviderError(f"{what}: {code or status}: {_message(exc)}") from exc

    def _preflight(self) -> None:
        """Before anything is paid for: the region and VM size exist (resource SKUs), the
        zones offer the size, the resource group is there and the job store is usable."""
        o = self.opts
        skus = self._call(
            "ResourceSkus",
            lambda: list(self.compute.resource_skus.list(filter=f"location eq '{o.region}'")),
        )
        sizes = {s.name: s for s in skus if s.resource_type == "virtualMachines"}
        if not sizes:
            raise ConfigError(
                f"provider.azure.region: {o.region!r} offers no VM sizes to this subscription",
                hint="check the name (az account list-locations -o table)",
            )
        if self.vm_size not in sizes:
            raise ConfigError(
                f"provider.azure.vm_size: {self.vm_size!r} is not offered in {o.region}",
                hint=f"sizes there: {', '.join(sorted(sizes)[:12])}... "
                f"(az vm list-skus -l {o.region} -o table)",
            )
        offered = {
            z for info in (sizes[self.vm_size].location_info or []) for z in info.zones or []
        }
        missing = [z for z in o.zones if z not in offered]
        if missing:
            raise ConfigError(
                f"provider.azure.zones: {self.vm_size} is not offered in zones {missing} of "
                f"{o.region}",
                hint=f"zones with it: {', '.join(sorted(offered)) or 'none (use zones: [])'}",
            )
        try:
            self._call(
                "list VMs",
                lambda: next(iter(self.compute.virtual_machines.list(o.resource_group)), None),
            )
        except ProviderError as exc:
            key = "subscription_id" if "Subscription" in exc.message else "resource_group"
            raise ConfigError(
                f"provider.azure.{key}: {exc.message}",
                hint="az group create -n NAME -l REGION, or fix the name",
            ) from None
        self.store.check()

    # --- the protocol ----------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> Handle:
        leaked = sorted(k for k in req.env if _SECRET_ENV.match(k))
        if leaked:
            raise ConfigError(
                f"env {leaked} would be written into the VM's custom data",
                hint="remove them from the job's env: the VM's managed identity "
                "(provider.azure.identity) is its credential",
            )
        zone = req.placement.zone or self.features.zones[0]
        handle = {
            "n": req.n,
            "job": req.job_id,
            "zone": zone,
            "market": req.placement.market,
            "log": str(req.log_path),
        }
        if req.nodes > 1:
            nodes = self._launch_nodes(req, zone)
            return {**handle, **nodes, "launched_at": time.time()}
        name = f"{req.key}-{req.placement.market[0]}{zone.rsplit('-', 1)[-1]}"[-64:]
        self._create(name, self.vm_body(req, zone))
        return {**handle, "id": name, "launched_at": time.time()}

    def _create(self, name: str, body: dict[str, Any]) -> Any:
        """Create one VM and wait for it: the VirtualMachine (one that fails to allocate is
        deleted: ARM leaves it, not ours to keep)."""
        vms = self.compute.virtual_machines
        try:
            return self._call(
                "create VM",
                lambda: vms.begin_create_or_update(self.opts.resource_group, name, body).result(),
            )
        except CapacityError:
            self._delete(name)
            raise

    def _launch_nodes(self, req: LaunchRequest, zone: str) -> Handle:
        """The attempt's ``req.nodes`` VMs as one launch (``cloud_nodes.start_nodes``: rank 0
        first, its private IP in the others' rendezvous, all or none), in the job's subnet
        (its NSG must let them reach each other: docs/control.md)."""

        def start(k: int, endpoint: str, launch: str) -> tuple[str, str]:
            name = f"{req.key}-{launch}-{k}"[-64:]
            node = {RANK_TAG: str(k), NODES_TAG: str(req.nodes), LAUNCH_TAG: launch}
            script = self.custom_data(req, node=k, endpoint=endpoint, launch=launch)
            vm = self._create(name, self.vm_body(req, zone, script, node))
            return name, self._private_ip(vm)

        return cloud_nodes.start_nodes(req, start, self.terminate)

    def _private_ip(self, vm: Any) -> str:
        """The private address of a VM's primary NIC (the one it made from its config)."""
        nic_id = vm.network_profile.network_interfaces[0].id
        nic = self._call(
            "get NIC",
            lambda: self.network.network_interfaces.get(
                self.opts.resource_group, nic_id.rsplit("/", 1)[-1]
            ),
        )
        return str(nic.ip_configurations[0].private_ip_address)

    def status(self, handle: Handle) -> AttemptStatus:
        if handle.get("kind") in ("disk", "nic", "ip"):  # a stray found by the sweep
            return AttemptStatus(Phase.STARTING, detail=handle["kind"])
        if "nodes" in handle:
            return cloud_nodes.nodes_status(
                handle, self.status, self.terminate, self.features.grace_s
            )
        record = exit_record(self._store(handle))
        if record is not None:
            return self._ended(handle, record)
        from azure.core.exceptions import ResourceNotFoundError

        try:
            view = self._call(
                "instance view",
                lambda: self.compute.virtual_machines.instance_view(
                    self.opts.resource_group, handle["id"]
                ),
            )
        except ProviderError as exc:
            if not isinstance(exc.__cause__, ResourceNotFoundError):
                raise
            # written just before the VM went
            record = exit_record(self._store(handle))
            if record is not None:
                return self._ended(handle, record)
            return AttemptStatus(
                Phase.LOST,
                running_at=handle.get("launched_at"),
                detail=f"VM {handle['id']} is gone (Spot eviction, evictionPolicy Delete, "
                "or deleted)",
            )
        codes = [str(s.code or "") for s in view.statuses or []]
        provisioning = next((c for c in codes if c.startswith("ProvisioningState/")), "")
        power = next((c for c in codes if c.startswith("PowerState/")), "")
        if provisioning.startswith("ProvisioningState/failed"):
            return AttemptStatus(Phase.LOST, detail=f"VM {handle['id']}: {provisioning}")
        if provisioning == "ProvisioningState/deleting" or power == "PowerState/running":
            # (being deleted: the exit record may still come)
            return AttemptStatus(Phase.RUNNING, running_at=handle.get("launched_at"), detail=power)
        if power in ("PowerState/stopped", "PowerState/deallocated"):
            return AttemptStatus(
                Phase.LOST, detail=f"VM {handle['id']} {power} without an exit record"
            )
        return AttemptStatus(Phase.STARTING, detail=provisioning or power)

    def _ended(self, handle: Handle, record: dict[str, Any]) -> AttemptStatus:
        if handle.get("log"):
            node = handle.get("node")
            where = f"azure {handle['id']}" + ("" if node is None else f" (node {node})")
            copy_log(self._store(handle), Path(handle["log"]), handle["n"], where, node)
        self._delete(handle["id"])  # done: stop paying for it
        code, ended = int(record["exit_code"]), float(record["ended_at"])
        started = float(record.get("started_at") or handle.get("launched_at") or ended)
        if record.get("stopping") and code > 128:  # killed by the shutdown's SIGTERM
            return AttemptStatus(Phase.LOST, code, ended, started, detail="stopped before saving")
        return AttemptStatus(Phase.EXITED, exit_code=code, ended_at=ended, running_at=started)

    def _store(self, handle: Handle) -> Any:
        """Where the handle's VM (or node) reports its exit."""
        return self.store.attempt(handle["job"], handle["n"], cloud_nodes.node_of(handle))

    def terminate(self, handle: Handle) -> None:
        """Delete the VM (the OS gets its shutdown, then it is gone) or the stray; idempotent."""
        if "nodes" in handle:
            cloud_nodes.terminate_nodes(handle, self.terminate)
            return
        kind = handle.get("kind", "vm")
        rg = self.opts.resource_group
        if kind == "disk":
            self._call("delete disk", lambda: self.compute.disks.begin_delete(rg, handle["id"]))
        elif kind == "nic":
            self._call(
                "delete NIC", lambda: self.network.network_interfaces.begin_delete(rg, handle["id"])
            )
        elif kind == "ip":
            self._call(
                "delete public IP",
                lambda: self.network.public_ip_addresses.begin_delete(rg, handle["id"]),
            )
        else:
            self._delete(handle["id"])

    def _delete(self, name: str) -> None:
        """Ask ARM to delete a VM and do not wait (a VM already gone answers 204)."""
        self._call(
            "delete VM",
            lambda: self.compute.virtual_machines.begin_delete(self.opts.resource_group, name),
        )

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        """The job's VMs, and the disks, NICs and public IPs tagged with it that outlived
        their VM (``deleteOption`` makes them go with it; a sweep catches the rest)."""
        rg, log = self.opts.resource_group, str(attempts_dir.with_name("job.log"))
        found: list[Handle] = []
        nodes: list[cloud_nodes.FoundNode] = []  # of multi-node launches
        vms = self._call("list VMs", lambda: list(self.compute.virtual_machines.list(rg)))
        attempts = set()
        for vm in vms:
            tags = vm.tags or {}
            if tags.get(JOB_TAG) != job_id:
                continue
            attempts.add(tags.get(ATTEMPT_TAG))
            zone = f"{vm.location}-{vm.zones[0]}" if vm.zones else str(vm.location)
            handle = {"n": int(tags.get(ATTEMPT_TAG, "0")), "id": vm.name, "job": job_id,
                      "zone": zone, "log": log}  # fmt: skip
            if NODES_TAG not in tags:
                found.append(handle)
                continue
            nodes.append(
                cloud_nodes.FoundNode(
                    handle,
                    vm.name,
                    rank=int(tags[RANK_TAG]),
                    nodes=int(tags[NODES_TAG]),
                    launch=tags.get(LAUNCH_TAG, ""),
                    ending=vm.provisioning_state == "Deleting",
                )
            )
        found += cloud_nodes.launches(nodes)
        listings: list[tuple[str, Callable[[], list[Any]]]] = [
            ("disk", lambda: list(self.compute.disks.list_by_resource_group(rg))),
            ("nic", lambda: list(self.network.network_interfaces.list(rg))),
            ("ip", lambda: list(self.network.public_ip_addresses.list(rg))),
        ]
        for kind, listing in listings:
            for item in self._call(f"list {kind}s", listing):
                tags = item.tags or {}
                # one VM per attempt: what an attempt with a VM has is that VM's (in use)
                if tags.get(JOB_TAG) == job_id and tags.get(ATTEMPT_TAG) not in attempts:
                    found.append(
                        {"n": int(tags.get(ATTEMPT_TAG, "0")), "id": item.name, "job": job_id,
                         "kind": kind}
                    )  # fmt: skip
        return found

    # --- pieces ----------------------------------------------------------------------------
    def vm_body(
        self,
        req: LaunchRequest,
        zone: str,
        script: str | None = None,
        node_tags: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """The VirtualMachine of one attempt (or of one node: its custom data and tags), as
        ARM's REST API spells it."""
        o = self.opts
        tags = {JOB_TAG: req.job_id, ATTEMPT_TAG: str(req.n), **(node_tags or {})}
        script = self.custom_data(req) if script is None else script
        custom = base64.b64encode(script.encode()).decode()
        props: dict[str, Any] = {
            "hardwareProfile": {"vmSize": self.vm_size},
            "storageProfile": {"imageReference": _image(o.image), "osDisk": _os_disk(o)},
            "osProfile": _os_profile(o, req.key[-15:].strip("-") or "spotwise", custom),
            "networkProfile": _network_profile(o.subnet_id),
            "securityProfile": {"encryptionAtHost": o.encryption_at_host},
        }
        if req.placement.market == "spot":
            props["priority"] = "Spot"
            props["evictionPolicy"] = "Delete"
            props["billingProfile"] = {"maxPrice": o.max_price}
        identity: dict[str, Any] = (
            {"type": "UserAssigned", "userAssignedIdentities": {o.identity: {}}}
            if o.identity
            else {"type": "SystemAssigned"}
        )
        body: dict[str, Any] = {
            "location": o.region,
            "tags": tags,
            "identity": identity,
            "properties": props,
        }
        if zone != o.region:
            body["zones"] = [zone.rsplit("-", 1)[-1]]
        return body

    def custom_data(
        self, req: LaunchRequest, node: int = 0, endpoint: str = "", launch: str = ""
    ) -> str:
        """The VM's boot script, or that of node ``node`` of the multi-node launch ``launch``
        whose rendezvous is at ``endpoint`` (bash; no credentials in it)."""
        o = self.opts
        if self.account is not None:
            req = replace(req, env={ACCOUNT_URL_ENV: self.account, **req.env})
        where = (launch, node) if req.nodes > 1 else None
        return boot_script(
            cloud_nodes.node_request(req, o.python, node, endpoint),
            python=o.python,
            workdir=o.workdir,
            setup=o.setup,
            report_uri=self.store.attempt_uri(req.job_id, req.n, where),
            shutdown_if='[ -d /var/lib/waagent ] && [ "${SPOTWISE_AZURE_EMULATED:-0}" != 1 ]',
        )


def storage_account_url(store: JobStore) -> str:
    """The blob endpoint of the account an ``az://`` store is in, as the controller's
    ``AZURE_STORAGE_*`` variables name it (the ``az://`` backend's own), for the VM: its
    managed identity signs in there. A connection string gives only its endpoint (never its
    key)."""
    parts = dict(
        item.split("=", 1)
        for item in os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "").split(";")
        if "=" in item
    )  # (the backend's order: the connection string, the account's URL, its name)
    account = os.environ.get("AZURE_STORAGE_ACCOUNT", "").strip()
    if parts.get("BlobEndpoint"):
        url = parts["BlobEndpoint"]
    elif parts.get("AccountName"):
        url = (
            f"https://{parts['AccountName']}.blob.{parts.get('EndpointSuffix', 'core.windows.net')}"
        )
    else:
        url = os.environ.get(ACCOUNT_URL_ENV, "").strip() or (
            f"https://{account}.blob.core.windows.net" if account else ""
        )
    if not url:
        raise ConfigError(
            f"{store.named}: {store.uri} names no storage account",
            hint="set AZURE_STORAGE_ACCOUNT=<account name> (or AZURE_STORAGE_ACCOUNT_URL) "
            "where spotwise runs; the VMs get the account's URL, and sign in with their "
            "managed identity",
        )
    return url.rstrip("/")


def _image(image: str) -> dict[str, str]:
    """``publisher:offer:sku:version`` (a marketplace URN) or a resource id."""
    if image.startswith("/"):
        return {"id": image}
    parts = image.split(":")
    if len(parts) != 4 or not all(parts):
        raise ConfigError(
            f"provider.azure.image: {image!r} is neither publisher:offer:sku:version nor a "
            "resource id",
            hint="e.g. microsoft-dsvm:ubuntu-hpc:2204:latest",
        )
    return dict(zip(("publisher", "offer", "sku", "version"), parts, strict=True))


def _os_disk(o: AzureOptions) -> dict[str, Any]:
    """The OS disk, deleted with the VM, encrypted with the disk encryption set if one is set."""
    os_disk: dict[str, Any] = {
        "createOption": "FromImage",
        "diskSizeGB": o.os_disk_gb,
        "deleteOption": "Delete",
        "managedDisk": {"storageAccountType": o.disk_type},
    }
    if o.disk_encryption_set_id:
        os_disk["managedDisk"]["diskEncryptionSet"] = {"id": o.disk_encryption_set_id}
    return os_disk


def _os_profile(o: AzureOptions, computer_name: str, custom_data: str) -> dict[str, Any]:
    """Linux with its boot script as custom data, SSH keys only."""
    return {
        "computerName": computer_name,
        "adminUsername": o.admin_username,
        "customData": custom_data,
        "linuxConfiguration": {
            "disablePasswordAuthentication": True,
            "ssh": {
                "publicKeys": [
                    {
                        "path": f"/home/{o.admin_username}/.ssh/authorized_keys",
                        "keyData": o.ssh_public_key,
                    }
                ]
            },
        },
    }


def _network_profile(subnet_id: str) -> dict[str, Any]:
    """One NIC in the subnet, deleted with the VM."""
    return {
        "networkApiVersion": "2020-11-01",
        "networkInterfaceConfigurations": [
            {
                "name": "nic",
                "properties": {
                    "primary": True,
                    "deleteOption": "Delete",
                    "ipConfigurations": [
                        {"name": "ip", "properties": {"subnet": {"id": subnet_id}}}
                    ],
                },
            }
        ],
    }
