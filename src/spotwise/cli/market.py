"""Market commands: ``gpus``, ``prices ingest|show|history``, ``advise`` and ``roi``.

Everything here gathers inputs, calls the pure market functions and prints; boto3 and matplotlib
are imported only by the commands that need them.
"""

from __future__ import annotations

import json
import math
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from spotwise.echo import printable
from spotwise.errors import ConfigError, MarketError

if TYPE_CHECKING:
    from spotwise.market.sources import PriceSource, SourceQuery

# `prices ingest` stored the good rows but rejected others (0: all stored; 2: nothing usable).
EXIT_ROWS_REJECTED = 3
_UNITS_H = {"s": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "h": 1.0, "d": 24.0, "w": 168.0}


def parse_hours(text: str, what: str) -> float:
    """'60h', '90m', '2d', '1.5' (hours) -> hours."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d|w)?\s*", text or "")
    if not match:
        raise ConfigError(f"cannot read {what} {text!r}", hint="write e.g. 48h, 90m, 2d or 1.5")
    return float(match.group(1)) * _UNITS_H[match.group(2) or "h"]


def _since(text: str | None) -> int | None:
    if text is None:
        return None
    from spotwise.market.sources import parse_timestamp

    try:
        return parse_timestamp(text)
    except MarketError as exc:
        raise ConfigError(
            f"cannot read --since {text!r}", hint="use 2020-01-31 or ISO-8601"
        ) from exc


def _money(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"${x:,.2f}"


def _hours(x: float) -> str:
    return "never" if not math.isfinite(x) else f"{x:,.1f}"


def _plain(value: object) -> Any:
    """A table cell or title that Rich shows as written: data (a zone, a type, a path) is
    never parsed as markup (``[/]`` in a zone name) and its control characters are escaped."""
    from rich.text import Text

    return value if isinstance(value, Text) else Text(printable(str(value)))


def _add_row(table: Any, *cells: object) -> None:
    table.add_row(*map(_plain, cells))


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def _store(db: Path | None, *, must_exist: bool) -> Any:
    from spotwise.market.prices import PriceStore, default_db_path

    path = db or default_db_path()
    if must_exist and not path.exists():
        raise MarketError(
            f"no price history at {path}",
            hint="spotwise prices ingest <file.csv> | --aws | --azure  fills it",
        )
    return PriceStore(path)


_DB_OPTION = typer.Option(None, "--db", help="Price database (default $SPOTWISE_HOME/prices.db).")
_EMERGENCY_SAVE_OPTION = typer.Option(
    False, "--emergency-save", help="The job saves on interruption notices (loses ~no work)."
)
_GPU_ONLY_OPTION = typer.Option(
    False, "--include-gpu-only", help="Include GCP GPU-only prices (host VM not priced)."
)
_HISTORY_OPTION = typer.Option(
    True, "--history/--no-history", help="Use newer prices from the local price history."
)
_FROM_JOB_OPTION = typer.Option(
    None, "--from-job", help="Rightsize a job from its GPU samples instead (job id)."
)


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus)
    app.command("advise")(advise)
    app.command("roi")(roi)
    prices = typer.Typer(help="Spot and on-demand price history: ingest, show, chart.")
    prices.command("ingest")(prices_ingest)
    prices.command("show")(prices_show)
    prices.command("history")(prices_history)
    app.add_typer(prices, name="prices")


# --- gpus ---------------------------------------------------------------------------------------
def gpus(
    gpu: str = typer.Option(None, "--gpu", help="GPU model, e.g. V100, A100, H100."),
    count: int = typer.Option(None, "--count", help="GPUs per instance."),
    min_mem: float = typer.Option(None, "--min-mem", help="Minimum memory per GPU in GB."),
    cloud: str = typer.Option(None, "--cloud", help="aws, gcp, azure or lambda."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """What GPU instance types exist, with hardware facts and the cheapest prices."""
    from dataclasses import asdict

    from rich.table import Table

    from spotwise.market.catalog import load_catalog

    types = load_catalog().find(gpu=gpu, count=count, min_mem_gb=min_mem, cloud=cloud)
    if as_json:
        return _print_json([asdict(t) for t in types])
    table = Table(title=_plain(f"{len(types)} instance types (cheapest price over regions, $/h)"))
    for col in ("cloud", "instance type", "GPU"):
        table.add_column(col)
    for col in ("GPUs", "GB/GPU", "vCPU", "RAM GB", "regions", "on-demand", "spot"):
        table.add_column(col, justify="right")
    for t in types:
        name = t.instance_type + ("" if t.host_included else " *")
        _add_row(
            table,
            t.cloud,
            name,
            t.gpu,
            str(t.gpus),
            f"{t.gpu_mem_gb:g}" if t.gpu_mem_gb else "?",
            f"{t.vcpus:g}",
            f"{t.ram_gb:g}",
            str(t.regions),
            _money(t.cheapest_on_demand_usd_per_hour),
            _money(t.cheapest_spot_usd_per_hour),
        )
    console = _wide_console()
    console.print(table)
    if not all(t.host_included for t in types):
        console.print("* GCP GPU-only price: the N1 host VM is billed on top")


# --- prices -------------------------------------------------------------------------------------
def prices_ingest(
    paths: list[Path] = typer.Argument(
        None, help="CSV dumps (AWS history, SkyPilot, spotwise) or AWS CLI JSON."
    ),
    source_names: list[str] = typer.Option(
        None,
        "--source",
        help="A registered price source to read (repeatable): csv and aws-json read the PATHS, "
        "aws and azure fetch the clouds' APIs, a plugin's source by its name; an unknown name "
        "lists them all. Without it, PATHS are read by their content (AWS CLI JSON, else CSV).",
    ),
    aws: bool = typer.Option(False, "--aws", help="Same as --source aws."),
    azure: bool = typer.Option(False, "--azure", help="Same as --source azure."),
    region: list[str] = typer.Option(None, "--region", help="Regions to fetch (default: all)."),
    instance_type: list[str] = typer.Option(
        None, "--type", help="Instance types / SKUs to fetch (default: GPU types in the catalog)."
    ),
    since: str = typer.Option(None, "--since", help="AWS: start time (ISO-8601)."),
    cloud: str = typer.Option(None, "--cloud", help="Cloud of SkyPilot-format CSVs."),
    db: Path = _DB_OPTION,
    show_errors: int = typer.Option(10, "--show-errors", help="How many bad rows to list."),
) -> None:
    """Store price history from CSV files and/or live cloud APIs (re-running adds nothing new).

    Exits 0 when every row was stored, 3 when some rows were rejected (each listed with its
    line; the good rows are stored all the same), 2 when nothing could be used.
    """
    from spotwise.market.sources import PRICE_SOURCES, SourceQuery

    names = [*(source_names or []), *(["aws"] if aws else []), *(["azure"] if azure else [])]
    for name in names:
        PRICE_SOURCES.check(name)  # every name before any source is read
    start = _since(since)
    query = SourceQuery(
        paths=tuple(paths or ()),
        regions=tuple(region or ()),
        instance_types=tuple(instance_type or ()),
        since=datetime.fromtimestamp(start, tz=timezone.utc) if start else None,
        cloud=cloud,
    )
    sources = _price_sources(names, bool(source_names), query)
    with _store(db, must_exist=False) as store:
        rejected = sum(_ingest_one(store, source, show_errors) for source in sources)
        typer.echo(f"{store.path}: {store.count():,} rows in total")
    if rejected:
        typer.echo(
            f"{rejected:,} row(s) rejected; the other rows were stored "
            f"(exit status {EXIT_ROWS_REJECTED})",
            err=True,
        )
        raise typer.Exit(EXIT_ROWS_REJECTED)


def _price_sources(names: list[str], named: bool, query: SourceQuery) -> list[PriceSource]:
    """The sources ``--source`` names (``named``), else the paths read by their content (AWS
    CLI JSON, else CSV); refuses paths no named source reads, and nothing at all."""
    from spotwise.market.sources import open_sources
    from spotwise.market.sources.awsjson import AwsCliJsonSource, looks_like_json
    from spotwise.market.sources.csvfile import CsvSource

    sources: list[PriceSource] = [
        s for name in dict.fromkeys(names) for s in open_sources(name, query)
    ]
    if not named:
        sources[:0] = [
            AwsCliJsonSource(p) if looks_like_json(p) else CsvSource(p, cloud=query.cloud)
            for p in query.paths
        ]
    elif query.paths and not any(getattr(s, "path", None) in query.paths for s in sources):
        raise ConfigError(
            f"{len(query.paths)} file(s) given, but no --source named reads files",
            hint="add --source csv or --source aws-json, or leave out --source",
        )
    if not sources:
        raise ConfigError(
            "nothing to ingest", hint="pass CSV paths, --source aws or --source azure"
        )
    return sources


def _ingest_one(store: Any, source: PriceSource, show_errors: int) -> int:
    """Store one source's rows under a spinner, print what happened; the rows rejected."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn

    from spotwise.market.prices import ingest

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(printable(f"{source.name}: reading"))

        def show(n: int) -> None:
            bar.update(task, description=printable(f"{source.name}: {n:,} rows"))

        report = ingest(store, source, progress=show)
    typer.echo(
        f"{printable(source.name)}: {report.records:,} rows read, "
        f"{report.stored:,} new or changed, "
        f"{report.unchanged:,} already stored, {len(report.errors):,} rejected "
        f"({report.rows_per_s:,.0f} rows/s)"
    )
    for err in report.errors[:show_errors]:
        typer.echo(f"  line {err.line}: {printable(err.message, 300)}")
    if len(report.errors) > show_errors:
        typer.echo(f"  ... and {len(report.errors) - show_errors:,} more")
    return len(report.errors)


def prices_show(
    instance_type: str = typer.Option(None, "--type", help="Latest prices of this type."),
    cloud: str = typer.Option(None, "--cloud", help="Cloud of --type (default: any)."),
    db: Path = _DB_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """What the history holds (per cloud and market), or the latest prices of one type."""
    from dataclasses import asdict

    from rich.table import Table

    with _store(db, must_exist=True) as store:
        if store.count() == 0:
            raise MarketError("the price history is empty", hint="spotwise prices ingest <file>")
        if instance_type is None:
            rows = [asdict(s) for s in store.summary()]
            title = f"price history in {store.path}"
        else:
            clouds = [cloud] if cloud else ["aws", "gcp", "azure", "lambda"]
            latest = store.latest([(c, instance_type) for c in clouds])
            if not latest:
                raise MarketError(f"no prices for {instance_type!r} in the history")
            rows = [
                {**asdict(r), "time": _iso(r.ts)}
                for r in sorted(latest, key=lambda r: (r.market, r.usd_per_hour))
            ]
            for r in rows:
                del r["line"], r["ts"]
            title = f"latest {instance_type} prices"
    if as_json:
        return _print_json(rows)
    table = Table(title=_plain(title))
    for key in rows[0]:
        table.add_column(key)
    for r in rows:
        _add_row(table, *(f"{v:g}" if isinstance(v, float) else str(v) for v in r.values()))
    _wide_console().print(table)


def _iso(ts: int) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(
    points: list[tuple[int, float]], start: int, end: int, lo: float, hi: float, width: int = 48
) -> str:
    """A step chart on a shared time axis: each column shows the price in force at its end
    (prices hold until the next change, as AWS records them); blank before the first point."""
    span_t = max(end - start, 1)
    span_v = hi - lo or 1.0
    out, j, current = [], 0, None
    for i in range(width):
        t = start + (i + 1) * span_t / width
        while j < len(points) and points[j][0] <= t:
            current = points[j][1]
            j += 1
        if current is None:
            out.append(" ")
        else:
            out.append(_BARS[min(int((current - lo) / span_v * len(_BARS)), len(_BARS) - 1)])
    return "".join(out)


def prices_history(
    instance_type: str = typer.Option(..., "--type", help="Instance type, e.g. p3.2xlarge."),
    cloud: str = typer.Option(None, "--cloud", help="aws, gcp, azure (default: any)."),
    region: str = typer.Option(None, "--region"),
    zone: str = typer.Option(None, "--zone"),
    market: str = typer.Option("spot", "--market", help="spot or on-demand."),
    since: str = typer.Option(None, "--since", help="Start time (ISO-8601)."),
    png: Path = typer.Option(None, "--png", help="Also draw a PNG chart (needs spotwise[plot])."),
    db: Path = _DB_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the points as JSON."),
) -> None:
    """Price over time per zone: a chart in the terminal (and optionally a PNG)."""
    with _store(db, must_exist=True) as store:
        points = store.history(
            instance_type=instance_type,
            cloud=cloud,
            region=region,
            zone=zone,
            market=market,
            since=_since(since),
        )
    if not points:
        raise MarketError(
            f"no {market} history for {instance_type}"
            + (f" in {region}" if region else "")
            + (f" zone {zone}" if zone else ""),
            hint="spotwise prices show lists what is stored",
        )
    series: dict[str, list[tuple[int, float]]] = {}
    for p in points:
        series.setdefault(f"{p.cloud}/{p.zone or p.region}", []).append((p.ts, p.usd_per_hour))
    if as_json:
        return _print_json(
            {k: [{"time": _iso(t), "usd_per_hour": v} for t, v in pts] for k, pts in series.items()}
        )
    first, last = _iso(points[0].ts), _iso(points[-1].ts)
    typer.echo(f"{instance_type} {market} $/h, {first} .. {last} ({len(points):,} points)")
    width = max(len(k) for k in series)
    lo = min(p.usd_per_hour for p in points)
    hi = max(p.usd_per_hour for p in points)
    typer.echo(f"{'':<{width}}  {first:<24}{last:>24}   (one scale: {lo:.4g} .. {hi:.4g})")
    for name, pts in sorted(series.items()):
        values = [v for _, v in pts]
        chart = sparkline(pts, points[0].ts, points[-1].ts, lo, hi)
        typer.echo(
            f"{name:<{width}}  {chart}  min {min(values):.4g}  max {max(values):.4g}  "
            f"last {values[-1]:.4g}"
        )
    if png is not None:
        _png(series, png, f"{instance_type} {market} price")
        typer.echo(f"chart written to {png}")


def _png(series: dict[str, list[tuple[int, float]]], path: Path, title: str) -> None:
    from spotwise.registry import require

    matplotlib = require("matplotlib", "plot", "PNG price charts")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "plot", "PNG price charts")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, pts in sorted(series.items()):
        times = [datetime.fromtimestamp(t, tz=timezone.utc) for t, _ in pts]
        ax.step(times, [v for _, v in pts], where="post", label=name, linewidth=1)
    ax.set_title(title)
    ax.set_ylabel("USD per hour")
    ax.legend(fontsize="small", ncol=2)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- advise -------------------------------------------------------------------------------------
def advise(
    gpu: str = typer.Option(None, "--gpu", help="GPU model, e.g. V100 (or use --min-mem)."),
    count: int = typer.Option(1, "--count", "-n", help="GPUs on one instance."),
    hours: str = typer.Option(None, "--hours", help="Compute time the job needs, e.g. 48h."),
    deadline: str = typer.Option(None, "--deadline", help="Finish within, e.g. 60h or 3d."),
    budget: float = typer.Option(None, "--budget", help="Budget cap in USD."),
    min_mem: float = typer.Option(None, "--min-mem", help="Minimum memory per GPU in GB."),
    checkpoint_cost: str = typer.Option("3m", "--checkpoint-cost", help="Time to save once."),
    restart: str = typer.Option("12m", "--restart", help="Changeover: provision+start+restore."),
    interval: str = typer.Option(None, "--interval", help="Checkpoint interval (default: Young)."),
    emergency_save: bool = _EMERGENCY_SAVE_OPTION,
    cloud: list[str] = typer.Option(None, "--cloud", help="Only these clouds (repeatable)."),
    region: list[str] = typer.Option(None, "--region", help="Only these regions (repeatable)."),
    market: list[str] = typer.Option(None, "--market", help="spot and/or on-demand."),
    objective: str = typer.Option("cost", "--objective", help="Rank by 'cost' or 'time'."),
    gpu_only: bool = _GPU_ONLY_OPTION,
    use_history: bool = _HISTORY_OPTION,
    top: int = typer.Option(15, "--top", help="Table rows to show (JSON prints all)."),
    db: Path = _DB_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print placements as JSON, best first."),
    from_job: str = _FROM_JOB_OPTION,
) -> None:
    """Rank placements by expected cost and completion time, interruptions included.

    With --from-job JOB: a smaller or larger instance for that job, from its GPU utilisation
    and memory samples, with the expected cost difference for the remaining work.
    """
    if from_job is not None:
        from spotwise.cli.report import print_rightsizing

        return print_rightsizing(from_job, as_json)
    if hours is None:
        raise ConfigError(
            "advise needs --hours (the compute time the job needs)",
            hint="e.g. spotwise advise --gpu V100 --hours 48h, or --from-job JOB",
        )
    from spotwise.market.advisor import JobRequest

    job = JobRequest(
        compute_hours=parse_hours(hours, "--hours"),
        gpu=gpu,
        gpus=count,
        min_gpu_mem_gb=min_mem,
        deadline_hours=parse_hours(deadline, "--deadline") if deadline else None,
        budget_usd=budget,
        checkpoint_cost_h=parse_hours(checkpoint_cost, "--checkpoint-cost"),
        restart_h=parse_hours(restart, "--restart"),
        checkpoint_interval_h=parse_hours(interval, "--interval") if interval else None,
        emergency_save=emergency_save,
        markets=tuple(market or ("spot", "on-demand")),
        clouds=tuple(cloud or ()),
        regions=tuple(region or ()),
        include_host_excluded=gpu_only,
    )
    _print_advice(job, _catalog(job, db, use_history), objective, as_json, top)


def _print_advice(job: Any, catalog: Any, objective: str, as_json: bool, top: int) -> None:
    """The job's placements in ``catalog``, best first by ``objective``: JSON or a table."""
    from spotwise.market.advisor import advise_from_catalog
    from spotwise.market.interruption import load_interruption_model

    placements = advise_from_catalog(job, catalog, load_interruption_model(), objective=objective)
    if as_json:
        return _print_json([p.to_dict() for p in placements])
    _advice_table(job, placements, top)


def _catalog(job: Any, db: Path | None, use_history: bool) -> Any:
    """The shipped catalog, with newer prices of the job's offers from the local price history."""
    from spotwise.market.catalog import load_catalog
    from spotwise.market.prices import catalog_with_history, default_db_path

    catalog = load_catalog()
    path = db or default_db_path()
    if use_history and path.exists():
        from spotwise.market.advisor import matching_offers

        job.validate()
        with _store(path, must_exist=True) as store:
            catalog = catalog_with_history(
                catalog, store, matching_offers(job, catalog.offers, catalog), at=int(time.time())
            )
    return catalog


def _wide_console() -> Any:
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=150)


_ADVICE_COLUMNS = (
    "#",
    "cloud",
    "region / zone",
    "instance type",
    "market",
    "$/h",
    "intr/h",
    "exp. h",
    "exp. cost",
    "vs on-demand",
    "deadline",
)


def _advice_table(job: Any, placements: list[Any], top: int) -> None:
    """Placements best first; places with identical terms (same cloud, type, market, price and
    interruption rate, e.g. Lambda's flat prices) share one row."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    groups: dict[tuple, list[Any]] = {}
    for p in placements:
        key = (p.cloud, p.instance_type, p.market, p.usd_per_hour, p.interruption_rate_per_h)
        groups.setdefault(key, []).append(p)
    rows = list(groups.values())[:top]
    what = f"{job.gpus} x {job.gpu or f'GPU >= {job.min_gpu_mem_gb:g} GB'}"
    deadline = f", deadline {job.deadline_hours:g} h" if job.deadline_hours else ""
    table = Table(
        title=_plain(
            f"{what}, {job.compute_hours:g} compute h{deadline}: {len(placements)} placements, "
            "best expected cost first"
        )
    )
    for col in _ADVICE_COLUMNS:
        table.add_column(
            col, justify="right" if col in ("#", "$/h", "intr/h", "exp. h") else "left"
        )
    for i, group in enumerate(rows, 1):
        p = group[0]
        where = f"{p.region}/{p.zone}" if p.zone else p.region
        if len(group) > 1:
            where += f" +{len(group) - 1} more"
        s = p.savings_vs_on_demand_pct
        _add_row(
            table,
            str(i),
            p.cloud,
            where,
            p.instance_type,
            p.market,
            f"{p.usd_per_hour:.3f}",
            f"{p.interruption_rate_per_h:.3f}",
            _hours(p.expected_hours),
            _money(p.expected_cost_usd),
            "-" if s is None else f"{-s:+.0f}%",
            "-"
            if job.deadline_hours is None
            else "ok"
            if p.meets_deadline
            else Text("MISSES", style="red"),
        )
    console = _wide_console()
    console.print(table)
    if placements:
        console.print(escape(_best_line(placements[0])).replace("  ", " "))


def _best_line(best: Any) -> str:
    return (
        f"best: {best.cloud} {best.region} {best.zone} {best.instance_type} {best.market}: "
        f"{_hours(best.expected_hours)} h and {_money(best.expected_cost_usd)} expected "
        f"({best.expected_interruptions:.1f} interruptions at "
        f"{best.interruption_rate_per_h:.3f}/h from {best.interruption_source}; "
        f"checkpoint every {best.checkpoint_interval_h * 60:.0f} min)"
        + (f"; notes: {'; '.join(best.notes)}" if best.notes else "")
    )


# --- roi ----------------------------------------------------------------------------------------
def roi(
    gpu_hours: float = typer.Option(..., "--gpu-hours", help="GPU-hours needed per year."),
    price: float = typer.Option(..., "--price", help="Purchase price of one box, USD."),
    gpus_per_box: int = typer.Option(8, "--gpus", help="GPUs in one box."),
    power_kw: float = typer.Option(..., "--power-kw", help="Power draw of one box at load, kW."),
    lifetime: float = typer.Option(4.0, "--lifetime", help="Years until replacement."),
    utilisation: float = typer.Option(0.6, "--utilisation", help="Share of hours in use (0-1]."),
    kwh: float = typer.Option(0.12, "--kwh", help="Electricity price, USD per kWh."),
    pue: float = typer.Option(1.4, "--pue", help="Data-centre power overhead factor."),
    ops: float = typer.Option(0.08, "--ops", help="Yearly space/support cost, share of price."),
    gpu: str = typer.Option(None, "--gpu", help="Cloud GPU to compare with (catalog prices)."),
    cloud: str = typer.Option(None, "--cloud", help="Cloud for catalog prices."),
    region: str = typer.Option(None, "--region", help="Region for catalog prices."),
    on_demand_usd: float = typer.Option(None, "--on-demand-usd", help="$/GPU-h on-demand."),
    reserved_usd: float = typer.Option(None, "--reserved-usd", help="$/GPU-h reserved."),
    spot_usd: float = typer.Option(None, "--spot-usd", help="$/GPU-h spot (before overhead)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Buy hardware or rent (on-demand, reserved, spot)? Yearly cost and break-even utilisation."""
    from dataclasses import asdict

    from spotwise.market.roi import Hardware, compare

    hardware = Hardware(
        price_usd=price,
        gpus=gpus_per_box,
        power_kw=power_kw,
        lifetime_years=lifetime,
        utilisation=utilisation,
        usd_per_kwh=kwh,
        pue=pue,
        ops_share_per_year=ops,
    )
    od, rsv, spot, spot_note, source = _cloud_prices(gpu, gpus_per_box, cloud, region)
    od = on_demand_usd if on_demand_usd is not None else od
    rsv = reserved_usd if reserved_usd is not None else rsv
    if spot_usd is not None:
        spot, spot_note = spot_usd * _spot_overhead(None)[0], "given price x interruption overhead"
    if od is None:
        raise ConfigError(
            "no on-demand price to compare with", hint="pass --gpu or --on-demand-usd"
        )
    options = compare(
        gpu_hours,
        hardware,
        on_demand_usd_per_gpu_hour=od,
        reserved_usd_per_gpu_hour=rsv,
        spot_usd_per_gpu_hour=spot,
        spot_note=spot_note,
    )
    if as_json:
        return _print_json({"cloud_prices_from": source, "options": [asdict(o) for o in options]})
    _roi_table(options, gpu_hours, hardware, source)


def _roi_table(options: list[Any], gpu_hours: float, hardware: Any, source: str) -> None:
    """The options cheapest first, each with the utilisation above which buying pays."""
    from rich.table import Table

    table = Table(title=_plain(f"{gpu_hours:,.0f} GPU-hours a year: cheapest first ({source})"))
    for col in ("option", "$/GPU-h", "$/year", "buying pays above", "note"):
        table.add_column(col)
    for o in options:
        be = o.break_even_utilisation
        be_text = (
            "" if be is None else f"never (would need {be:.0%})" if be > 1 else f"{be:.0%} busy"
        )
        _add_row(
            table, o.name, f"{o.usd_per_gpu_hour:.3f}", f"${o.usd_per_year:,.0f}", be_text, o.note
        )
    console = _wide_console()
    console.print(table)
    be = next(o for o in options if o.name == "on-demand").break_even_utilisation or math.inf
    console.print(
        "break-even utilisation against on-demand: "
        + ("never (power costs more than renting)" if math.isinf(be) else f"{be:.0%}")
        + f"; your need keeps the hardware busy {hardware.busy_share(gpu_hours):.0%} of the year"
    )


def _spot_overhead(rate: float | None) -> tuple[float, float]:
    """(wall/compute factor, rate) for a long job with default checkpointing at ``rate``."""
    from spotwise.market.advisor import (
        DEFAULT_CHECKPOINT_COST_H,
        DEFAULT_RESTART_H,
        expected_wall_hours,
    )
    from spotwise.market.interruption import load_interruption_model

    if rate is None:
        rate = load_interruption_model().rate("aws", "", "", "").rate_per_h
    exp = expected_wall_hours(
        100, rate, checkpoint_cost_h=DEFAULT_CHECKPOINT_COST_H, restart_h=DEFAULT_RESTART_H
    )
    return exp.expected_hours / 100, rate


def _cloud_prices(
    gpu: str | None, count: int, cloud: str | None, region: str | None
) -> tuple[float | None, float | None, float | None, str, str]:
    """Per-GPU-hour on-demand, reserved and effective spot prices from the shipped catalog."""
    if gpu is None:
        return None, None, None, "", "prices given on the command line"
    from spotwise.market.catalog import load_catalog, load_reserved_prices
    from spotwise.market.interruption import load_interruption_model

    catalog = load_catalog()
    offers = [
        o
        for o in catalog.select(gpu=gpu, count=count, cloud=cloud, region=region)
        if o.host_included
    ]
    on_demand = [o for o in offers if o.market == "on-demand"]
    if not on_demand:
        catalog.find(gpu=gpu, count=count, cloud=cloud)  # raises with the reason
        raise MarketError(f"no on-demand {count} x {gpu} offer in {region or 'any region'}")
    od = min(on_demand, key=lambda o: o.usd_per_hour)
    reserved = load_reserved_prices().get((od.cloud, od.region, od.instance_type))
    spots = [o for o in offers if o.market == "spot" and o.cloud == od.cloud]
    spot, note = None, ""
    if spots:
        model = load_interruption_model()

        def effective(o: Any) -> float:
            rate = model.rate(o.cloud, o.region, o.zone, o.instance_type).rate_per_h
            return o.usd_per_hour * _spot_overhead(rate)[0]

        best = min(spots, key=effective)
        spot = effective(best) / best.gpus
        factor, rate = _spot_overhead(
            model.rate(best.cloud, best.region, best.zone, best.instance_type).rate_per_h
        )
        note = (
            f"{best.instance_type} {best.region} {best.zone}: ${best.usd_per_hour:.2f}/h x "
            f"{factor:.2f} for {rate:.2f} interruptions/h"
        ).replace("  ", " ")
    source = f"{od.cloud} {od.instance_type} in {od.region}, catalog"
    return (od.usd_per_hour / od.gpus, reserved / od.gpus if reserved else None, spot, note, source)
