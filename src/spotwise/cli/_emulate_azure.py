"""``spotwise emulate azure-compute``: a loopback Azure Resource Manager with VMs, plus S3.

Serves the subset of ARM the ``azure`` provider uses (``spotwise.emulators.azure_compute``)
and a moto S3 for the job's checkpoints and exit records; each VM runs its custom data as a
local process in a root of its own and gets a Scheduled Events ``Preempt`` on schedule, so
``spotwise launch job-azure.yaml`` can be rehearsed before paying for a VM.
"""

from __future__ import annotations

import tempfile
import time
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
    from spotwise.cli.emulate import listen
    from spotwise.emulators.azure_compute import SUBSCRIPTION
    from spotwise.registry import require

    moto_server = require("moto.server", "emulate", "spotwise emulate azure-compute")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    server.start()
    host, bound = server.get_host_and_port()
    s3_url = f"http://{host}:{bound}"
    aws = {
        "AWS_ENDPOINT_URL": s3_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=s3_url, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    for name in bucket:
        s3.create_bucket(Bucket=name)
    home = workdir or Path(tempfile.mkdtemp(prefix="spotwise-azure-"))
    arm = AzureComputeEmulator(
        home,
        port=port,
        interrupt_after_s=interrupt_after,
        notice_lead_s=notice_lead,
        stop_grace_s=stop_grace,
        machine_env=aws,
    )
    try:
        for text in fault:
            add_fault(arm, text)
        url = listen(arm, arm.host, port)
    except BaseException:
        server.stop()
        raise
    typer.echo(f"azure-compute emulator listening on {url} (VMs in {home})")
    typer.echo(f"subscription_id: {SUBSCRIPTION}, resource_group: {arm.resource_groups[0]}")
    for line in (f"SPOTWISE_AZURE_ENDPOINT_URL={url}", *(f"{k}={v}" for k, v in aws.items())):
        typer.echo(f"export {line}")
    started = time.monotonic()
    try:
        while duration is None or time.monotonic() - started < duration:
            time.sleep(0.2)
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        arm.stop()
        server.stop()


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
