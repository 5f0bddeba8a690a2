"""Spot availability traces: load them from files into one small immutable value.

A trace is a sequence of ticks of ``gap_s`` seconds; ``counts[t]`` is how many spot instances were
available during tick t (``[t*gap_s, (t+1)*gap_s)``). Spot is usable for a job of N nodes in tick
t when ``counts[t] >= N``. Two file formats are read:

- JSON, as published with "Can't Be Late" (NSDI'24):
  ``{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}``.
- CSV of ``time,count`` rows: a step function, each count holding from its time until the next
  row's (rows with the same time are allowed: the last one wins). Time is in seconds, or in hours
  when the header's first column says so (``hours``, ``time_h``). An optional header line is
  skipped. It is sampled at the start of every tick of ``gap_s`` seconds (given, or else the
  smallest positive time step in the file).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spotwise.errors import TraceError

_FORMAT_HINT = (
    'use JSON {"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]} or a CSV of time_s,count rows'
)


@dataclass(frozen=True, eq=False)
class Trace:
    """Spot availability of one zone (or market) over time, tick by tick."""

    gap_s: float
    counts: np.ndarray = field(repr=False)
    name: str = "trace"
    zone: str = ""

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts)
        if counts.ndim != 1 or counts.size == 0:
            raise TraceError(f"trace {self.name!r} has no ticks", hint=_FORMAT_HINT)
        if not (math.isfinite(self.gap_s) and self.gap_s > 0):
            raise TraceError(
                f"trace {self.name!r} has tick length {self.gap_s!r}; it must be > 0 seconds",
                hint=_FORMAT_HINT,
            )
        if not np.issubdtype(counts.dtype, np.number) or np.any(~np.isfinite(counts)):
            raise TraceError(f"trace {self.name!r} has non-numeric counts", hint=_FORMAT_HINT)
        if np.any(counts < 0):
            raise TraceError(f"trace {self.name!r} has negative counts", hint=_FORMAT_HINT)
        counts = counts.astype(np.int64)
        counts.setflags(write=False)
        object.__setattr__(self, "counts", counts)

    @property
    def n_ticks(self) -> int:
        return int(self.counts.size)

    @property
    def gap_h(self) -> float:
        return self.gap_s / 3600.0

    @property
    def duration_h(self) -> float:
        return self.n_ticks * self.gap_h

    def available(self, nodes: int = 1) -> np.ndarray:
        """Boolean per tick: could a job of ``nodes`` nodes run on spot during that tick?"""
        return self.counts >= nodes

    def availability(self, nodes: int = 1) -> float:
        """Fraction of ticks with spot available for ``nodes`` nodes."""
        return float(np.mean(self.available(nodes)))


def load_trace(path: str | Path, *, gap_s: float | None = None, zone: str | None = None) -> Trace:
    """Read a trace file (JSON or CSV, chosen by suffix).

    ``gap_s`` overrides/sets the tick length (required by nothing; a CSV infers it). ``zone``
    defaults to the file name's part before the first ``_`` (``us-west-2a_v100_1.json`` ->
    ``us-west-2a``).
    """
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file {str(p)!r} does not exist", hint="check the path")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace file {str(p)!r}: {exc}") from exc
    zone = zone if zone is not None else p.stem.split("_")[0]
    if p.suffix.lower() == ".json":
        return parse_json_trace(text, name=p.stem, zone=zone, gap_s=gap_s)
    if p.suffix.lower() in {".csv", ".txt"}:
        return parse_csv_trace(text, name=p.stem, zone=zone, gap_s=gap_s)
    raise TraceError(f"trace file {str(p)!r} is neither .json nor .csv", hint=_FORMAT_HINT)


def parse_json_trace(
    text: str, *, name: str = "trace", zone: str = "", gap_s: float | None = None
) -> Trace:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"trace {name!r} is not valid JSON: {exc}", hint=_FORMAT_HINT) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise TraceError(f"trace {name!r} has no 'data' list", hint=_FORMAT_HINT)
    meta = doc.get("metadata") or {}
    gap = gap_s
    if gap is None and isinstance(meta, dict):
        gap = meta.get("gap_seconds")
    if gap is None:
        raise TraceError(f"trace {name!r} has no metadata.gap_seconds", hint=_FORMAT_HINT)
    data = doc["data"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data):
        raise TraceError(f"trace {name!r} has non-numeric counts", hint=_FORMAT_HINT)
    try:
        gap_f = float(gap)
    except (TypeError, ValueError) as exc:
        raise TraceError(f"trace {name!r} has gap_seconds {gap!r}", hint=_FORMAT_HINT) from exc
    return Trace(gap_s=gap_f, counts=np.asarray(data, dtype=float), name=name, zone=zone)


def parse_csv_trace(
    text: str, *, name: str = "trace", zone: str = "", gap_s: float | None = None
) -> Trace:
    rows = [r for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
    if not rows:
        raise TraceError(f"trace {name!r} is empty", hint=_FORMAT_HINT)
    scale = 1.0
    try:
        float(rows[0][0])
    except ValueError:
        header = rows.pop(0)[0].strip().lower()
        scale = 3600.0 if header.startswith("hour") or header.endswith("_h") else 1.0
    times: list[float] = []
    values: list[float] = []
    for lineno, row in enumerate(rows, start=1):
        if len(row) < 2:
            raise TraceError(f"trace {name!r} row {lineno} needs time,count", hint=_FORMAT_HINT)
        try:
            times.append(float(row[0]) * scale)
            values.append(float(row[1]))
        except ValueError as exc:
            raise TraceError(
                f"trace {name!r} row {lineno} is not numeric: {row!r}", hint=_FORMAT_HINT
            ) from exc
    t = np.asarray(times)
    if np.any(np.diff(t) < 0):
        raise TraceError(f"trace {name!r} times go backwards", hint="sort the rows by time")
    if gap_s is None:
        steps = np.diff(t)
        steps = steps[steps > 0]
        if steps.size == 0:
            raise TraceError(
                f"trace {name!r} needs at least two distinct times to infer the tick length",
                hint="pass gap_s",
            )
        gap_s = float(steps.min())
    n_ticks = max(1, math.floor((t[-1] - t[0]) / gap_s + 1e-9) + 1)
    tick_starts = t[0] + np.arange(n_ticks) * gap_s
    # the last row at or before each tick start holds during that tick
    idx = np.searchsorted(t, tick_starts + 1e-9 * gap_s, side="right") - 1
    return Trace(gap_s=float(gap_s), counts=np.asarray(values)[idx], name=name, zone=zone)


SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"


def shipped_traces() -> list[str]:
    """Names (``group/file``) of the real traces shipped in the package (see its README)."""
    return sorted(p.relative_to(SHIPPED_DIR).as_posix() for p in SHIPPED_DIR.glob("*/*.json"))


def shipped_trace_path(name: str) -> Path:
    """The file of a shipped trace, by ``group/file`` name or a unique file stem/zone."""
    names = shipped_traces()
    matches = [n for n in names if name in (n, n.removesuffix(".json"), Path(n).stem)]
    if not matches:
        matches = [n for n in names if Path(n).stem.split("_")[0] == name]
    if len(matches) != 1:
        raise TraceError(
            f"no unique shipped trace named {name!r}",
            hint=f"choose one of: {', '.join(names)}",
        )
    return SHIPPED_DIR / matches[0]


def load_shipped_trace(name: str) -> Trace:
    return load_trace(shipped_trace_path(name))


def iter_shipped(group: str) -> Iterator[Trace]:
    for n in shipped_traces():
        if n.startswith(group + "/"):
            yield load_shipped_trace(n)
