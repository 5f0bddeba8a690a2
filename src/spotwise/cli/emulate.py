"""``spotwise emulate aws|gcp|azure|ec2|kubernetes|...``: rehearse a preemption on a laptop.

Starts a loopback metadata server that announces an interruption after ``--notice-after``
seconds; point the training process at it with the printed environment variable. ``ec2`` runs
a whole loopback EC2 + S3 (moto) with machines behind it, for rehearsing a job file with the
``aws`` provider; ``gcp-compute`` the same for the ``gcp`` provider (a loopback Compute
Engine API); ``kubernetes`` a loopback Kubernetes API with pods as local processes; ``gcs`` and
``azure-blob`` the object stores of ``gs://`` and ``az://`` run dirs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from spotwise.cli._emulate_serve import listen, loopback_aws, serve_until
from spotwise.errors import ConfigError

FAULT_HELP = (
    "Inject a fault: an HTTP status (429, 500, 503...), 'hang' (no answer), 'malformed' "
    "(broken body) or 'close' (drop the connection)."
)
# options the doubles share
HOST = typer.Option("127.0.0.1", help="Address to bind.")
FAULT = typer.Option(None, help=FAULT_HELP)
FAULT_COUNT = typer.Option(None, help="Requests the fault applies to (default all).")
FAULT_ON = typer.Option("", help="Only requests whose path contains this.")
DURATION = typer.Option(None, help="Stop after this many seconds.")


def register(app: typer.Typer) -> None:
    emulate = typer.Typer(
        help=(
            "Run a loopback cloud metadata server that announces a spot interruption, to "
            "rehearse a preemption locally. Binds 127.0.0.1; stops on Ctrl-C."
        ),
        no_args_is_help=True,
    )
    app.add_typer(emulate, name="emulate")
    _register_ec2(emulate)
    from spotwise.cli._emulate_k8s import kubernetes

    emulate.command("kubernetes")(kubernetes)
    from spotwise.cli._emulate_gcp import gcp_compute

    emulate.command("gcp-compute")(gcp_compute)
    from spotwise.cli._emulate_azure import azure_compute

    emulate.command("azure-compute")(azure_compute)
    from spotwise.cli._emulate_storage import azure_blob, gcs

    emulate.command("gcs")(gcs)
    emulate.command("azure-blob")(azure_blob)

    emulate.command("aws")(aws)
    emulate.command("gcp")(gcp)
    emulate.command("azure")(azure)


def aws(
    port: int = typer.Option(1338, help="Port to listen on (0: any free port)."),
    host: str = HOST,
    notice_after: float = typer.Option(
        None, "--notice-after", help="Seconds until spot/instance-action appears."
    ),
    action: str = typer.Option("terminate", help="terminate, stop or hibernate."),
    lead: float = typer.Option(120.0, help="Seconds from the notice to the action time."),
    rebalance_after: float = typer.Option(
        None, "--rebalance-after", help="Seconds until a rebalance recommendation appears."
    ),
    imdsv2_required: bool = typer.Option(
        False, "--imdsv2-required", help="Refuse token-less (IMDSv1) requests with 401."
    ),
    instance_type: str = typer.Option("p3.2xlarge", help="meta-data/instance-type."),
    region: str = typer.Option("us-east-1", help="meta-data/placement/region."),
    zone: str = typer.Option(
        None, help="meta-data/placement/availability-zone (default: the region + 'a')."
    ),
    clock_skew: float = typer.Option(0.0, help="Seconds the emulated clock runs ahead."),
    fault: str = FAULT,
    fault_count: int = FAULT_COUNT,
    fault_on: str = FAULT_ON,
    duration: float = DURATION,
) -> None:
    """Emulate the AWS EC2 instance metadata service (IMDSv1/v2 spot notices)."""
    from spotwise.emulators.aws import AwsImdsEmulator

    emu = _build(
        AwsImdsEmulator,
        port=port,
        host=host,
        notice_after=notice_after,
        action=action,
        lead_s=lead,
        rebalance_after=rebalance_after,
        imdsv2_required=imdsv2_required,
        instance_type=instance_type,
        region=region,
        zone=zone,
        clock_skew_s=clock_skew,
    )
    _serve(emu, "AWS_EC2_METADATA_SERVICE_ENDPOINT", None, fault, fault_count, fault_on, duration)


def gcp(
    port: int = typer.Option(1339, help="Port to listen on (0: any free port)."),
    host: str = HOST,
    notice_after: float = typer.Option(
        None, "--notice-after", help="Seconds until the event happens."
    ),
    event: str = typer.Option(
        "preempted", help="preempted, maintenance-terminate or maintenance-migrate."
    ),
    zone: str = typer.Option("us-central1-a", help="instance/zone."),
    machine_type: str = typer.Option("n1-standard-8", help="instance/machine-type."),
    name: str = typer.Option("spotwise-vm", help="instance/name."),
    project: str = typer.Option("spotwise-project", help="project/project-id."),
    fault: str = FAULT,
    fault_count: int = FAULT_COUNT,
    fault_on: str = FAULT_ON,
    duration: float = DURATION,
) -> None:
    """Emulate the GCP Compute Engine metadata server (preempted, maintenance-event)."""
    from spotwise.emulators.gcp import GcpMetadataEmulator

    emu = _build(
        GcpMetadataEmulator,
        port=port,
        host=host,
        notice_after=notice_after,
        event=event,
        zone=zone,
        machine_type=machine_type,
        name=name,
        project=project,
    )
    _serve(emu, "GCE_METADATA_HOST", "host_port", fault, fault_count, fault_on, duration)


def azure(
    port: int = typer.Option(1340, help="Port to listen on (0: any free port)."),
    host: str = HOST,
    notice_after: float = typer.Option(
        None, "--notice-after", help="Seconds until the event is scheduled."
    ),
    event_type: str = typer.Option(
        "Preempt", help="Preempt, Terminate, Reboot, Redeploy or Freeze."
    ),
    lead: float = typer.Option(30.0, help="Seconds from the event to its NotBefore."),
    vm_name: str = typer.Option("spotwise-vm", help="This VM's name."),
    location: str = typer.Option("eastus", help="compute.location."),
    vm_size: str = typer.Option("Standard_NC6s_v3", help="compute.vmSize."),
    zone: str = typer.Option("1", help="compute.zone (availability zone number)."),
    other_vm: bool = typer.Option(
        False, "--other-vm", help="Schedule the event for another VM (must be ignored)."
    ),
    clock_skew: float = typer.Option(0.0, help="Seconds the emulated clock runs ahead."),
    fault: str = FAULT,
    fault_count: int = FAULT_COUNT,
    fault_on: str = FAULT_ON,
    duration: float = DURATION,
) -> None:
    """Emulate Azure Scheduled Events (Preempt and friends, StartRequests acks)."""
    from spotwise.emulators.azure import AzureScheduledEventsEmulator

    emu = _build(
        AzureScheduledEventsEmulator,
        port=port,
        host=host,
        notice_after=notice_after,
        event_type=event_type,
        lead_s=lead,
        vm_name=vm_name,
        resources=["another-vm"] if other_vm else None,
        location=location,
        vm_size=vm_size,
        zone=zone,
        clock_skew_s=clock_skew,
    )
    _serve(emu, "SPOTWISE_AZURE_METADATA_ENDPOINT", None, fault, fault_count, fault_on, duration)


def _build(cls: Any, **kwargs: Any) -> Any:
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ConfigError(str(exc), hint="see spotwise emulate --help") from None


def _serve(
    emu: Any,
    env_var: str,
    value_attr: str | None,
    fault: str | None,
    fault_count: int | None,
    fault_on: str,
    duration: float | None,
) -> None:
    if fault:
        try:
            emu.inject(fault, fault_count, on=fault_on)
        except ValueError as exc:
            raise ConfigError(str(exc), hint="e.g. --fault 503 --fault-count 3") from None
    url = listen(emu, emu.host, emu.port)
    value = getattr(emu, value_attr) if value_attr else url
    typer.echo(f"{emu.platform} metadata emulator listening on {url}")
    typer.echo(f"export {env_var}={value}")
    announced = False
    started = time.monotonic()
    try:
        while duration is None or time.monotonic() - started < duration:
            if not announced and emu.notice_visible_wall is not None:
                typer.echo(f"notice visible at t+{time.monotonic() - started:.1f}s")
                announced = True
            time.sleep(0.2)
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        emu.stop()


EC2_FAULT_HELP = (
    "Inject EC2 API errors: OPERATION=CODE[:COUNT], e.g. RunInstances="
    "InsufficientInstanceCapacity:2, DescribeInstances=RequestLimitExceeded:3, RunInstances=500. "
    "Repeatable."
)
_THROTTLE = {"RequestLimitExceeded", "Throttling", "ThrottlingException"}


def parse_ec2_fault(text: str) -> Any:
    """``RunInstances=InsufficientInstanceCapacity:2`` -> a fault-proxy Fault on that action."""
    from spotwise.emulators.fault_proxy import Fault

    action, sep, rest = text.partition("=")
    code, _, count = rest.partition(":")
    if not sep or not action.isalnum() or not code or (count and not count.isdigit()):
        raise ConfigError(
            f"--fault {text!r} is not OPERATION=CODE[:COUNT]",
            hint="e.g. --fault RunInstances=InsufficientInstanceCapacity:2",
        )
    status = (
        int(code)
        if code.isdigit()
        else 503
        if code in _THROTTLE
        else 500
        if code in ("InsufficientInstanceCapacity", "InternalError")
        else 400
    )
    name = "InternalError" if code.isdigit() else code
    return Fault(
        "status",
        method="POST",
        body_contains=f"Action={action}&",
        times=int(count) if count else 1_000_000,
        status=status,
        code=name,
        message=f"{name} (injected by spotwise emulate ec2)",
    )


def _register_ec2(emulate: typer.Typer) -> None:
    @emulate.command("ec2")
    def ec2(
        port: int = typer.Option(5000, help="Port of the EC2/S3 endpoint (0: any free port)."),
        region: str = typer.Option("us-east-1", help="Region the machines run in."),
        bucket: list[str] = typer.Option([], help="Create this S3 bucket (repeatable)."),
        interrupt_after: list[float] = typer.Option(
            [],
            help="Seconds after the N-th instance starts that its spot notice appears "
            "(repeat once per instance, in launch order).",
        ),
        notice_lead: float = typer.Option(120.0, help="Seconds from the notice to the kill."),
        stop_grace: float = typer.Option(
            30.0, help="Seconds from TerminateInstances' SIGTERM to the kill."
        ),
        fault: list[str] = typer.Option([], help=EC2_FAULT_HELP),
        workdir: Path = typer.Option(
            None,
            help="Where machines keep user-data and console logs (default: a temporary directory).",
        ),
        duration: float = DURATION,
    ) -> None:
        """Emulate EC2 + S3 on 127.0.0.1: moto keeps the API, machines run as local processes."""
        import tempfile

        from spotwise.emulators.ec2 import Ec2DataPlane
        from spotwise.emulators.fault_proxy import FaultProxy

        faults = [parse_ec2_fault(f) for f in fault]
        aws = loopback_aws(port, bucket, "ec2", region)
        proxy = FaultProxy(aws.url) if faults else None
        for f in faults:
            assert proxy is not None
            proxy.add(f)
        home = workdir or Path(tempfile.mkdtemp(prefix="spotwise-ec2-"))
        plane = Ec2DataPlane(
            aws.url,
            workdir=home,
            region=region,
            interrupt_after_s=interrupt_after,
            notice_lead_s=notice_lead,
            stop_grace_s=stop_grace,
        ).start()
        endpoint = proxy.url if proxy else aws.url
        typer.echo(f"ec2 emulator listening on {endpoint} (machines in {home})")
        stops = [plane.stop, *([proxy.close] if proxy is not None else []), aws.server.stop]
        serve_until(duration, aws.env(endpoint, region), *stops)
