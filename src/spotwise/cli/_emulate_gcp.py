"""``spotwise emulate gcp-compute``: a loopback Compute Engine API + a job store to rehearse with.

The official ``google-cloud-compute`` clients (the ``gcp`` provider) reach it through the
printed ``SPOTWISE_GCP_COMPUTE_ENDPOINT``; each VM runs its startup script as a local process
with its own GCP metadata server and is preempted on the given schedule, so
``spotwise launch examples/digits/job-gcp.yaml`` can be tried before paying for a VM. The job's
store is a loopback GCS (``--store gs``, the default) or moto's S3 (``--store s3``) started
beside it; the VMs get its endpoint in their environment, as a service account would reach it.
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
    store: str = typer.Option("gs", help="The job store: gs (a GCS double) or s3 (moto)."),
    store_port: int = typer.Option(
        0, "--store-port", "--s3-port", help="Port of the job store (0: any)."
    ),
    project: str = typer.Option("spotwise-project", help="The one project the API knows."),
    bucket: list[str] = typer.Option([], help="Create this bucket in the store (repeatable)."),
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
    """Emulate the Compute Engine API (+ GCS or S3) on 127.0.0.1: VMs run as local processes."""
    from spotwise.registry import require

    require("google.cloud.compute_v1", "gcp", "spotwise emulate gcp-compute")
    from spotwise.cli._emulate_serve import listen, serve_until
    from spotwise.cli._emulate_storage import loopback_store
    from spotwise.emulators.gcp_compute import GcpComputeEmulator
    from spotwise.settings import GCP_COMPUTE_ENDPOINT

    if store not in ("gs", "s3"):
        raise ConfigError(
            f"--store {store!r}: the gcp provider's stores here are gs and s3",
            hint="--store gs (a GCS double, the default) or --store s3 (moto)",
        )
    faults = [parse_fault(f) for f in fault]
    exports, stop_store = loopback_store(store, store_port, bucket, "gcp-compute")
    home = workdir or Path(tempfile.mkdtemp(prefix="spotwise-gce-"))
    double = GcpComputeEmulator(
        home,
        port=port,
        project=project,
        interrupt_after_s=interrupt_after,
        notice_lead_s=notice_lead,
        stop_grace_s=stop_grace,
        machine_env=exports,
    )
    try:
        for code, count, zone in faults:
            try:
                double.fail("insert", code, count, zone)
            except ValueError as exc:
                raise ConfigError(str(exc), hint=FAULT_HELP) from None
        url = listen(double, "127.0.0.1", port)
    except ConfigError:
        stop_store()
        raise
    typer.echo(f"gcp-compute emulator listening on {url} (VMs in {home}; {store} store)")
    serve_until(duration, {GCP_COMPUTE_ENDPOINT.name: url, **exports}, double.stop, stop_store)
