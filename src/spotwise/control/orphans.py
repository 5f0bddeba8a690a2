"""The orphan sweep: a job's machines that no open attempt owns (a crashed controller's launch
it never recorded, an attempt's machine that outlived its end) are terminated, found through the
provider's own bookkeeping (tags, job names, attempt directories)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spotwise.control.providers import Handle, Phase, Provider
from spotwise.control.providers.base import orphans
from spotwise.control.store import Attempt, Job, Store
from spotwise.errors import TransientProviderError


def terminate_and_wait(
    provider: Provider,
    handle: Handle,
    terminate: Callable[[Handle], None],
    sleep: Callable[[float], None],
) -> None:
    """Terminate a machine (``terminate``: the controller's, fenced) and wait (up to a minute)
    until the provider reports it ended."""
    terminate(handle)
    for _ in range(600):
        if provider.status(handle).phase in (Phase.EXITED, Phase.LOST):
            return
        sleep(0.1)


def sweep(
    store: Store,
    provider: Provider,
    job: Job,
    attempts_dir: Path,
    attempt: Attempt | None,
    terminate_and_wait: Callable[[Handle], None],
) -> None:
    """Terminate every machine of the job that the open ``attempt`` (if any) does not own."""
    try:
        found = provider.find(job.id, attempts_dir)
    except TransientProviderError as exc:  # the next start or the job's end sweeps again
        store.event(job.id, "control-plane", f"orphan sweep not possible now: {exc.message}")
        return
    for handle in orphans(
        found, attempt.n if attempt else None, attempt.handle if attempt else None
    ):
        if provider.status(handle).phase not in (Phase.EXITED, Phase.LOST):
            store.event(
                job.id,
                "orphan",
                f"terminating {handle['id']} (attempt {handle['n']}), which no live attempt owns",
            )
            terminate_and_wait(handle)
