"""SLURM: signals with the job's own deadlines.

- ``sbatch --signal=USR1@90`` sends the signal ``secs`` before the job's end time, so its deadline
  is that end time (``SLURM_JOB_END_TIME`` at start, re-read live with ``squeue`` on each signal,
  since preemption or ``scontrol update`` move it).
- A preemption with ``GraceTime`` sends SIGTERM at once and kills at now + GraceTime (read from
  ``scontrol show partition``, or ``SPOTWISE_GRACE_S``); without GraceTime, SIGKILL follows after
  ``KillWait`` (30 s by default).

On SLURM the watched signals default to TERM, INT and USR1 (``SPOTWISE_SIGNALS`` overrides).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from spotwise import settings
from spotwise.notices.base import LogOnce, Notice, deadline_from_wall
from spotwise.notices.signals import DEFAULT_GRACE_S, SignalDetector, SignalRecord

log = logging.getLogger("spotwise.notices")

SLURM_SIGNALS = ("TERM", "INT", "USR1")
SIGNAL_LEAD_S = 60.0  # sbatch --signal default lead when the end time is unknown
MAX_SIGNAL_LEAD_S = 86400.0
Runner = Callable[[list[str]], "str | None"]


def parse_end_time(text: str) -> float | None:
    """``squeue -o %e`` / ``scontrol`` EndTime (``2026-11-29T23:59:00``, local time) or epoch
    seconds -> POSIX seconds; None for ``N/A``, ``Unknown``, ``None`` or empty."""
    text = text.strip()
    if not text or text.upper() in ("N/A", "UNKNOWN", "NONE", "INVALID"):
        return None
    if text.isdigit():
        return float(text)
    try:
        return time.mktime(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timetuple())
    except ValueError:
        return None


def parse_scontrol(text: str) -> dict[str, str]:
    """``Key=Value Key2=Value2`` lines of ``scontrol show ...`` -> dict (first occurrence wins)."""
    fields: dict[str, str] = {}
    for key, value in re.findall(r"(\w+)=(\S*)", text):
        fields.setdefault(key, value)
    return fields


def grace_time_s(partition_text: str) -> float | None:
    """GraceTime from ``scontrol show partition``; None when absent or 0 (no grace)."""
    raw = parse_scontrol(partition_text).get("GraceTime", "")
    return float(raw) if raw.isdigit() and int(raw) > 0 else None


def run_command(argv: list[str]) -> str | None:
    """Run a SLURM command with a short timeout; None if it is missing or fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("spotwise: %s failed: %s", argv[0], exc)
        return None
    return done.stdout if done.returncode == 0 else None


class SlurmDetector(SignalDetector):
    name = "slurm"

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        runner: Runner = run_command,
        refresh_in_background: bool = True,
    ) -> None:
        env = os.environ if env is None else env
        signals = None if settings.SIGNALS.raw(env) else SLURM_SIGNALS
        self._explicit_grace = bool(settings.GRACE_S.raw(env))
        super().__init__(signals=signals, env=env)
        self.job_id = env.get("SLURM_JOB_ID", "")
        self.partition = env.get("SLURM_JOB_PARTITION", "")
        self.end_wall = parse_end_time(env.get("SLURM_JOB_END_TIME", ""))
        self._runner = runner
        self._background = refresh_in_background
        self._refreshed_for = 0
        self._slurm_log = LogOnce(log)
        self._refresh_async()

    def deadline_for(self, record: SignalRecord) -> float:
        if record.signame in ("TERM", "INT"):
            return record.received_monotonic + self.grace_s
        if self.end_wall is None:
            return record.received_monotonic + SIGNAL_LEAD_S
        return deadline_from_wall(
            self.end_wall,
            wall_now=record.received_wall,
            mono_now=record.received_monotonic,
            nominal_s=MAX_SIGNAL_LEAD_S,
        )

    def poll(self) -> Notice | None:
        count = len(self._records)
        if count > self._refreshed_for:  # re-read the live end time on each signal
            self._refreshed_for = count
            self._refresh_async()
        return super().poll()

    def refresh(self) -> None:
        """Read the live end time and the partition's GraceTime (blocking; a few seconds)."""
        if self.job_id:
            out = self._runner(["squeue", "-h", "-j", self.job_id, "-o", "%e"])
            end = parse_end_time(out.splitlines()[0]) if out and out.strip() else None
            if end is not None and end != self.end_wall:
                self.end_wall = end
                self._cached = (0, None)  # recompute notices with the new end time
        if self.partition and not self._explicit_grace:
            out = self._runner(["scontrol", "show", "partition", self.partition])
            grace = grace_time_s(out) if out else None
            new_grace = grace if grace is not None else DEFAULT_GRACE_S
            if new_grace != self.grace_s:
                self.grace_s = new_grace
                self._cached = (0, None)

    def _refresh_async(self) -> None:
        if not self._background:
            self.refresh()
            return
        threading.Thread(target=self.refresh, name="spotwise-slurm-refresh", daemon=True).start()
