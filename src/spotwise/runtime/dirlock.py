"""The run directory lock: one training process per run directory, released by the kernel the
moment that process dies, and never held by a process it forked.

The lock is an ``flock`` on ``<run_dir>/.lock``. An flock belongs to the open file description,
and ``fork()`` shares descriptions: a DataLoader worker forked by the training process used to
keep the lock after the training process was SIGKILLed (by the OOM killer, a container runtime,
``kill -9``) until torch's watchdog ended the worker about 5 s later, and a supervisor that
restarted at once was refused. So every forked child closes its copy of the descriptor before
it runs anything else (``os.register_at_fork``), and exec'd children never get it (the
descriptor is non-inheritable, PEP 446). The training process is then the only holder.

POSIX record locks (``fcntl.lockf``), which fork does not inherit, would avoid the hook but
cost more than they give: an exclusive one needs a writable descriptor, and a file open for
writing keeps its file system busy (``mount -o remount,ro`` fails with EBUSY; see
tests/runtime/test_faults.py), and closing *any* descriptor of the file anywhere in the process
silently drops the lock. This one is read-only and only :func:`release` ends it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from spotwise.errors import CheckpointError, ConfigError

LOCK_FILE = ".lock"

_held: set[int] = set()  # this process's lock descriptors, closed in every forked child


def _drop_in_child() -> None:
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_drop_in_child)


def acquire(run_dir: Path) -> int:
    """Lock ``run_dir`` for this process or raise; returns the descriptor for :func:`release`."""
    try:
        # read-only: a held lock must not keep the file system busy for writing
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise ConfigError(
            f"cannot use run directory {run_dir}: {exc.strerror}",
            hint="the run directory must be writable; choose another --run-dir",
        ) from exc
    _held.add(fd)  # before locking, so a fork from another thread cannot keep a locked copy
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        release(fd)
        raise CheckpointError(
            f"another process (or another Run) is using {run_dir}",
            hint="wait for it to finish, close() the other Run, or use a different run directory",
        ) from exc
    return fd


def release(fd: int) -> None:
    """Unlock: closing the only descriptor of the description drops the flock."""
    _held.discard(fd)
    os.close(fd)
