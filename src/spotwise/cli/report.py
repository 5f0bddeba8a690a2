"""``spotwise report JOB``: goodput table and advice in the terminal, ``--html`` / ``--png`` files;
and the ``advise --from-job`` answer (rightsizing from the job's GPU samples)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from spotwise.cli._terminal import literal
from spotwise.telemetry.jsonsafe import dumps


def _view(job_id: str) -> Any:
    from spotwise.control.store import Store
    from spotwise.telemetry.jobview import job_view

    store = Store()
    return job_view(store, store.job(job_id))


def print_rightsizing(job_id: str, as_json: bool) -> None:
    """``spotwise advise --from-job JOB``."""
    from rich.console import Console
    from rich.table import Table

    advice = _view(job_id).rightsizing()
    if as_json:
        typer.echo(dumps(advice.as_dict(), indent=2))
        return
    console = Console()
    console.print(literal(advice.line()))
    if advice.suggestions:
        table = Table("instance", "GPUs", "$/h", "hours", "cost $", "difference $")
        for s in advice.suggestions:
            table.add_row(
                literal(s.instance_type),
                literal(f"{s.gpus} x {s.gpu}"),
                f"{s.usd_per_hour:.3f}",
                f"{s.hours:.2f}",
                f"{s.cost_usd:.2f}",
                f"{s.difference_usd:+.2f}",
            )
        console.print(table)


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        job_id: str = typer.Argument(..., help="job id (or a unique prefix)"),
        html: Path = typer.Option(None, "--html", help="write one self-contained HTML file"),
        png: Path = typer.Option(None, "--png", help="write the charts as PNGs into this dir"),
        as_json: bool = typer.Option(False, "--json", help="the goodput ledger as JSON"),
    ) -> None:
        """Where a job's time and money went: useful, lost, restore, changeover, idle."""
        from spotwise.telemetry import report as files

        view = _view(job_id)
        if html is not None:
            html.write_text(files.html_report(view), encoding="utf-8")
            typer.echo(f"wrote {html}")
        if png is not None:
            for path in files.png_report(view, png):
                typer.echo(f"wrote {path}")
        if html is not None or png is not None:
            return
        led = view.ledger
        if as_json:
            typer.echo(
                dumps(
                    {
                        "job": view.job.id,
                        **led.as_dict(),
                        "rightsizing": view.rightsizing().as_dict(),
                    },
                    indent=2,
                )
            )
            return
        _print_ledger(view)


def _print_ledger(view: Any) -> None:
    """The goodput table, what on-demand alone would have cost, and the rightsizing line."""
    from rich.console import Console
    from rich.table import Table

    from spotwise.telemetry.ledger import KINDS

    led = view.ledger
    table = Table(
        "where the time went",
        "wall s",
        "share",
        "cost $",
        title=literal(
            f"job {view.job.id} ({view.job.state.value}): goodput {100 * led.goodput:.1f}%"
        ),
    )
    for kind in KINDS:
        share = led.seconds[kind] / led.wall_s if led.wall_s else 0.0
        table.add_row(
            kind, f"{led.seconds[kind]:.1f}", f"{100 * share:.1f}%", f"{led.usd[kind]:.4f}"
        )
    table.add_row("total", f"{led.wall_s:.1f}", "100%", f"{led.cost_usd:.4f}")
    console = Console()
    console.print(table)
    console.print(
        literal(
            f"on-demand only, same useful compute: ${led.ondemand_run_usd:.2f} "
            f"(saved ${led.savings_usd:.2f})"
        )
    )
    console.print(literal(f"rightsizing: {view.rightsizing().line()}"))
