"""``spotwise emulate gcs`` / ``spotwise emulate azure-blob``: a loopback Google Cloud Storage or
Azure Blob service for ``gs://`` / ``az://`` run dirs, to rehearse a job's checkpoints before
paying for a bucket. Each prints the ``export`` line the official client reads
(``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_CONNECTION_STRING``: the development account's
published key, never a real one). :func:`loopback_store` starts the store a compute double's
machines share with the controller (``spotwise emulate gcp-compute|azure-compute --store``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from spotwise.errors import ConfigError

FAULT_HELP = (
    "Answer requests with a fault: an HTTP status (429, 500, 503...), 'hang' or 'close' "
    "(drop the connection); --fault-count limits how many."
)


def gcs(
    port: int = typer.Option(4443, help="Port to listen on (0: any free port)."),
    bucket: list[str] = typer.Option([], help="Create this bucket (repeatable)."),
    fault: str = typer.Option(None, help=FAULT_HELP),
    fault_count: int = typer.Option(None, help="How many requests get the fault (default all)."),
    duration: float = typer.Option(None, help="Stop after this many seconds."),
) -> None:
    """Emulate Google Cloud Storage (the JSON API subset gs:// run dirs use) on 127.0.0.1."""
    from spotwise.emulators.gcs import GcsEmulator

    _run(GcsEmulator(port=port), bucket, "--bucket", fault, fault_count, duration)


def azure_blob(
    port: int = typer.Option(10000, help="Port to listen on (0: any free port); Azurite's."),
    container: list[str] = typer.Option([], help="Create this container (repeatable)."),
    fault: str = typer.Option(None, help=FAULT_HELP),
    fault_count: int = typer.Option(None, help="How many requests get the fault (default all)."),
    duration: float = typer.Option(None, help="Stop after this many seconds."),
) -> None:
    """Emulate Azure Blob Storage (the subset az:// run dirs use) on 127.0.0.1."""
    from spotwise.emulators.azure_blob import AzureBlobEmulator

    _run(AzureBlobEmulator(port=port), container, "--container", fault, fault_count, duration)


def _run(
    emu: Any,
    names: list[str],
    option: str,
    fault: str | None,
    fault_count: int | None,
    duration: float | None,
) -> None:
    from spotwise.cli._emulate_serve import listen, serve_until

    _add(emu, names, option)
    if fault:
        try:
            emu.inject(fault, fault_count)
        except ValueError as exc:
            raise ConfigError(str(exc), hint="e.g. --fault 503 --fault-count 3") from None
    url = listen(emu, emu.host, emu.port)
    typer.echo(f"{emu.platform} emulator listening on {url}")
    serve_until(duration, emu.env(), emu.stop)


def _add(emu: Any, names: list[str], option: str) -> None:
    for name in names:
        try:
            emu.add_bucket(name)
        except ValueError as exc:
            raise ConfigError(f"{option} {name!r}: {exc}", hint=emu.NAME_RULE) from None


STORES = ("gs", "az", "s3")


def loopback_store(
    scheme: str, port: int, buckets: list[str], command: str
) -> tuple[dict[str, str], Callable[[], None]]:
    """The job store (``gs``: the GCS double, ``az``: the Azure Blob double, ``s3``: moto) with
    ``buckets`` in it, started for ``spotwise emulate COMMAND``: the variables a client (the
    controller, the double's machines) needs, and its stop."""
    from spotwise.cli._emulate_serve import listen, loopback_aws

    if scheme == "s3":
        aws = loopback_aws(port, buckets, command)
        return aws.env(), aws.server.stop
    if scheme not in STORES:
        raise ConfigError(
            f"--store {scheme!r} is not one of {', '.join(STORES)}", hint="--store gs"
        )
    from spotwise.emulators.azure_blob import AzureBlobEmulator
    from spotwise.emulators.gcs import GcsEmulator

    emu = GcsEmulator(port=port) if scheme == "gs" else AzureBlobEmulator(port=port)
    _add(emu, buckets, "--bucket")
    listen(emu, emu.host, port)
    return emu.env(), emu.stop
