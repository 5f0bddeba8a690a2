"""Progress as committed work: what a preemption cannot take away.

The controller measures a job's progress by its newest *committed* checkpoint (its manifest,
read with the listing checks of :mod:`spotwise.checkpoint`, torch-free, for a local run
directory or an ``s3://`` one through the ``Storage`` seam) and its step rate from the
runtime's ``events.jsonl``. Work done after the last commit is lost when the machine goes, so it
never counts. Running time is not progress.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotwise.checkpoint.read import list_checkpoints
from spotwise.checkpoint.remote import is_remote, list_remote


@dataclass(frozen=True)
class Committed:
    step: int  # newest valid checkpoint's step; 0 when there is none
    step_rate: float | None  # training steps per wall second, measured; None until known


def step_rate(points: Iterable[tuple[float, int, bool]]) -> float | None:
    """Steps per second over stretches of training: ``points`` are (time, step, starts_stretch)
    in time order (a run's ``start`` event starts a stretch, each ``checkpoint`` continues it).
    Each stretch counts from its start to its last checkpoint, so restores and outages between
    stretches are not training time."""
    steps = seconds = 0.0
    first: tuple[float, int] | None = None
    last: tuple[float, int] | None = None
    for t, step, starts in (*points, (0.0, 0, True)):
        if starts:
            if first is not None and last is not None and last[1] > first[1] and last[0] > first[0]:
                steps += last[1] - first[1]
                seconds += last[0] - first[0]
            first, last = (t, step), None
        elif first is not None:
            last = (t, step)
    return steps / seconds if seconds > 0 else None


def _event_points(events: list[dict[str, Any]]) -> list[tuple[float, int, bool]]:
    return [
        (float(e["time"]), int(e["step"]), e["kind"] == "start")
        for e in events
        if e.get("kind") in ("start", "checkpoint")
        and isinstance(e.get("time"), (int, float))
        and isinstance(e.get("step"), int)
    ]


def read_committed(checkpoint_dir: str | os.PathLike[str]) -> Committed:
    """The newest committed step and the measured step rate of a run directory or URI.

    A remote run directory keeps its events on the machine, so there the rate comes from the
    commit times of consecutive checkpoints (an outage between two of them lowers it: a safe
    error, since it makes the remaining work look longer)."""
    location = os.fspath(checkpoint_dir)
    if is_remote(location):
        infos = [i for i in list_remote(location) if i.valid]
        points = [(i.wall_time, i.step, n == 0) for n, i in enumerate(infos) if i.wall_time]
    else:
        from spotwise.telemetry.events import EVENTS_FILE, read_events

        infos = [i for i in list_checkpoints(location) if i.valid]
        points = _event_points(read_events(Path(location) / EVENTS_FILE))
    return Committed(max((i.step for i in infos), default=0), step_rate(points))


def compute_s(steps: int | None, expected_runtime_s: float | None, rate: float | None) -> float:
    """The job's uninterrupted compute time (wall s): measured once the step rate is known,
    else the job file's estimate; 0 when neither is known."""
    if steps is not None and rate:
        return steps / rate
    return expected_runtime_s or 0.0


def progress_s(done: Committed, steps: int | None, total_s: float) -> float:
    """Committed compute (wall s) out of ``total_s``: total minus what is left at the measured
    rate, or the committed share of ``steps``, or committed steps at the rate; 0 if unknown."""
    if steps is not None and done.step_rate:
        left = max(0, steps - done.step) / done.step_rate
        return min(total_s, max(0.0, total_s - left))
    if steps is not None:
        return total_s * min(1.0, done.step / steps)
    if done.step_rate:
        return min(total_s, done.step / done.step_rate)
    return 0.0
