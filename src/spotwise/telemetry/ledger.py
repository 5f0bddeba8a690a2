"""The goodput ledger: where a job's wall time and dollars went, from the events of all attempts.

One pure function, :func:`goodput`, used by every view (dashboard, report, ``/metrics``, advice),
so they can never disagree. It tiles the job's wall time, from creation to ``end``, into
segments of five kinds:

- ``useful``: training whose steps were kept (the next attempt resumed from at or after them);
- ``lost``: training whose steps were recomputed later, i.e. after the checkpoint that the next
  attempt resumed from (all of an attempt's training when none of its checkpoints was used);
- ``restore``: loading the checkpoint at the start of an attempt (``restore_s`` of ``start``);
- ``changeover``: from asking for a machine until the training process begins restoring
  (queueing, provisioning, boot, interpreter start), plus time with no machine before an attempt;
- ``idle``: the rest: a billed machine after its process stopped (saved and exited, finished) or
  one whose process never began training, and time with no machine after the last attempt.

Every billed segment is priced at its attempt's ``usd_per_hour`` (on its ``time_scale``: the
simulated market bills simulated hours), so the dollars sum to exactly what the attempts cost.
Runtime clocks are trusted only within the attempt that contains them: each time taken from an
event is clamped into its attempt's window, which keeps the tiling exact under clock skew.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

KINDS = ("useful", "lost", "restore", "changeover", "idle")


class AttemptLike(Protocol):
    """What the ledger reads of an attempt (``spotwise.control.store.Attempt`` has it)."""

    n: int
    market: str
    zone: str
    started_at: float
    running_at: float | None
    ended_at: float | None
    usd_per_hour: float
    ondemand_usd_per_hour: float
    time_scale: float


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    kind: str
    attempt: int | None  # None: no machine held

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Ledger:
    wall_s: float
    seconds: dict[str, float]
    usd: dict[str, float]
    cost_usd: float
    ondemand_run_usd: float  # the same useful compute on one on-demand machine, one changeover
    segments: list[Segment] = field(default_factory=list)
    runtime_events: int = 0  # runtime events seen; 0 means training time could not be placed

    @property
    def savings_usd(self) -> float:
        """Dollars saved against running the job on on-demand only."""
        return self.ondemand_run_usd - self.cost_usd

    @property
    def goodput(self) -> float:
        """Useful share of the wall time (0..1)."""
        return self.seconds["useful"] / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 6),
            "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
            "usd": {k: round(v, 6) for k, v in self.usd.items()},
            "cost_usd": round(self.cost_usd, 6),
            "ondemand_run_usd": round(self.ondemand_run_usd, 6),
            "savings_usd": round(self.savings_usd, 6),
            "goodput": round(self.goodput, 6),
            "runtime_events": self.runtime_events,
        }


@dataclass
class _Session:
    """One training process: from its ``start`` event to its last event."""

    start: Mapping[str, Any]
    events: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.start.get("step", 0))

    def stopped_at(self) -> float | None:
        """When the process stopped training (saved and exited, or finished), if it said so."""
        for e in self.events:
            if e.get("kind") in ("interrupted", "finished"):
                return float(e["time"])
        return None

    def kept_until(self, resumed_step: int) -> float | None:
        """When the step that the next process resumed from was reached here (None: not here)."""
        for e in self.events:
            if e.get("kind") == "checkpoint" and int(e.get("step", -1)) == resumed_step:
                return float(e["time"]) - float(e.get("write_s", 0.0))
        return None


def _sessions(events: Sequence[Mapping[str, Any]]) -> list[_Session]:
    sessions: list[_Session] = []
    for e in sorted(events, key=lambda e: float(e.get("time", 0.0))):
        if e.get("kind") == "start":
            sessions.append(_Session(e))
        elif sessions:
            sessions[-1].events.append(e)
    return sessions


def _owners(
    attempts: Sequence[AttemptLike], sessions: list[_Session], end: float
) -> dict[int, list[_Session]]:
    """Each process (session) belongs to the attempt whose window is nearest its start."""
    owner: dict[int, list[_Session]] = {}
    for s in sessions:
        t = float(s.start["time"])

        def distance(a: AttemptLike, t: float = t) -> float:
            a_end = a.ended_at if a.ended_at is not None else end
            return max(a.started_at - t, t - a_end, 0.0)

        if attempts:
            owner.setdefault(min(attempts, key=distance).n, []).append(s)
    return owner


def goodput(
    attempts: Sequence[AttemptLike],
    events: Sequence[Mapping[str, Any]],
    *,
    created_at: float,
    end: float,
) -> Ledger:
    """Split the wall time ``created_at..end`` and the attempts' cost into the five kinds.

    ``events`` are the runtime's events (``events.jsonl`` of the job's run directory, all
    attempts); ``end`` is when the job ended, or now for a job still running (an open attempt is
    billed until ``end``).
    """
    attempts = sorted(attempts, key=lambda a: a.started_at)
    owner = _owners(attempts, _sessions(events), end)
    ordered = [s for a in attempts for s in owner.get(a.n, [])]
    resumed_by = {id(s): nxt.step for s, nxt in itertools.pairwise(ordered)}

    segments: list[Segment] = []
    cursor = created_at
    for a in attempts:
        a_end = max(a.started_at, a.ended_at if a.ended_at is not None else end)
        if a.started_at > cursor:
            segments.append(Segment(cursor, a.started_at, "changeover", None))
        segments.extend(_attempt_segments(a, a_end, owner.get(a.n, []), resumed_by))
        cursor = max(cursor, a_end)
    if end > cursor:
        segments.append(Segment(cursor, end, "idle", None))

    seconds = dict.fromkeys(KINDS, 0.0)
    usd = dict.fromkeys(KINDS, 0.0)
    by_n = {a.n: a for a in attempts}
    ondemand_run = 0.0
    first_changeover = attempts[0].n if attempts else None
    for seg in segments:
        seconds[seg.kind] += seg.seconds
        if seg.attempt is None:
            continue
        a = by_n[seg.attempt]
        hours = seg.seconds * a.time_scale / 3600.0
        usd[seg.kind] += hours * a.usd_per_hour
        if seg.kind == "useful" or (seg.kind == "changeover" and seg.attempt == first_changeover):
            ondemand_run += hours * a.ondemand_usd_per_hour
    return Ledger(
        wall_s=max(0.0, end - created_at),
        seconds=seconds,
        usd=usd,
        cost_usd=sum(usd.values()),
        ondemand_run_usd=ondemand_run,
        segments=segments,
        runtime_events=len(events),
    )


def _attempt_segments(
    a: AttemptLike, a_end: float, sessions: list[_Session], resumed_by: dict[int, int]
) -> list[Segment]:
    """Tile one attempt's billed window ``started_at..a_end`` exactly."""

    def clamp(t: float) -> float:
        return min(max(t, cursor), a_end)

    out: list[Segment] = []
    cursor = a.started_at

    def add(until: float, kind: str) -> None:
        nonlocal cursor
        until = clamp(until)
        if until > cursor:
            out.append(Segment(cursor, until, kind, a.n))
            cursor = until

    for s in sessions:
        trained_from = float(s.start["time"])
        add(trained_from - float(s.start.get("restore_s", 0.0)), "changeover")
        add(trained_from, "restore")
        stopped = s.stopped_at()
        stopped = a_end if stopped is None else stopped  # no word: it trained until the end
        if id(s) in resumed_by:
            kept = s.kept_until(resumed_by[id(s)])
            add(trained_from if kept is None else kept, "useful")
            add(stopped, "lost")
        else:
            add(stopped, "useful")
    if not sessions and a.running_at is not None:
        add(a.running_at, "changeover")
    add(a_end, "idle" if sessions or a.running_at is not None else "changeover")
    return out
