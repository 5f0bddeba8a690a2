"""What every ``spotwise emulate`` command shares: binding a port with a clear error, a moto
S3 (and EC2) on loopback, and serving until a duration or Ctrl-C. Kept apart from
``cli/emulate.py`` so the per-emulator command modules need not import the module that
registers them.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from spotwise.errors import ConfigError


@dataclass
class LoopbackAws:
    """A moto server on 127.0.0.1 (EC2 + S3 for the ec2 emulator, the run dir's S3 for the
    others) with the buckets asked for, and the variables a client exports to reach it."""

    server: Any
    url: str

    def env(self, endpoint: str | None = None, region: str = "us-east-1") -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": endpoint or self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }


def loopback_aws(
    port: int, buckets: list[str], command: str, region: str = "us-east-1"
) -> LoopbackAws:
    """Start moto on ``port`` (0: any) and create ``buckets`` in it."""
    from spotwise.registry import require

    moto_server = require("moto.server", "emulate", f"spotwise emulate {command}")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    host, bound = server.get_host_and_port()
    aws = LoopbackAws(server, f"http://{host}:{bound}")
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=aws.url,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    from botocore.exceptions import ClientError

    for name in buckets:
        try:
            s3.create_bucket(Bucket=name)
        except ClientError as exc:
            server.stop()
            raise ConfigError(
                f"--bucket {name!r}: {exc.response['Error'].get('Message', exc)}",
                hint="S3 bucket names are 3-63 lowercase letters, digits, dots and hyphens",
            ) from None
    return aws


def serve_until(
    duration: float | None, exports: dict[str, str], *stops: Callable[[], None]
) -> None:
    """Print the ``export`` lines a client needs, run until ``duration`` or Ctrl-C, then call
    ``stops`` in order (each emulator's own stop)."""
    for name, value in exports.items():
        typer.echo(f"export {name}={shlex.quote(value)}")  # (pasted into a shell)
    started = time.monotonic()
    try:
        while duration is None or time.monotonic() - started < duration:
            time.sleep(0.2)
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        for stop in stops:
            stop()


def listen(emu: Any, host: str, port: int) -> str:
    """Start an emulator; a port in use (or a bad address) is a clear error, not a traceback."""
    try:
        return str(emu.start())
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="pick another --port (0 chooses a free one)",
        ) from None
