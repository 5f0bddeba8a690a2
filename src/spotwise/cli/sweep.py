"""``spotwise sweep SWEEP.yaml`` runs a hyperparameter study with ``workers: N`` jobs through the
controller; ``spotwise sweep status [ID]`` shows its trials: state, value, attempts, cost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from spotwise.cli._terminal import literal
from spotwise.telemetry.jsonsafe import dumps

FIELDS = {"trials": None, "study": "study", "storage": "sqlite:///sweep.db",
          "run_root": "runs/sweep"}  # fmt: skip


def _resolve(group_file: Any, job_file: Path) -> dict[str, str]:
    """The sweep's locations, relative paths taken from the sweep file's directory."""
    base = job_file.resolve().parent
    fields = group_file.fields
    storage = str(fields["storage"])
    if storage.startswith("sqlite:///") and not storage.startswith("sqlite:////"):
        storage = f"sqlite:///{(base / storage[len('sqlite:///') :]).resolve()}"
    run_root = str(fields["run_root"])
    if "://" not in run_root:
        run_root = str((base / Path(run_root).expanduser()).resolve())
    trials = fields["trials"]
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        from spotwise.errors import ConfigError

        raise ConfigError(f"{job_file}: trials must be a whole number >= 1, got {trials!r}")
    return {"SPOTWISE_STUDY_STORAGE": storage, "SPOTWISE_STUDY": str(fields["study"]),
            "SPOTWISE_TRIALS": str(trials), "SPOTWISE_RUN_ROOT": run_root}  # fmt: skip


def trial_costs(rows: list[dict[str, Any]], store: Any, now: float) -> list[float]:
    """Each trial's share of the workers' bills: the seconds each of its attempts ran (until the
    next attempt started, the trial ended, or now) at that worker attempt's price."""
    prices: dict[tuple[str, str], tuple[float, float]] = {}
    costs = []
    for row in rows:
        total = 0.0
        attempts = row["attempts"]
        for i, a in enumerate(attempts):
            end = attempts[i + 1]["start"] if i + 1 < len(attempts) else (row["end"] or now)
            key = (a.get("job", ""), str(a.get("attempt", "")))
            if key not in prices:
                prices[key] = (0.0, 1.0)
                if key[0]:
                    for att in store.attempts(key[0]):
                        if str(att.n) == key[1]:
                            prices[key] = (att.usd_per_hour, att.time_scale)
            usd_per_hour, scale = prices[key]
            total += max(0.0, end - a["start"]) * scale * usd_per_hour / 3600.0
        costs.append(total)
    return costs


def register(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        target: str = typer.Argument(..., help="sweep file (YAML), or 'status'"),
        sweep_id: str = typer.Argument(None, help="with status: the sweep id (default newest)"),
        as_json: bool = typer.Option(False, "--json", help="status: machine-readable"),
    ) -> None:
        """Run an Optuna study whose trials resume after preemption, on N workers.

        The sweep file is a job file with workers:, trials:, study:, storage: (a SQLAlchemy URL,
        default sqlite:///sweep.db beside the file) and run_root: (the trials' run
        directories); budget_usd and deadline cover the whole sweep. Each worker's command gets
        $SPOTWISE_STUDY_STORAGE, $SPOTWISE_STUDY, $SPOTWISE_TRIALS, $SPOTWISE_RUN_ROOT and
        $SPOTWISE_WORKER. 'spotwise sweep status' lists the trials.
        """
        if target == "status":
            _status(sweep_id, as_json)
            return
        _run(Path(target))


def _run(job_file: Path) -> None:
    from spotwise.client import refuse_group

    refuse_group(
        "sweep",
        "its workers are driven together from this process (the sweep's shared budget), "
        "and their study storage is resolved on this machine",
    )
    from spotwise.control.store import Store
    from spotwise.control.workers import group_cost_usd, load_group_file, run_group, submit_group
    from spotwise.hpo import storage_for

    group_file = load_group_file(job_file, "sweep", FIELDS)
    env = _resolve(group_file, job_file)
    storage_for(env["SPOTWISE_STUDY_STORAGE"])  # unreachable: one clear error before launching
    store = Store()
    group = submit_group(
        store,
        "sweep",
        group_file,
        env,
        str(job_file.resolve()),
        {"storage": env["SPOTWISE_STUDY_STORAGE"], "run_root": env["SPOTWISE_RUN_ROOT"]},
    )
    console = Console()
    console.print(
        Text.assemble(
            "sweep ",
            literal(group.id, "bold"),
            literal(
                f": {len(group.jobs)} worker job(s), study "
                f"{env['SPOTWISE_STUDY']!r} in {env['SPOTWISE_STUDY_STORAGE']}"
            ),
        )
    )
    seen: list[Any] = [None]

    def update(group: Any, store: Any) -> None:
        states = tuple(store.job(j).state.value for j in group.jobs)
        if states != seen[0]:
            seen[0] = states
            console.print(literal(f"[{time.strftime('%H:%M:%S')}] workers: {' '.join(states)}"))

    states = run_group(group, on_update=update)
    console.print(
        literal(
            f"sweep {group.id}: cost ${group_cost_usd(store, group):.2f}"
            + (f"; stopped: {group.stop_reason}" if group.stop_reason else "")
        )
    )
    _status(group.id, False)
    ok = len(states) == len(group.jobs) and all(s.value == "SUCCEEDED" for s in states.values())
    raise typer.Exit(0 if ok else 1)


def _status(sweep_id: str | None, as_json: bool) -> None:
    import optuna

    from spotwise.control.store import Store
    from spotwise.control.workers import load_group
    from spotwise.hpo import storage_for, study_sha256, trial_rows

    group = load_group(sweep_id, "sweep")
    url = group.fields["storage"]
    study = optuna.load_study(study_name=group.fields["study"], storage=storage_for(url))
    store = Store()
    rows = trial_rows(study)
    for row, cost in zip(rows, trial_costs(rows, store, time.time()), strict=True):
        row["cost_usd"] = round(cost, 6)
    workers = {j: store.job(j).state.value for j in group.jobs}
    if as_json:
        typer.echo(
            dumps(
                {
                    "id": group.id,
                    "study": group.fields["study"],
                    "storage": url,
                    "workers": workers,
                    "trials": rows,
                    "study_sha256": study_sha256(study),
                },
                indent=2,
                default=str,
            )
        )
        return
    table = Table(
        "#",
        "state",
        "value",
        "attempts",
        "resumed at",
        "cost $",
        "params",
        title=literal(f"sweep {group.id}: study {group.fields['study']!r}"),
    )
    for row in rows:
        value = "-" if row["value"] is None else f"{row['value']:.4f}"
        params = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row["params"].items()
        )
        table.add_row(
            str(row["number"]),
            literal(row["state"]),
            value,
            str(len(row["attempts"])),
            ",".join(str(s) for s in row["resumed_steps"]) or "-",
            f"{row['cost_usd']:.4f}",
            literal(params),
        )
    console = Console()
    console.print(table)
    console.print(literal(f"workers: {', '.join(f'{j} {s}' for j, s in workers.items())}"))
