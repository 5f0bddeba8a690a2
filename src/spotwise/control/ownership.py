"""Who drives a job: one embedded controller per job holds its ``flock``; a ``spotwise server``
replica holds its lease instead (``control/store/leases.py``). Each refuses a job the other holds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spotwise.control.store import Job
from spotwise.errors import ControllerBusyError


def controller_lock_path(job: Job) -> Path:
    return job.dir / "controller.lock"


@contextmanager
def controller_lock(job: Job) -> Iterator[None]:
    """Exactly one live embedded controller per job (a server's hold the job's lease)."""
    from spotwise.control.providers.process import take_lock

    job.dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(controller_lock_path(job), os.O_RDWR | os.O_CREAT, 0o600)
    if not take_lock(fd):
        os.close(fd)
        raise ControllerBusyError(
            f"job {job.id} already has a running controller",
            hint=f"watch it with: spotwise status {job.id}",
        )
    try:
        yield
    finally:
        os.close(fd)


def controller_alive(job: Job) -> bool:
    """Whether a controller drives the job: an embedded one on this host, or a server."""
    return embedded_alive(job) or server_drives(job)


def embedded_alive(job: Job) -> bool:
    from spotwise.control.providers.process import lock_held

    return lock_held(controller_lock_path(job))


def server_drives(job: Job) -> bool:
    """Whether a ``spotwise server`` replica holds the job's lease (as last read)."""
    return job.lease_owner is not None and job.lease_expires_at > time.time()
