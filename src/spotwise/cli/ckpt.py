"""``spotwise ckpt list|verify DIR|URI`` and ``ckpt pull URI DIR``: inspect and fetch checkpoints
of a run directory or of an object store (``s3://bucket/prefix``); ``ckpt export DIR``: the
model's weights as one safetensors file."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import typer

ckpt_app = typer.Typer(
    help="Inspect a run directory's checkpoints (steps, sizes, integrity).", no_args_is_help=True
)


def _checkpoints(location: str, deep: bool) -> list[Any]:
    """The verdicts on the checkpoints at ``location``: with ``deep``, those of loading (which
    needs torch), else the listing checks (torch-free)."""
    from spotwise.checkpoint.read import list_checkpoints
    from spotwise.checkpoint.remote import is_remote, list_remote
    from spotwise.errors import ConfigError

    remote = is_remote(location)
    if not remote and not Path(location).is_dir():
        raise ConfigError(
            f"{Path(location)} is not a directory",
            hint="pass the run directory given to spotwise.Run",
        )
    if not deep:
        return list_remote(location) if remote else list_checkpoints(location)
    from spotwise.runtime.commit import list_checkpoints as verified
    from spotwise.runtime.tiered import verify_remote

    return verify_remote(location) if remote else verified(location, deep=True)


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _when(wall_time: float | None) -> str:
    if wall_time is None:
        return "-"
    return datetime.fromtimestamp(wall_time, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _print_table(title: str, infos: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("step", "time", "size", "valid"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for info in infos:
        valid = "yes" if info.valid else f"[red]no[/red]: {info.problem}"
        table.add_row(str(info.step), _when(info.wall_time), _human_size(info.size_bytes), valid)
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(ckpt_app, name="ckpt")


@ckpt_app.command("list")
def list_command(
    run_dir: str = typer.Argument(
        ..., help="run directory or s3://, gs://, az://bucket/prefix (the run_dir of spotwise.Run)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    deep: bool = typer.Option(
        False,
        "--deep",
        help="check everything loading checks (reads every byte; structure and sizes are "
        "always checked)",
    ),
) -> None:
    """List checkpoints: step, time, size and whether each one is valid."""
    infos = _checkpoints(run_dir, deep)
    if as_json:
        typer.echo(json.dumps([i.as_dict() for i in infos], indent=1))
    elif not infos:
        typer.echo(f"no checkpoints in {run_dir}")
    else:
        _print_table(f"checkpoints in {run_dir}", infos)


@ckpt_app.command("verify")
def verify_command(
    run_dir: str = typer.Argument(
        ..., help="run directory or s3://, gs://, az://bucket/prefix (the run_dir of spotwise.Run)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """Verify every checkpoint exactly as loading would (files, sizes, CRC32C, tensor header,
    state); exit 1 if any is invalid."""
    infos = _checkpoints(run_dir, deep=True)
    bad = [i for i in infos if not i.valid]
    if as_json:
        typer.echo(
            json.dumps({"ok": not bad, "checkpoints": [i.as_dict() for i in infos]}, indent=1)
        )
    else:
        if infos:
            _print_table(f"verification of {run_dir}", infos)
        summary = f"{len(infos) - len(bad)} of {len(infos)} checkpoints valid"
        typer.echo(summary if infos else f"no checkpoints in {run_dir}")
    if bad:
        raise typer.Exit(1)


@ckpt_app.command("pull")
def pull_command(
    uri: str = typer.Argument(
        ..., help="s3://, gs:// or az://bucket/prefix (the run_dir of spotwise.Run)"
    ),
    dest: Path = typer.Argument(..., help="local directory to place the checkpoint in"),
) -> None:
    """Download the newest valid checkpoint, verified against its manifest, into DEST."""
    from rich.console import Console

    from spotwise.checkpoint.remote import is_remote, open_remote
    from spotwise.errors import ConfigError
    from spotwise.runtime.tiered import pull_newest

    if not is_remote(uri):
        from spotwise.storage import object_store_schemes

        schemes = ", ".join(f"{s}bucket/prefix" for s in object_store_schemes())
        raise ConfigError(f"{uri!r} is not an object-store URI", hint=f"use {schemes}")
    with Console(stderr=True).status(f"pulling the newest valid checkpoint from {uri}"):
        path = pull_newest(open_remote(uri), dest)
    typer.echo(f"pulled {path.name} into {path}")


@ckpt_app.command("export")
def export_command(
    location: Path = typer.Argument(
        ..., help="run directory (its newest valid checkpoint) or one step-NNNNNNNN directory"
    ),
    fmt: str = typer.Option("safetensors", "--format", help="output format (safetensors)"),
    out: Path | None = typer.Option(
        None, "--out", help="file to write (default: model.safetensors in the current directory)"
    ),
    name: str = typer.Option("model", "--state", help="the Run's state entry holding the model"),
) -> None:
    """Write the model's full weights (unsharded, from any number of ranks) as one safetensors
    file that safetensors and Hugging Face loaders read."""
    from spotwise.checkpoint.format import step_of_dir
    from spotwise.checkpoint.write import write_durable
    from spotwise.errors import ConfigError
    from spotwise.runtime.commit import load_newest_valid
    from spotwise.runtime.distributed.sharded import consolidated
    from spotwise.runtime.format import pack_tensors

    if fmt != "safetensors":
        raise ConfigError(f"--format {fmt!r} is not supported", hint="use --format safetensors")
    if step_of_dir(location.name) is None:
        newest = load_newest_valid(location) if location.is_dir() else None
        if newest is None:
            raise ConfigError(
                f"{location} holds no valid checkpoint",
                hint="pass a run directory given to spotwise.Run, or one of its step-* folders",
            )
        location = newest.info.path
    target = out if out is not None else Path("model.safetensors")
    if target.exists():
        raise ConfigError(f"{target} already exists", hint="choose another --out or remove it")
    blob = pack_tensors(consolidated(location, name))
    write_durable(target.parent, {target.name: (blob.layout.header, *blob.chunks)})
    typer.echo(f"exported {len(blob.layout.specs)} tensors of {location} to {target}")
