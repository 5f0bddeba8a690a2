"""``spotwise infer JOB.yaml``: batch inference through the controller, ``workers: N`` jobs that
split the shards by leases, with a progress bar and the throughput."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.text import Text

from spotwise.cli._terminal import literal

if TYPE_CHECKING:
    from spotwise.control.store import JobState, Store
    from spotwise.control.workers import Group
    from spotwise.storage import Storage


def _resolve_output(output: str, job_file: Path) -> str:
    if "://" in output:
        return output
    return str((job_file.resolve().parent / Path(output).expanduser()).resolve())


def register(app: typer.Typer) -> None:
    @app.command()
    def infer(
        job_file: Path = typer.Argument(
            ...,
            help="batch job (YAML): a job file with output: and "
            "workers:, e.g. examples/digits/infer.yaml",
        ),
    ) -> None:
        """Map a model over a dataset exactly once with N workers on spot machines.

        Every worker is an ordinary job (relaunched after preemption); its command gets
        $SPOTWISE_BATCH_OUT (the output location) and $SPOTWISE_WORKER. Shows shards done and
        items per second; exits 0 when every worker succeeded.
        """
        from spotwise.client import refuse_group

        refuse_group(
            "infer",
            "its workers are driven together from this process (the batch's shared budget, "
            "the progress of its shards)",
        )
        # (torch loads with spotwise.batch: before the workers' jobs exist, so that the seconds it
        # takes never pass between a job's creation and its first launch)
        from spotwise.batch import describe
        from spotwise.control.store import Store
        from spotwise.control.workers import load_group_file, submit_group

        group_file = load_group_file(job_file, "infer", {"output": None})
        output = _resolve_output(str(group_file.fields["output"]), job_file)
        store = Store()
        group = submit_group(
            store,
            "infer",
            group_file,
            {"SPOTWISE_BATCH_OUT": output},
            str(job_file.resolve()),
            {"output": output},
        )
        console = Console()
        console.print(
            Text.assemble(
                "batch ",
                literal(group.id, "bold"),
                literal(
                    f": {len(group.jobs)} worker job(s) ({', '.join(group.jobs)}), output {output}"
                ),
            )
        )
        _run_with_progress(group, store, output, console, describe)


def _run_with_progress(
    group: Group,
    store: Store,
    output: str,
    console: Console,
    describe: Callable[[Storage], Mapping[str, Any] | None],
) -> None:
    """Drive the batch's workers to their ends under a bar of shards done and items per
    second, then print the outcome; exits 0 when every worker succeeded."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from spotwise.control.workers import run_group
    from spotwise.storage import open_storage

    storage = open_storage(output)
    started = time.monotonic()
    first: dict[str, Any] = {}
    with Progress(
        TextColumn("shards"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} items/s  {task.fields[workers]}"),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("infer", total=None, rate="-", workers="")

        def update(group, store) -> None:
            info = describe(storage)
            states = [store.job(j).state.value for j in group.jobs]
            if info is None:
                bar.update(task, workers=" ".join(states))
                return
            first.setdefault("items", info["items_done"])
            elapsed = time.monotonic() - started
            rate = (info["items_done"] - first["items"]) / elapsed if elapsed > 0 else 0.0
            bar.update(
                task,
                total=info["shards"],
                completed=info["done"],
                rate=f"{rate:,.0f}",
                workers=" ".join(states),
            )

        states = run_group(group, on_update=update)
    info = describe(storage) or {"done": 0, "shards": "?", "items_done": 0}
    _report(group, store, states, info, time.monotonic() - started, console)


def _report(
    group: Group,
    store: Store,
    states: dict[str, JobState],
    info: Mapping[str, Any],
    elapsed: float,
    console: Console,
) -> None:
    """The batch's shards, items, rate and cost, each worker's end, the first worker's last
    output line; exit 0 when every worker succeeded."""
    from spotwise.cli.jobs import _last_output_line
    from spotwise.control.workers import group_cost_usd

    cost = group_cost_usd(store, group)
    console.print(
        literal(
            f"batch {group.id}: {info['done']}/{info['shards']} shards, {info['items_done']} "
            f"items in {elapsed:.1f}s ({info['items_done'] / max(elapsed, 1e-9):,.0f} "
            f"items/s), cost ${cost:.2f}"
            + (f"; stopped: {group.stop_reason}" if group.stop_reason else "")
        )
    )
    for job_id in group.jobs:
        state = states.get(job_id)
        console.print(
            literal(
                f"  {job_id}: {state.value if state else '?'} "
                f"({len(store.attempts(job_id))} attempt(s))"
            )
        )
    last = _last_output_line(store.job(group.jobs[0]).log_path)
    if last:
        console.print(literal(f"last output line: {last}"), soft_wrap=True)
    ok = all(s is not None and s.value == "SUCCEEDED" for s in states.values())
    raise typer.Exit(0 if ok and len(states) == len(group.jobs) else 1)
