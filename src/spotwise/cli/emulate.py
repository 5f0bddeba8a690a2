"""``spotwise emulate aws|gcp|azure|kubernetes``: rehearse a preemption on a laptop.

Starts a loopback metadata server that announces an interruption after ``--notice-after``
seconds; point the training process at it with the printed environment variable.
"""

from __future__ import annotations

import time
from typing import Any

import typer

from spotwise.errors import ConfigError

FAULT_HELP = (
    "Inject a fault: an HTTP status (429, 500, 503...), 'hang' (no answer), 'malformed' "
    "(broken body) or 'close' (drop the connection)."
)


def register(app: typer.Typer) -> None:
    emulate = typer.Typer(
        help=(
            "Run a loopback cloud metadata server that announces a spot interruption, to "
            "rehearse a preemption locally. Binds 127.0.0.1; stops on Ctrl-C."
        ),
        no_args_is_help=True,
    )
    app.add_typer(emulate, name="emulate")
    from spotwise.cli._emulate_k8s import kubernetes

    emulate.command("kubernetes")(kubernetes)

    @emulate.command("aws")
    def aws(
        port: int = typer.Option(1338, help="Port to listen on (0: any free port)."),
        host: str = typer.Option("127.0.0.1", help="Address to bind."),
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
        clock_skew: float = typer.Option(0.0, help="Seconds the emulated clock runs ahead."),
        fault: str = typer.Option(None, help=FAULT_HELP),
        fault_count: int = typer.Option(None, help="Requests the fault applies to (default all)."),
        fault_on: str = typer.Option("", help="Only requests whose path contains this."),
        duration: float = typer.Option(None, help="Stop after this many seconds."),
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
            clock_skew_s=clock_skew,
        )
        _serve(
            emu, "AWS_EC2_METADATA_SERVICE_ENDPOINT", None, fault, fault_count, fault_on, duration
        )

    @emulate.command("gcp")
    def gcp(
        port: int = typer.Option(1339, help="Port to listen on (0: any free port)."),
        host: str = typer.Option("127.0.0.1", help="Address to bind."),
        notice_after: float = typer.Option(
            None, "--notice-after", help="Seconds until the event happens."
        ),
        event: str = typer.Option(
            "preempted", help="preempted, maintenance-terminate or maintenance-migrate."
        ),
        fault: str = typer.Option(None, help=FAULT_HELP),
        fault_count: int = typer.Option(None, help="Requests the fault applies to (default all)."),
        fault_on: str = typer.Option("", help="Only requests whose path contains this."),
        duration: float = typer.Option(None, help="Stop after this many seconds."),
    ) -> None:
        """Emulate the GCP Compute Engine metadata server (preempted, maintenance-event)."""
        from spotwise.emulators.gcp import GcpMetadataEmulator

        emu = _build(
            GcpMetadataEmulator, port=port, host=host, notice_after=notice_after, event=event
        )
        _serve(emu, "GCE_METADATA_HOST", "host_port", fault, fault_count, fault_on, duration)

    @emulate.command("azure")
    def azure(
        port: int = typer.Option(1340, help="Port to listen on (0: any free port)."),
        host: str = typer.Option("127.0.0.1", help="Address to bind."),
        notice_after: float = typer.Option(
            None, "--notice-after", help="Seconds until the event is scheduled."
        ),
        event_type: str = typer.Option(
            "Preempt", help="Preempt, Terminate, Reboot, Redeploy or Freeze."
        ),
        lead: float = typer.Option(30.0, help="Seconds from the event to its NotBefore."),
        vm_name: str = typer.Option("spotwise-vm", help="This VM's name."),
        other_vm: bool = typer.Option(
            False, "--other-vm", help="Schedule the event for another VM (must be ignored)."
        ),
        clock_skew: float = typer.Option(0.0, help="Seconds the emulated clock runs ahead."),
        fault: str = typer.Option(None, help=FAULT_HELP),
        fault_count: int = typer.Option(None, help="Requests the fault applies to (default all)."),
        fault_on: str = typer.Option("", help="Only requests whose path contains this."),
        duration: float = typer.Option(None, help="Stop after this many seconds."),
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
            clock_skew_s=clock_skew,
        )
        _serve(
            emu, "SPOTWISE_AZURE_METADATA_ENDPOINT", None, fault, fault_count, fault_on, duration
        )


def _build(cls: Any, **kwargs: Any) -> Any:
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ConfigError(str(exc), hint="see spotwise emulate --help") from None


def listen(emu: Any, host: str, port: int) -> str:
    """Start an emulator; a port in use (or a bad address) is a clear error, not a traceback."""
    try:
        return str(emu.start())
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="pick another --port (0 chooses a free one)",
        ) from None


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
