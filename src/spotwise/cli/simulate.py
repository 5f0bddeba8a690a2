"""``spotwise simulate``: replay spot availability traces under a deadline-aware policy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from spotwise.telemetry.jsonsafe import dumps

DEFAULT_TRACE = "aws-10-26-2022/us-west-2a_v100_1"


def register(app: typer.Typer) -> None:
    @app.command()
    def simulate(
        trace: list[str] = typer.Option(
            None,
            "--trace",
            help="Trace file (JSON {metadata.gap_seconds, data} or CSV time_s,count), or the "
            f"name of a shipped trace; repeat for one zone each. Default: {DEFAULT_TRACE}.",
        ),
        policy: str = typer.Option(
            "spotwise", help="on-demand | greedy | uniform-progress | optimal | spotwise"
        ),
        compute_h: float = typer.Option(48.0, help="C: hours of compute the job needs."),
        deadline_h: float = typer.Option(60.0, help="R: hours from start to the deadline."),
        changeover_h: float = typer.Option(
            0.2, help="d: paid hours without progress at every start of an instance."
        ),
        spot_price: float = typer.Option(0.918, help="Spot usd per hour per node."),
        ondemand_price: float = typer.Option(3.06, help="On-demand usd per hour per node."),
        nodes: int = typer.Option(1, help="Nodes needed: spot is available when n_t >= nodes."),
        instance_type: str = typer.Option(
            "p3.2xlarge",
            help="Machine of the traces: the market advisor's interruption rate of this type "
            "in each trace's zone is the policy's prior, as in `spotwise launch` (the shipped "
            "traces are V100 p3.2xlarge).",
        ),
        start_h: float = typer.Option(0.0, help="Offset into the trace of the (first) start."),
        starts: int = typer.Option(
            1, help="K start offsets evenly spaced over the part of the trace that fits R."
        ),
        compare: bool = typer.Option(
            False, "--compare", help="Run every policy on the same runs and print a table."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        timeline: Path | None = typer.Option(
            None, help="Directory to write one timeline picture (PNG) per run of --policy."
        ),
    ) -> None:
        """Simulate a job of C compute hours due in R hours on spot traces, with a policy
        choosing idle / spot / on-demand at every tick. Costs include changeovers."""
        from spotwise.market.policies import POLICIES, Problem

        if policy not in POLICIES:
            POLICIES.load(policy)  # raises with the known names and a suggestion
        problem = Problem(
            compute_h=compute_h,
            deadline_h=deadline_h,
            changeover_h=changeover_h,
            spot_price_usd_per_hour=spot_price,
            ondemand_price_usd_per_hour=ondemand_price,
            nodes=nodes,
        )
        markets = _markets(trace or [DEFAULT_TRACE], nodes, instance_type)
        offsets = _offsets(problem, markets, start_h, starts)
        if compare:
            _compare(problem, markets, offsets, as_json)
        else:
            _simulate(policy, problem, markets, offsets, as_json, timeline)


def _markets(traces: list[str], nodes: int, instance_type: str):  # -> sim.Markets
    """The traces' zones, with the advisor's interruption rates of ``instance_type`` there as
    the policy's prior (as in ``spotwise launch``)."""
    from spotwise.control.pricing import zone_interruption_rates
    from spotwise.market import simulate as sim
    from spotwise.market.interruption import load_interruption_model

    markets = sim.Markets.from_traces([_load(t) for t in traces], nodes)
    return dataclasses.replace(
        markets,
        prior_rates_per_h=zone_interruption_rates(
            load_interruption_model(), instance_type, markets.zone_names
        ),
    )


def _offsets(problem, markets, start_h: float, starts: int) -> list[int]:
    """The runs' start ticks: ``starts`` evenly spaced from ``start_h``, each fitting R."""
    from spotwise.market import simulate as sim

    first = round(start_h * 3600.0 / markets.gap_s)
    ticks = sim.run_ticks(problem, markets.gap_s)
    if starts > 1:
        return sim.start_ticks(markets.n_ticks, ticks, starts, first)
    sim.start_ticks(markets.n_ticks, ticks, 1, first)  # validates that the run fits
    return [first]


def _compare(problem, markets, offsets: list[int], as_json: bool) -> None:
    """Every policy on the same runs: a table, or one JSON object."""
    from spotwise.market import simulate as sim

    summaries = _with_progress(
        len(sim.COMPARED) * len(offsets),
        as_json,
        lambda step: sim.compare(problem, markets, offsets, on_run=step),
    )
    rel = sim.relative_costs(summaries)
    if as_json:
        typer.echo(dumps({"policies": [s.to_json() | rel[s.policy] for s in summaries]}, indent=1))
    else:
        _print_table(summaries, rel, problem, markets, len(offsets))


def _simulate(policy: str, problem, markets, offsets: list[int], as_json: bool, timeline) -> None:
    """One policy's runs: their costs (and a timeline picture of each into ``timeline``)."""
    from spotwise.market import simulate as sim

    summary = sim.simulate(policy, problem, markets, offsets, record=timeline is not None)
    if timeline is not None:
        from spotwise.market.timeline import render_timeline

        for r in summary.runs:
            render_timeline(
                r,
                problem,
                timeline / f"{policy}-start-{r.start_h:07.2f}h.png",
                policy=policy,
                zone_names=markets.zone_names,
            )
    if as_json:
        typer.echo(dumps(summary.to_json(), indent=1))
        return
    typer.echo(
        f"{policy}: {len(summary.runs)} run(s) on {', '.join(markets.zone_names)}; "
        f"mean ${summary.mean_cost_usd:.2f}, spot {summary.mean_spot_hours:.2f} h, "
        f"on-demand {summary.mean_ondemand_hours:.2f} h, misses {summary.misses}"
    )
    for r in summary.runs[:20]:
        finish = f"{r.finish_h:.2f} h" if r.finish_h is not None else "-"
        typer.echo(
            f"  start {r.start_h:7.2f} h  ${r.cost_usd:7.2f}  spot {r.spot_hours:5.2f} h  "
            f"on-demand {r.ondemand_hours:5.2f} h  finish {finish}  "
            f"{'met' if r.deadline_met else 'MISSED'}"
        )
    if len(summary.runs) > 20:
        typer.echo(f"  ... {len(summary.runs) - 20} more (use --json for all)")


def _load(name: str):  # -> Trace
    from spotwise.market.traces import load_shipped_trace, load_trace, shipped_traces

    path = Path(name)
    if not path.exists():
        stems = {n.removesuffix(".json") for n in shipped_traces()}
        if name.removesuffix(".json") in stems or any(n.endswith("/" + name) for n in stems):
            return load_shipped_trace(name.removesuffix(".json"))
    return load_trace(path)


def _with_progress(total: int, quiet: bool, work):
    if quiet:
        return work(lambda: None)
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("simulating", total=total)
        return work(lambda: progress.advance(task))


def _print_table(summaries, rel, problem, markets, runs: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from spotwise.cli._terminal import literal

    table = Table(
        title=literal(
            f"C={problem.compute_h:g} h, R={problem.deadline_h:g} h, d={problem.changeover_h:g} h, "
            f"spot ${problem.spot_price_usd_per_hour:g}/h, on-demand "
            f"${problem.ondemand_price_usd_per_hour:g}/h; {runs} run(s) on "
            f"{', '.join(markets.zone_names)}"
        )
    )
    for col in (
        "policy",
        "mean $",
        "vs on-demand",
        "vs optimal",
        "spot h",
        "on-demand h",
        "OD compute h",
        "misses",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for s in summaries:
        r = rel[s.policy]
        table.add_row(
            literal(s.policy),
            f"{s.mean_cost_usd:.2f}",
            f"{r['vs_ondemand']:.3f}" if r["vs_ondemand"] is not None else "-",
            f"{r['vs_optimal']:.3f}" if r["vs_optimal"] is not None else "-",
            f"{s.mean_spot_hours:.2f}",
            f"{s.mean_ondemand_hours:.2f}",
            f"{s.mean_ondemand_compute_h:.2f}",
            str(s.misses),
        )
    Console(width=max(120, Console().width)).print(table)
