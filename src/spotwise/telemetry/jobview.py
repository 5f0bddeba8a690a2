"""Everything the views show about one job, gathered in one place (read only).

The dashboard, the HTML report, ``advise --from-job`` and the controller's ``/metrics`` all read
a job through :func:`job_view`: the ``spotwise status --json`` summary, the controller's events,
the runtime's events from the job's run directory and the goodput ledger computed from them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotwise.control.spec import JobSpec, stored_spec
from spotwise.control.store import Attempt, Job, Store
from spotwise.control.summary import job_summary
from spotwise.telemetry.events import EVENTS_FILE, read_events
from spotwise.telemetry.ledger import Ledger, goodput
from spotwise.telemetry.rightsizing import Rightsizing, rightsize


@dataclass
class JobView:
    job: Job
    spec: JobSpec
    summary: dict[str, Any]  # exactly what `spotwise status --json` prints
    attempts: list[Attempt]
    events: list[dict[str, Any]]  # the controller's (store) events
    runtime_events: list[dict[str, Any]]  # the training processes' events, all attempts
    ledger: Ledger
    now: float

    def runtime(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.runtime_events if e.get("kind") == kind]

    def rightsizing(self) -> Rightsizing:
        """Advice for the rest of the job (for a rerun, once it has ended) from its GPU
        samples, priced in the market it spent most time in."""
        from spotwise.market.catalog import load_catalog

        billed: dict[str, float] = {}
        for a in self.attempts:
            billed[a.market] = billed.get(a.market, 0.0) + a.billed_h(self.now)
        market = (
            max(billed, key=lambda m: billed[m])
            if billed
            else ("on-demand" if self.spec.market == "on-demand" else "spot")
        )
        scale = self.attempts[-1].time_scale if self.attempts else 1.0
        useful_s = self.ledger.seconds["useful"]
        if self.job.state.terminal:
            work_s, work = useful_s, "for a rerun"
        else:
            work_s = max(0.0, (self.spec.expected_runtime_s or useful_s) - useful_s)
            work = "of work left"
        return rightsize(
            self.runtime("gpu"),
            instance_type=self.spec.resources.instance_type or "",
            market=market,
            remaining_h=work_s * scale / 3600.0,
            types=load_catalog().find(),
            work=work,
        )


def run_dir(job: Job, spec: JobSpec) -> Path | None:
    """The job's local run directory (the controller's ``SPOTWISE_CHECKPOINT_DIR``); None when
    checkpoints go straight to an object store, whose event log stays on each machine."""
    if spec.checkpoint_dir is None:
        return job.dir / "checkpoint"
    # spec.py resolves local paths to absolute ones; anything else names a storage URI
    return Path(spec.checkpoint_dir) if spec.checkpoint_dir.startswith("/") else None


def job_end(job: Job, attempts: list[Attempt], now: float) -> float:
    """When a finished job ended (its last state change); now for one still going."""
    if not job.state.terminal:
        return now
    return max([job.updated_at, *(a.ended_at or job.updated_at for a in attempts)])


def job_view(store: Store, job: Job, now: float | None = None) -> JobView:
    now = time.time() if now is None else now
    spec = stored_spec(job.id, job.spec)
    attempts = store.attempts(job.id)
    directory = run_dir(job, spec)
    runtime_events = read_events(directory / EVENTS_FILE) if directory is not None else []
    ledger = goodput(
        attempts, runtime_events, created_at=job.created_at, end=job_end(job, attempts, now)
    )
    return JobView(
        job=job,
        spec=spec,
        summary=job_summary(store, job, now),
        attempts=attempts,
        events=store.events(job.id),
        runtime_events=runtime_events,
        ledger=ledger,
        now=now,
    )
