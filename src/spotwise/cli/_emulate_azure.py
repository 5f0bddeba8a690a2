"""``spotwise emulate azure-compute``: a loopback Azure Resource Manager with VMs + a job store.

Serves the subset of ARM the ``azure`` provider uses (``spotwise.emulators.azure_compute``)
and the job store for the checkpoints and exit records (an Azure Blob double, ``--store az``,
the default, or moto's S3, ``--store s3``), whose endpoint and test credentials the VMs get in
their environment, as a managed identity would reach it; each VM runs its custom data as a
local process in a root of its own and gets a Scheduled Events ``Preempt`` on schedule, so
``spotwise launch job-azure.yaml`` can be rehearsed before paying for a VM.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from spotwise.emulators.azure_compute import AzureComputeEmulator
from spotwise.errors import ConfigError

FAULT_HELP = (
    "Fail VM creates: CODE[:COUNT], CODE one of SkuNotAvailable, OperationNotAllowed (quota), "
    "AllocationFailed, ZonalAllocationFailed, or an HTTP status (429, 500, 503) for every "
    "request. Repeatable."
)


def azure_compute(
    port: int = typer.Option(1341, help="Port of the Resource Manager (0: any free port)."),
    store: str = typer.Option("az", help="The job store: az (an Azure Blob double) or s3 (moto)."),
    store_port: int = typer.Option(
        0, "--store-port", "--s3-port", help="Port of the job store (0: any free port)."
    ),
    bucket: list[str] = typer.Option(
        [], help="Create this container (az) or bucket (s3) in the store (repeatable)."
    ),
    interrupt_after: list[float] = typer.Option(
        [],
        help="Seconds after the N-th VM runs that its Preempt event appears "
        "(repeat once per VM, in creation order).",
    ),
    notice_lead: float = typer.Option(30.0, help="Seconds from the Preempt event to eviction."),
    stop_grace: float = typer.Option(10.0, help="Seconds from a DELETE's SIGTERM to the kill."),
    fault: list[str] = typer.Option([], help=FAULT_HELP),
    workdir: Path = typer.Option(
        None, help="Where VMs keep custom data and console logs (default: a temporary directory)."
    ),
    duration: float = typer.Option(None, help="Stop after this many seconds."),
) -> None:
    """Emulate Azure Resource Manager (VMs, disks, NICs) + Blob Storage or S3 on 127.0.0.1."""
    from spotwise.cli._emulate_serve import listen, serve_until
    from spotwise.cli._emulate_storage import loopback_store
    from spotwise.emulators.azure_compute import SUBSCRIPTION
    from spotwise.settings import AZURE_ENDPOINT_URL

    if store not in ("az", "s3"):
        raise ConfigError(
            f"--store {store!r}: the azure provider's stores here are az and s3",
            hint="--store az (an Azure Blob double, the default) or --store s3 (moto)",
        )
    exports, stop_store = loopback_store(store, store_port, bucket, "azure-compute")
    home = workdir or Path(tempfile.mkdtemp(prefix="spotwise-azure-"))
    arm = AzureComputeEmulator(
        home,
        port=port,
        interrupt_after_s=interrupt_after,
        notice_lead_s=notice_lead,
        stop_grace_s=stop_grace,
        machine_env=exports,
    )
    try:
        for text in fault:
            add_fault(arm, text)
        url = listen(arm, arm.host, port)
    except BaseException:
        stop_store()
        raise
    typer.echo(f"azure-compute emulator listening on {url} (VMs in {home})")
    typer.echo(f"subscription_id: {SUBSCRIPTION}, resource_group: {arm.resource_groups[0]}")
    serve_until(duration, {AZURE_ENDPOINT_URL.name: url, **exports}, arm.stop, stop_store)


def add_fault(arm: AzureComputeEmulator, text: str) -> None:
    """``ZonalAllocationFailed:2`` (the next two creates) or ``503:3`` (the next three
    requests) onto the double; anything else is a clear error."""
    code, _, count = text.partition(":")
    if count and not count.isdigit():
        raise ConfigError(f"--fault {text!r} is not CODE[:COUNT]", hint="e.g. --fault 429:3")
    times = int(count) if count else None
    try:
        if code.isdigit():
            arm.inject(code, times)
        else:
            arm.fail_next(code, times or 1)
    except ValueError as exc:
        raise ConfigError(f"--fault {text!r}: {exc}", hint=FAULT_HELP) from None
