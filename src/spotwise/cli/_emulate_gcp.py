"""``spotwise emulate gcp-compute``: a loopback Compute Engine API + S3 to rehearse a job file.

The official ``google-cloud-compute`` clients (the ``gcp`` provider) reach it through the
printed ``SPOTWISE_GCP_COMPUTE_ENDPOINT``; each VM runs its startup script as a local process
with its own GCP metadata server and is preempted on the given schedule, so
``spotwise launch examples/digits/job-gcp.yaml`` can be tried before paying for a VM. The job's
run dir is on a moto S3 started beside it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import typer

from spotwise.errors import ConfigError

FAULT_HELP = (
    "Make instances.insert fail: CODE[:COUNT][@ZONE] with CODE ZONE_RESOURCE_POOL_EXHAUSTED, "
    "QUOTA_EXCEEDED or an HTTP status (429, 500, 503), e.g. "
    "ZONE_RESOURCE_POOL_EXHAUSTED:1@us-central1-a. Repeatable."
)


def parse_fault(text: str) -> tuple[str, int, str]:
    """``CODE[:COUNT][@ZONE]`` -> (code, count, zone); no COUNT: every insert."""
    m = re.fullmatch(r"([A-Z_]+|\d{3})(?::(\d+))?(?:@([a-z0-9-]+))?", text)
    if m is None:
        raise ConfigError(
            f"--fault {text!r} is not CODE[:COUNT][@ZONE]",
            hint="e.g. --fault ZONE_RESOURCE_POOL_EXHAUSTED:1@us-central1-a",
        )
    return m[1], int(m[2]) if m[2] else 1_000_000, m[3] or ""


def gcp_compute(
    port: int = typer.Option(5010, help="Port of the Compute API (0: any free port)."),
    s3_port: int = typer.Option(0, help="Port of the S3 endpoint the run dir is on (0: any)."),
    project: str = typer.Option("spotwise-project", help="The one project the API knows."),
    bucket: list[str] = typer.Option([], help="Create this S3 bucket (repeatable)."),
    interrupt_after: list[float] = typer.Option(
        [],
        help="Seconds after the N-th VM boots that it is preempted (repeat once per VM, in "
        "boot order).",
    ),
    notice_lead: float = typer.Option(30.0, help="Seconds from the preemption notice to off."),
    stop_grace: float = typer.Option(90.0, help="Seconds from instances.delete to off."),
    fault: list[str] = typer.Option([], help=FAULT_HELP),
    workdir: Path = typer.Option(
        None, help="Where VMs keep startup scripts and consoles (default: a temporary directory)."
    ),
    duration: float = typer.Option(None, help="Stop after this many seconds."),
) -> None:
    """Emulate the Compute Engine API (+ S3) on 127.0.0.1: VMs run as local processes."""
    from spotwise.registry import require

    require("google.cloud.compute_v1", "gcp", "spotwise emulate gcp-compute")
    from spotwise.cli._emulate_serve import listen, loopback_aws, serve_until
    from spotwise.control.providers.gcp import ENDPOINT_ENV
    from spotwise.emulators.gcp_compute import GcpComputeEmulator

    faults = [parse_fault(f) for f in fault]
    aws = loopback_aws(s3_port, bucket, "gcp-compute")
    home = workdir or Path(tempfile.mkdtemp(prefix="spotwise-gce-"))
    double = GcpComputeEmulator(
        home,
        port=port,
        project=project,
        interrupt_after_s=interrupt_after,
        notice_lead_s=notice_lead,
        stop_grace_s=stop_grace,
        s3_endpoint=aws.url,
    )
    try:
        for code, count, zone in faults:
            try:
                double.fail("insert", code, count, zone)
            except ValueError as exc:
                raise ConfigError(str(exc), hint=FAULT_HELP) from None
        url = listen(double, "127.0.0.1", port)
    except ConfigError:
        aws.server.stop()
        raise
    typer.echo(f"gcp-compute emulator listening on {url} (VMs in {home}; S3 on {aws.url})")
    serve_until(duration, {ENDPOINT_ENV: url, **aws.env()}, double.stop, aws.server.stop)
