"""The processes below a process, read from ``/proc`` (Linux): what a group kill misses when a
launcher (torch's agent, a user's program) starts children in sessions of their own. Standard
library only, for the sim/local machines and ``spotwise run`` alike."""

from __future__ import annotations

import os
from pathlib import Path


def proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of a live process from ``/proc/PID/stat``; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[2])


def children(pid: int) -> list[int]:
    """The processes ``pid`` started, from each of its threads' ``/proc/PID/task/*/children``;
    none once it has ended. A process or thread that ends meanwhile takes its folder along, so
    every read may fail (ENOENT or ESRCH) and counts as nothing."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        names = os.listdir(tasks)
    except OSError:
        return []
    found: list[int] = []
    for name in names:
        try:
            found += [int(k) for k in (tasks / name / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int, *, running: bool = False) -> list[int]:
    """Every process below ``pid``; with ``running``, the zombies (ended, not yet reaped) are
    left out."""
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop())
        todo += kids
        found += [k for k in kids if not running or _running(k)]
    return found


def _running(pid: int) -> bool:
    state = proc_state(pid)
    return state is not None and state[0] not in "ZX"
