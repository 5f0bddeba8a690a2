"""Pictures of one simulated run: availability, market used, progress vs the uniform line, cost.

matplotlib is the optional ``plot`` extra and is imported only here, only when drawing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spotwise.errors import ConfigError
from spotwise.market.policies.base import Problem
from spotwise.market.simulate import RunResult
from spotwise.registry import require

_COLOURS = {0: "#d9d9d9", 1: "#d62728", 2: "#2ca02c"}  # idle, on-demand, spot


def render_timeline(
    result: RunResult,
    problem: Problem,
    path: str | Path,
    *,
    policy: str = "",
    zone_names: tuple[str, ...] = (),
) -> Path:
    """Draw ``result`` (simulated with ``record=True``) into a PNG (or SVG/PDF by suffix)."""
    tl = result.timeline
    if tl is None:
        raise ConfigError("this run has no timeline", hint="simulate it with record=True")
    matplotlib = require("matplotlib", "plot", "timeline pictures")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "plot", "timeline pictures")
    gap_h = tl.gap_s / 3600.0
    ran = len(tl.market)
    hours = np.arange(tl.available.shape[1] + 1) * gap_h
    fig, axes = plt.subplots(4, 1, figsize=(11, 8), sharex=True, height_ratios=[1.2, 0.6, 2, 1.4])
    zones = tl.available.shape[0]
    names = zone_names or tuple(f"zone {z}" for z in range(zones))
    for z in range(zones):
        axes[0].fill_between(hours[:-1], z, z + tl.available[z] * 0.8, step="post", color="#1f77b4")
    axes[0].set_yticks(np.arange(zones) + 0.4, names[:zones])
    axes[0].set_title("spot available")
    for i, code in enumerate(tl.market):
        axes[1].axvspan(i * gap_h, (i + 1) * gap_h, color=_COLOURS[code], lw=0)
    axes[1].set_yticks([])
    axes[1].set_title("market used (green spot, red on-demand, grey idle)")
    t_end = np.arange(1, ran + 1) * gap_h
    axes[2].plot(t_end, np.array(tl.progress_s) / 3600.0, label="progress", color="black")
    axes[2].plot(
        [0, problem.deadline_h], [0, problem.compute_h], "--", color="grey", label="uniform line"
    )
    axes[2].axvline(problem.deadline_h, color="#d62728", lw=1, label="deadline")
    axes[2].set_ylabel("compute h")
    axes[2].legend(loc="upper left")
    axes[3].plot(t_end, tl.cost_usd, color="#9467bd")
    axes[3].set_ylabel("cost $")
    axes[3].set_xlabel("hours since start")
    met = "met" if result.deadline_met else "MISSED"
    fig.suptitle(
        f"{policy} from {result.start_h:.1f} h: ${result.cost_usd:.2f}, "
        f"spot {result.spot_hours:.1f} h, on-demand {result.ondemand_hours:.1f} h, deadline {met}"
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
