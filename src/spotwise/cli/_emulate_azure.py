"""``spotwise emulate azure-compute``: a loopback Azure Resource Manager with VMs, plus S3.

Serves the subset of ARM the ``azure`` provider uses (``spotwise.emulators.azure_compute``)
and a moto S3 for the job's checkpoints and exit records; each VM runs its custom data as a
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
    s3_port: int = typer.Option(0, help="Port of the S3 endpoint (0: any free port)."),
    bucket: list[str] = typer.Option([], help="Create this S3 bucket (repeatable)."),
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
    """Emulate Azure Resource Manager (VMs, disks, NICs) + S3 on 127.0.0.1."""
    from spotwise.cli._emulate_serve import listen, loopback_aws, serve_until
    from spotwise.emulators.azure_compute import SUBSCRIPTION

    aws = loopback_aws(s3_port, bucket, "azure-compute")
    home = workdir or Path(tempfile.mkdtemp(prefix="spotwise-azure-"))
    arm = AzureComputeEmulator(
        home,
        port=port,
        interrupt_after_s=interrupt_after,
        notice_lead_s=notice_lead,
        stop_grace_s=stop_grace,
        machine_env=aws.env(),
    )
    try:
        for text in fault:
            add_fault(arm, text)
        url = listen(arm, arm.host, port)
    except BaseException:
        aws.server.stop()
        raise
    typer.echo(f"azure-compute emulator listening on {url} (VMs in {home})")
    typer.echo(f"subscription_id: {SUBSCRIPTION}, resource_group: {arm.resource_groups[0]}")
    serve_until(
        duration, {"SPOTWISE_AZURE_ENDPOINT_URL": url, **aws.env()}, arm.stop, aws.server.stop
    )


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
