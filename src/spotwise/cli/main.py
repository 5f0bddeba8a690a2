"""Entry point of the ``spotwise`` command.

Every module in ``spotwise.cli`` that defines ``register(app)`` adds its commands; a new command
group is one new file. Command modules keep heavy imports (torch, boto3) inside the commands so
that ``spotwise --help`` stays fast.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

import spotwise.cli as cli_pkg
from spotwise.errors import SpotwiseError

app = typer.Typer(
    name="spotwise",
    help=(
        "Train on spot / preemptible GPUs without losing work.\n\n"
        "Checkpoints that resume bit-for-bit, interruption notices turned into emergency saves, "
        "placement by expected cost, and a controller that relaunches preempted jobs."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Train on spot / preemptible GPUs without losing work."""


def _register_all() -> None:
    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name in {"main"} or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"spotwise.cli.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_all()


def main() -> None:
    """Run the CLI; a ``SpotwiseError`` becomes a one-line message and exit status 2."""
    try:
        app()
    except SpotwiseError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
