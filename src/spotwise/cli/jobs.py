"""Job commands: ``launch``, ``jobs``, ``status``, ``logs``, ``cancel``, ``resume``.

Whatever came from the user (names, commands, zones, messages, output) reaches rich as
:func:`~spotwise.cli._terminal.literal` text, never as markup.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from spotwise.cli._terminal import literal
from spotwise.telemetry.jsonsafe import dumps

if TYPE_CHECKING:
    from spotwise.control.store.models import Job

_STEP = re.compile(r"step (\d+)/(\d+)")


def _store():
    from spotwise.control.store import Store

    return Store()


def _remote() -> Any:
    """The server's client when one is configured (``SPOTWISE_SERVER`` or ``spotwise login``),
    else None: the commands then drive jobs here (the embedded mode)."""
    from spotwise.client import Client, configured_server

    server = configured_server()
    return None if server is None else Client(server)


def _follow(client: Any, job_id: str, echo: bool = True) -> str:
    """Print a server's job output (unless not ``echo``) until the job ends; its final state."""
    for chunk in client.logs(job_id, follow=True):
        if echo:
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
    return str(client.job(job_id)["state"])


def _progress(log: Path) -> str:
    """Last ``step N/M`` the training printed (the digits example and most loops do)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode(errors="replace")
    except OSError:
        return "-"
    hits = _STEP.findall(tail)
    return f"step {hits[-1][0]}/{hits[-1][1]}" if hits else "-"


def _view(summary: dict[str, Any]) -> Table:
    table = Table(title=literal(f"spotwise job {summary['id']}"), show_header=False, min_width=60)
    attempts = summary["attempts"]
    last = attempts[-1] if attempts else None
    table.add_row(
        "state", Text.assemble(literal(summary["state"], "bold"), " ", literal(summary["message"]))
    )
    table.add_row(
        "attempt",
        f"{len(attempts)} ({summary['preemptions']} preempted, {summary['switches']} switched)",
    )
    table.add_row("placement", literal(f"{last['market']} {last['zone']}" if last else "-"))
    chosen = summary.get("placement")  # where the provider chose to run it, if it chose
    if chosen and chosen["advised"]:
        zones = ", ".join(chosen["zones"])
        table.add_row(
            "advised", literal(f"{chosen['instance_type']} in {chosen['region']} (zones {zones})")
        )
    table.add_row("progress", literal(_progress(Path(summary["log"]))))
    table.add_row(
        "cost",
        f"${summary['cost_usd']:.2f} (on-demand would be "
        f"${summary['ondemand_cost_usd']:.2f}; saved ${summary['savings_usd']:.2f})",
    )
    return table


def _run_controller(job_id: str, quiet: bool) -> str:
    """Drive the job to its end here, with a live view on a terminal."""
    from rich.live import Live

    from spotwise.control.controller import Controller
    from spotwise.control.summary import job_summary

    store = _store()
    console = Console()
    if quiet:
        return Controller(store, job_id).run().value
    if console.is_terminal:
        with Live(console=console, refresh_per_second=4) as live:

            def update(job, attempts) -> None:
                live.update(_view(job_summary(store, job)))

            state = Controller(store, job_id, on_update=update).run().value
    else:  # a log or a pipe: one line per change
        seen: list[Any] = [None]

        def update(job, attempts) -> None:
            key = (job.state, len(attempts))
            if key != seen[0]:
                seen[0] = key
                last = attempts[-1] if attempts else None
                where = f" attempt {last.n} {last.market} {last.zone}" if last else ""
                console.print(
                    literal(
                        f"[{time.strftime('%H:%M:%S')}] {job.state.value}{where}: {job.message}"
                    )
                )

        state = Controller(store, job_id, on_update=update).run().value
    summary = job_summary(store, store.job(job_id))
    console.print(
        literal(
            f"job {job_id} {summary['state']}: {len(summary['attempts'])} attempt(s), "
            f"{summary['preemptions']} preempted, cost ${summary['cost_usd']:.2f} vs "
            f"${summary['ondemand_cost_usd']:.2f} on-demand (saved ${summary['savings_usd']:.2f})"
        )
    )
    last = _last_output_line(store.job(job_id).log_path)
    if last:
        console.print(literal(f"last output line: {last}"), soft_wrap=True)
    return state


def _last_output_line(path: Path, tail_bytes: int = 4096) -> str:
    """The job's final line of output (e.g. the digits example's final-weights-sha256)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def _unreadable_and_idle(store: Any, job: Any) -> bool:
    """A job recorded with a job file this version refuses, and no attempt open: nothing runs
    that a controller would have to stop, so cancelling it needs no controller (none can start)."""
    from spotwise.control.spec import stored_spec
    from spotwise.errors import ControlError

    try:
        stored_spec(job.id, job.spec)
        return False
    except ControlError:
        return all(a.state == "ended" for a in store.attempts(job.id))


def _spawn_controller(job: Job) -> None:
    """Start ``job``'s controller as a process of its own, logging into the job's directory.

    Returns once it holds the job (or has exited: its log says why), so that a command run next
    (``cancel``, ``status``) finds the job driven rather than racing the controller's start."""
    from spotwise.control.ownership import embedded_alive

    with open(job.dir / "controller.log", "ab") as out:
        controller = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from spotwise.cli.main import main; main()",
                "resume",
                job.id,
                "--quiet",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60  # (past it, a slow start is left to go on by itself)
    while time.monotonic() < deadline and controller.poll() is None and not embedded_alive(job):
        time.sleep(0.05)


def _launch_on_server(
    client: Any, job_file: Path, workdir: Any, follow: bool, as_json: bool
) -> None:
    """Submit to the server and print the job id as the last line (or follow its output)."""
    accepted = client.submit(job_file, workdir)
    if follow:
        state = _follow(client, accepted["id"], echo=not as_json)
        if as_json:
            typer.echo(dumps(client.job(accepted["id"]), indent=2))
        else:
            typer.echo(f"job {accepted['id']} {state}")
        raise typer.Exit(0 if state == "SUCCEEDED" else 1)
    if as_json:
        typer.echo(dumps(accepted, indent=2))
        return
    typer.echo(f"job submitted to {client.server.url}")
    typer.echo(accepted["id"])


def launch(
    job_file: Path = typer.Argument(..., help="job spec (YAML), e.g. examples/digits/job.yaml"),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="run the controller in the background, print the id"
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print the first attempt's manifests (YAML), create nothing"
    ),
    follow: bool = typer.Option(
        False, "--follow", help="with a server: print the job's output until it ends"
    ),
    as_json: bool = typer.Option(
        False, "--json", help="print the job's status document when launch returns, only"
    ),
) -> None:
    """Run a job to completion across preemptions: relaunch, resume, stay on budget.

    Blocks (with a live view of state, attempt, placement, progress and cost) until the job
    ends; exits 0 when it succeeded. With --detach, prints the job id and returns once its
    controller runs. With --dry-run, prints what the provider would create (kubectl-compatible
    YAML) and returns.

    With a server (SPOTWISE_SERVER, or `spotwise login URL`), the server runs the job:
    launch returns once it is accepted and prints the job id as its last line (--follow
    prints its output until it ends); closing this command never affects the job.
    """
    from spotwise.control.spec import load_spec
    from spotwise.control.submission import dry_run as manifests
    from spotwise.control.submission import submit
    from spotwise.control.summary import job_summary

    spec = load_spec(job_file)
    if dry_run:
        import yaml

        typer.echo(yaml.safe_dump_all(manifests(spec), sort_keys=False), nl=False)
        return
    client = _remote()
    if client is not None:
        _launch_on_server(client, job_file, spec.workdir, follow, as_json)
        return
    store = _store()
    job = submit(store, spec, str(job_file.resolve()))
    if detach:
        summary = job_summary(store, job)  # (as accepted, before its controller starts)
        _spawn_controller(job)
        typer.echo(dumps(summary, indent=2) if as_json else job.id)
        return
    if as_json:
        state = _run_controller(job.id, quiet=True)
        typer.echo(dumps(job_summary(store, store.job(job.id)), indent=2))
        raise typer.Exit(0 if state == "SUCCEEDED" else 1)
    Console().print(
        Text.assemble(
            "job ",
            literal(job.id, "bold"),
            literal(f" submitted (logs: spotwise logs {job.id} -f)"),
        )
    )
    state = _run_controller(job.id, quiet=False)
    raise typer.Exit(0 if state == "SUCCEEDED" else 1)


def resume(
    job_id: str = typer.Argument(..., help="job id (or a unique prefix)"),
    quiet: bool = typer.Option(False, "--quiet", help="no live view"),
) -> None:
    """Restart the controller of a job whose controller died (it picks up where it was).

    With a server, asks it to drive the job now (it adopts unfinished jobs by itself)."""
    client = _remote()
    if client is not None:
        summary = client.resume(job_id)
        typer.echo(f"job {summary['id']} {summary['state']} (driven by {client.server.url})")
        return
    state = _run_controller(_store().job(job_id).id, quiet=quiet)
    raise typer.Exit(0 if state == "SUCCEEDED" else 1)


def jobs_cmd(as_json: bool = typer.Option(False, "--json", help="machine-readable")) -> None:
    """List jobs: state, attempts, cost."""
    client = _remote()
    if client is not None:
        rows = client.jobs()
    else:
        from spotwise.control.summary import job_summaries

        store = _store()
        rows = job_summaries(store, store.jobs())
    if as_json:
        typer.echo(dumps(rows, indent=2))
        return
    # the id is what a user copies from here: never cut; the other columns give way
    table = Table(
        Column("id", no_wrap=True, min_width=max((len(r["id"]) for r in rows), default=2)),
        Column("state", no_wrap=True),
        *(
            Column(h, justify="right", overflow="ellipsis")
            for h in ("attempts", "preempted", "cost $", "saved $")
        ),
        Column("controller", overflow="ellipsis"),
        Column("command"),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    stopped: list[str] = []
    for r in rows:
        alive = Text("running" if r["controller_alive"] else "-")
        if not r["controller_alive"] and r["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            alive = Text("stopped", "red")
            stopped.append(r["id"])
        table.add_row(
            literal(r["id"]),
            literal(r["state"]),
            str(len(r["attempts"])),
            str(r["preemptions"]),
            f"{r['cost_usd']:.2f}",
            f"{r['savings_usd']:.2f}",
            alive,
            literal(r["command"][:60], one_line=True),
        )
    console = Console()
    console.print(table)
    for job_id in stopped:
        console.print(literal(f"controller stopped: spotwise resume {job_id}"))


def status(
    job_id: str = typer.Argument(..., help="job id (or a unique prefix)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable"),
) -> None:
    """One job: state, every attempt (start, end, reason, market, zone, cost), total cost."""
    client = _remote()
    if client is not None:
        summary = client.job(job_id)
    else:
        from spotwise.control.summary import job_summary

        store = _store()
        summary = job_summary(store, store.job(job_id))
    if as_json:
        typer.echo(dumps(summary, indent=2))
        return
    console = Console()
    console.print(_view(summary))
    table = Table("#", "market", "zone", "start", "end", "reason", "exit", "cost $")
    for a in summary["attempts"]:
        end = time.strftime("%H:%M:%S", time.localtime(a["end"])) if a["end"] else "-"
        table.add_row(
            str(a["n"]),
            literal(a["market"]),
            literal(a["zone"]),
            time.strftime("%H:%M:%S", time.localtime(a["start"])),
            end,
            literal(a["reason"] or a["state"]),
            str(a["exit_code"]),
            f"{a['cost_usd']:.4f}",
        )
    console.print(table)


def logs(
    job_id: str = typer.Argument(..., help="job id (or a unique prefix)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until it ends"),
) -> None:
    """Print the job's output (every attempt, in order)."""
    client = _remote()
    if client is not None:
        for chunk in client.logs(job_id, follow=follow):
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        return
    store = _store()
    job = store.job(job_id)
    pos = 0
    while True:
        try:
            with open(job.log_path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            pos += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        if not follow or (store.job(job.id).state.terminal and not chunk):
            return
        time.sleep(0.3)


def cancel(
    job_id: str = typer.Argument(..., help="job id (or a unique prefix)"),
    as_json: bool = typer.Option(
        False, "--json", help="print the job's status document once it ended, only"
    ),
) -> None:
    """Stop a job: the attempt gets a notice (so it saves), then its machine is freed."""
    from spotwise.control.summary import job_summary

    client = _remote()
    if client is not None:
        job_id = client.cancel(job_id)["id"]
        for _ in range(1200):  # as embedded: wait (up to 2 min) for the job to end
            summary = client.job(job_id)
            if summary["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                break
            time.sleep(0.1)
        typer.echo(dumps(summary, indent=2) if as_json else f"job {job_id} {summary['state']}")
        return

    store = _store()
    job = store.job(job_id)
    if job.state.terminal:
        typer.echo(
            dumps(job_summary(store, job), indent=2)
            if as_json
            else f"job {job.id} already {job.state.value}"
        )
        return
    store.request_cancel(job.id)
    _see_cancel_through(store, job.id)
    job = store.job(job.id)
    typer.echo(
        dumps(job_summary(store, job), indent=2) if as_json else f"job {job.id} {job.state.value}"
    )


def _see_cancel_through(store: Any, job_id: str) -> None:
    """Wait (up to 2 min) for the controller that drives the job to end it, or drive it here
    when none does; one that starts in between (a detached launch's) is waited for instead."""
    from spotwise.control.ownership import controller_alive
    from spotwise.control.store import JobState
    from spotwise.errors import ControllerBusyError

    for _ in range(1200):
        job = store.job(job_id)
        if job.state.terminal:
            return
        if controller_alive(job):
            time.sleep(0.1)
        elif _unreadable_and_idle(store, job):
            store.update_job(
                job.id,
                state=JobState.CANCELLED,
                message="cancelled by the user (its recorded job file is no longer accepted)",
                event=("state", "CANCELLED: no attempt was open"),
            )
            return
        else:
            try:
                _run_controller(job.id, quiet=True)
                return
            except ControllerBusyError:
                continue


def register(app: typer.Typer) -> None:
    app.command()(launch)
    app.command()(resume)
    app.command("jobs")(jobs_cmd)
    for command in (status, logs, cancel):
        app.command()(command)
