"""``spotwise report``: one job as a self-contained HTML file, or its charts as PNG images.

The HTML file is the dashboard's job page with the chart library, the page script and the data
inlined, and a Content-Security-Policy that allows no request at all: it opens offline, from an
e-mail or an issue, and shows exactly what the dashboard shows. The PNGs (matplotlib) draw the
same document for papers and issues. Both draw a value a run logged as NaN or Infinity as a gap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spotwise.registry import require
from spotwise.telemetry.dashboard.data import job_detail
from spotwise.telemetry.dashboard.pages import page
from spotwise.telemetry.jobview import JobView
from spotwise.telemetry.jsonsafe import finite
from spotwise.telemetry.ledger import KINDS

KIND_COLOURS = {
    "useful": "#16a34a",
    "lost": "#dc2626",
    "restore": "#7c3aed",
    "changeover": "#9ca3af",
    "idle": "#e5e7eb",
}  # as in app.js
MARKET_COLOURS = {"spot": "#2563eb", "on-demand": "#ea580c"}


def html_report(view: JobView) -> str:
    return page(
        kind="job",
        title=f"spotwise report: job {view.job.id}",
        data=job_detail(view),
        live=False,
        inline=True,
    )


def png_report(view: JobView, directory: Path) -> list[Path]:
    """Write timeline.png, goodput.png, cost.png and, where there are samples, metrics.png and
    gpu.png into ``directory``; returns the files written."""
    require("matplotlib", "plot", "spotwise report --png")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # zone and metric names are the user's: "$...$" in one is text, not mathtext to parse
    with plt.rc_context({"text.parse_math": False}):
        return _draw(view, directory, plt)


def _draw(view: JobView, directory: Path, plt: Any) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    d = finite(job_detail(view))  # as the page gets it: NaN and Infinity as gaps
    figs = _Figures(directory, plt)
    _timeline(figs, d, view.job.id)
    _goodput(figs, d["ledger"])
    _cost(figs, d)
    if d["metrics"]["t"]:
        figs.lines("metrics.png", d["metrics"]["t"], d["metrics"]["values"], "run.log values")
    if d["gpu"]["t"]:
        figs.lines(
            "gpu.png",
            d["gpu"]["t"],
            {f"GPU {i}": v for i, v in d["gpu"]["util_pct"].items()},
            "utilisation %",
            100,
        )
    return figs.written


class _Figures:
    """The report's pictures, each saved as a PNG into one directory."""

    def __init__(self, directory: Path, plt: Any) -> None:
        self.directory, self.plt = directory, plt
        self.written: list[Path] = []

    def save(self, fig: Any, name: str) -> None:
        path = self.directory / name
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        self.plt.close(fig)
        self.written.append(path)

    def lines(
        self,
        name: str,
        xs: list[Any],
        series: dict[str, list[Any]],
        ylabel: str,
        top: float | None = None,
    ) -> None:
        fig, ax = self.plt.subplots(figsize=(6, 3))
        for label, values in series.items():
            ax.plot(xs, values, label=label)
        ax.set_xlabel("seconds since the job was created")
        ax.set_ylabel(ylabel)
        if top is not None:
            ax.set_ylim(0, top)
        ax.legend()
        self.save(fig, name)


def _timeline(figs: _Figures, d: dict[str, Any], job_id: str) -> None:
    """One row per zone: each attempt's bar coloured by market, an x where it was preempted, and
    beneath it the ledger's kinds of its time."""
    zones = list(dict.fromkeys(a["zone"] for a in d["attempts"]))
    fig, ax = figs.plt.subplots(figsize=(9, 0.6 * len(zones) + 1.4))
    row = {z: i for i, z in enumerate(zones)}
    by_n = {a["n"]: a for a in d["attempts"]}
    for a in d["attempts"]:
        end = d["now"] if a["end"] is None else a["end"]
        ax.barh(
            row[a["zone"]],
            end - a["start"],
            left=a["start"],
            height=0.45,
            color=MARKET_COLOURS.get(a["market"], "#64748b"),
        )
        if a["reason"] in ("preempted", "lost"):
            ax.plot(end, row[a["zone"]], "x", color="#dc2626", markersize=9, mew=2.5)
    for t0, t1, kind, n in d["segments"]:
        if n in by_n:
            ax.barh(
                row[by_n[n]["zone"]] - 0.32, t1 - t0, left=t0, height=0.12, color=KIND_COLOURS[kind]
            )
    ax.set_yticks(range(len(zones)), zones)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the job was created")
    ax.set_title(f"job {job_id}: attempts (blue spot, orange on-demand, x preemption)")
    figs.save(fig, "timeline.png")


def _goodput(figs: _Figures, led: dict[str, Any]) -> None:
    fig, ax = figs.plt.subplots(figsize=(6, 3))
    ax.barh(
        list(KINDS),
        [led["seconds"][k] for k in KINDS],
        color=[KIND_COLOURS[k] for k in KINDS],
        edgecolor="#6b7280",
    )
    for i, k in enumerate(KINDS):
        ax.text(led["seconds"][k], i, f"  ${led['usd'][k]:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("wall seconds")
    ax.set_title(f"goodput {100 * led['goodput']:.1f}%, cost ${led['cost_usd']:.2f}")
    figs.save(fig, "goodput.png")


def _cost(figs: _Figures, d: dict[str, Any]) -> None:
    """The job's cost over time beside what the same hours would have cost on demand."""
    by_n = {a["n"]: a for a in d["attempts"]}
    xs, cost, ondemand = [0.0], [0.0], [0.0]
    for t0, t1, _kind, n in d["segments"]:
        a = by_n.get(n)
        hours = 0.0 if a is None else (t1 - t0) * a["time_scale"] / 3600.0
        xs.append(t1)
        cost.append(cost[-1] + hours * (a["usd_per_hour"] if a else 0.0))
        ondemand.append(ondemand[-1] + hours * (a["ondemand_usd_per_hour"] if a else 0.0))
    figs.lines("cost.png", xs, {"cost": cost, "on-demand, same hours": ondemand}, "USD")
