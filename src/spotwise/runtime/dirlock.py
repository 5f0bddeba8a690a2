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

A lock held by another process is waited for, up to the notice grace (``SPOTWISE_GRACE_S``,
30 s by default), naming that process: a supervisor that restarts a job at once (torchrun's
agent SIGKILLed, say) finds the previous generation's ranks still saving and exiting, which
they do within that grace; what still holds it afterwards is another run, and is refused. A
second Run on the same directory in this process is refused at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path

from spotwise.errors import CheckpointError, ConfigError
from spotwise.notices.signals import grace_from_env

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"

_held: set[int] = set()  # this process's lock descriptors, closed in every forked child


def _drop_in_child() -> None:
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_drop_in_child)


_RETRY_S = 0.05  # between tries while another process holds the lock


def acquire(run_dir: Path) -> int:
    """Lock ``run_dir`` for this process or raise; returns the descriptor for :func:`release`.
    Another process's lock is waited for, up to the notice grace (see the module's docstring)."""
    try:
        # read-only: a held lock must not keep the file system busy for writing
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise ConfigError(
            f"cannot use run directory {run_dir}: {exc.strerror}",
            hint="the run directory must be writable; choose another --run-dir",
        ) from exc
    _held.add(fd)  # before locking, so a fork from another thread cannot keep a locked copy
    deadline: float | None = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError as exc:
            holder = _holder_pid(fd)
            if holder == os.getpid() or (deadline is not None and time.monotonic() >= deadline):
                release(fd)
                here = holder == os.getpid()
                who = "another process (or another Run)" if here else _named(holder)
                raise CheckpointError(
                    f"{who} is using {run_dir}",
                    hint="wait for it to finish, close() the other Run, or use a different run "
                    "directory",
                ) from exc
            if deadline is None:
                grace_s = grace_from_env(os.environ)
                deadline = time.monotonic() + grace_s
                log.warning(
                    "spotwise: %s holds %s (a previous run still saving and exiting?); waiting "
                    "up to %g s for it to end",
                    _named(holder),
                    run_dir,
                    grace_s,
                )
        time.sleep(_RETRY_S)


def _holder_pid(fd: int) -> int | None:
    """The pid of the process holding an flock on ``fd``'s file, from ``/proc/locks`` (Linux;
    None where it is not readable or the holder is outside this pid namespace)."""
    stat = os.fstat(fd)
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        with open("/proc/locks") as locks:
            rows = [line.split() for line in locks]
    except OSError:
        return None
    found = [
        row[4] for row in rows if len(row) > 5 and row[1] == "FLOCK" and row[5] == device
    ] or [  # a stacked file system (overlayfs) may report another device for the inode
        row[4]
        for row in rows
        if len(row) > 5 and row[1] == "FLOCK" and row[5].endswith(f":{stat.st_ino}")
    ]
    pid = int(found[0]) if len(found) == 1 and found[0].isdigit() else 0
    return pid or None


def _named(pid: int | None) -> str:
    return "another process" if pid is None else f"another process (PID {pid})"


def release(fd: int) -> None:
    """Unlock: closing the only descriptor of the description drops the flock."""
    _held.discard(fd)
    os.close(fd)
