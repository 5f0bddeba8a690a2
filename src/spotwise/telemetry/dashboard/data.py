"""The JSON documents the dashboard pages draw: one row per job, and one job in full.

Both the live dashboard and the self-contained HTML report send these to the same page script,
so the two always show the same thing. Long series are thinned to at most ``MAX_POINTS`` evenly
spaced points (the chart is a few hundred pixels wide); the newest point is always kept.
A metric that went NaN or infinite is sent as ``null`` (a gap in its chart) and named, with the
step where that first happened, under ``metrics.nonfinite``: a diverged run is worth saying so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from spotwise.control.store import Attempt
from spotwise.telemetry.jobview import JobView
from spotwise.telemetry.jsonsafe import nonfinite_name

MAX_POINTS = 2000
LOG_TAIL_LINES = 60
LOG_TAIL_BYTES = 32_768
T = TypeVar("T")
Rel = Callable[[float | None], float | None]  # a time -> seconds since the job was created


def thin(items: Sequence[T], limit: int = MAX_POINTS) -> list[T]:
    if len(items) <= limit:
        return list(items)
    stride = len(items) / (limit - 1)
    return [items[int(i * stride)] for i in range(limit - 1)] + [items[-1]]


def job_row(view: JobView) -> dict[str, Any]:
    """One line of the jobs page: the ``status --json`` numbers plus the deadline."""
    s = view.summary
    deadline_at = (
        view.job.created_at + view.spec.deadline_s if view.spec.deadline_s is not None else None
    )
    return {
        "id": s["id"],
        "name": s["name"],
        "state": s["state"],
        "message": s["message"],
        "attempts": len(s["attempts"]),
        "preemptions": s["preemptions"],
        "cost_usd": s["cost_usd"],
        "ondemand_cost_usd": s["ondemand_cost_usd"],
        "savings_usd": s["savings_usd"],
        "deadline_at": deadline_at,
        "created_at": s["created_at"],
        "controller_alive": s["controller_alive"],
        "terminal": view.job.state.terminal,
    }


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    return text.splitlines()[-lines:]


def job_detail(view: JobView) -> dict[str, Any]:
    """Everything the job page draws, times in seconds since the job was created."""
    t0 = view.job.created_at

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 3)

    return {
        "row": job_row(view),
        "summary": view.summary,
        "ledger": view.ledger.as_dict(),
        "now": round(view.ledger.wall_s, 3),  # the job's end, once it has ended
        "deadline_s": view.spec.deadline_s,
        "expected_runtime_s": view.spec.expected_runtime_s,
        "attempts": [_attempt(a, rel) for a in view.attempts],
        "segments": [
            [rel(s.start), rel(s.end), s.kind, s.attempt]
            for s in thin(view.ledger.segments, 4 * MAX_POINTS)
        ],
        "notices": [
            {"t": rel(e["time"]), "source": e.get("source"), "kind": e["kind"]}
            for e in thin(view.runtime("notice") + view.runtime("interrupted"))
        ],
        "checkpoints": [
            {
                "t": rel(e["time"]),
                "step": e.get("step"),
                "reason": e.get("reason"),
                "bytes": e.get("bytes"),
                "stall_s": e.get("stall_s"),
                "write_s": e.get("write_s"),
            }
            for e in thin(view.runtime("checkpoint"))
        ],
        "metrics": _metrics(view, rel),
        "gpu": _gpu(view, rel),
        "events": [
            {"t": rel(e["at"]), "kind": e["kind"], "message": e["message"]}
            for e in view.events[-100:]
        ],
        "log_tail": log_tail(view.job.log_path),
        "rightsizing": view.rightsizing().as_dict(),
    }


def _attempt(a: Attempt, rel: Rel) -> dict[str, Any]:
    return {
        "n": a.n,
        "market": a.market,
        "zone": a.zone or "-",
        "start": rel(a.started_at),
        "running": rel(a.running_at),
        "end": rel(a.ended_at),
        "reason": a.reason,
        "usd_per_hour": a.usd_per_hour,
        "ondemand_usd_per_hour": a.ondemand_usd_per_hour,
        "time_scale": a.time_scale,
    }


def _metrics(view: JobView, rel: Rel) -> dict[str, Any]:
    """The run's metrics, thinned to the page's points, and the first non-finite value of each
    (found in all of them: thinning may drop the one step that diverged)."""
    every_metric = view.runtime("metrics")
    metrics = thin(every_metric)
    nonfinite: dict[str, dict[str, Any]] = {}
    for e in every_metric:
        for name, value in e.get("values", {}).items():
            kind = nonfinite_name(value)
            if kind is not None and name not in nonfinite:
                nonfinite[name] = {"value": kind, "step": e.get("step"), "t": rel(e["time"])}
    names = sorted({k for e in metrics for k in e.get("values", {})})
    return {
        "t": [rel(e["time"]) for e in metrics],
        "step": [e.get("step") for e in metrics],
        "values": {n: [e.get("values", {}).get(n) for e in metrics] for n in names},
        "nonfinite": nonfinite,
    }


def _gpu(view: JobView, rel: Rel) -> dict[str, Any]:
    """Each GPU's utilisation and memory over time (None where a sample lacks the device)."""
    gpu = thin(view.runtime("gpu"))
    devices = sorted({d["index"] for e in gpu for d in e.get("devices", []) if "index" in d})

    def series(key: str) -> dict[str, list[float | None]]:
        out: dict[str, list[float | None]] = {}
        for i in devices:
            out[str(i)] = [
                next((d.get(key) for d in e.get("devices", []) if d.get("index") == i), None)
                for e in gpu
            ]
        return out

    return {
        "t": [rel(e["time"]) for e in gpu],
        "util_pct": series("util_pct"),
        "mem_used_bytes": series("mem_used_bytes"),
        "mem_total_bytes": series("mem_total_bytes"),
    }
