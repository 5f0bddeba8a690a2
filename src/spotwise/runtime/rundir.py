"""The run directory: where a ``run_dir`` argument puts this process's checkpoints, checked
before anything is written there, and its lock.

An object-store ``run_dir`` (``s3://...``) is committed locally first, in a staging directory
(``local_dir``, or one under the cache derived from the URI); under torch.distributed every rank
stages in a directory of its own below it, since no rank shares another's disk.
"""

from __future__ import annotations

import os
from pathlib import Path

from spotwise.checkpoint.remote import is_remote
from spotwise.errors import CheckpointError, ConfigError
from spotwise.notices.heartbeat import HEARTBEAT_KEY
from spotwise.runtime import dirlock, distributed
from spotwise.runtime.tiered import staging_dir
from spotwise.storage import object_store_schemes
from spotwise.telemetry.events import EVENTS_FILE

# what a run directory may hold; a directory holding only other things is not one
# (the controller's heartbeat may be there first: notices.heartbeat)
_OURS = (dirlock.LOCK_FILE, EVENTS_FILE, HEARTBEAT_KEY, "step-", ".tmp-step-", ".trash-step-")


def locate(
    run_dir: str | os.PathLike[str],
    local_dir: str | os.PathLike[str] | None,
    ranks: distributed.Ranks | None,
) -> tuple[Path, str | None]:
    """The checked local directory of ``run_dir`` (created when missing), and the object store's
    URI when ``run_dir`` names one."""
    remote = os.fspath(run_dir) if is_remote(run_dir) else None
    local: str | os.PathLike[str] = run_dir
    if remote is not None:
        local = staging_dir(remote, local_dir)
        if ranks is not None:
            local = Path(local) / f"rank-{ranks.rank:05d}"
    return _checked(local), remote


def _checked(run_dir: str | os.PathLike[str]) -> Path:
    text = os.fspath(run_dir)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        raise ConfigError(
            f"Run cannot use {scheme}:// run directories",
            hint="use a local path, file:///path or "
            + ", ".join(f"{s}bucket/prefix" for s in object_store_schemes()),
        )
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run directory {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create run directory {path}: {exc.strerror}",
            hint="choose a writable location for --run-dir",
        ) from exc
    entries = os.listdir(path)
    foreign = [e for e in entries if not e.startswith(_OURS)]
    if foreign and not any(e.startswith(_OURS) for e in entries):
        raise ConfigError(
            f"{path} is not a spotwise run directory: it holds other files "
            f"({', '.join(sorted(foreign)[:3])}{', ...' if len(foreign) > 3 else ''})",
            hint="use a new or empty directory for the run, e.g. runs/<name>",
        )
    return path


def lock(run_dir: Path, ranks: distributed.Ranks | None, *, owner: bool) -> int | None:
    """The run directory's lock, taken by the process that ``owner``\\ s it. Under
    torch.distributed with a shared directory only rank 0 holds it: it alone commits, prunes and
    cleans; the other ranks write only inside a temporary directory rank 0 created for the save
    at hand. Without a shared file system each rank locks its own. All ranks fail together when
    one is taken."""
    if ranks is None:
        return dirlock.acquire(run_dir)
    fd, error = None, None
    if owner:
        try:
            fd = dirlock.acquire(run_dir)
        except (CheckpointError, ConfigError) as exc:
            error = exc
    if not distributed.all_agree(ranks, error is None):
        if fd is not None:  # another rank's own directory was taken
            dirlock.release(fd)
        raise error or CheckpointError(
            "another rank could not lock its run directory",
            hint="another process (or another Run) is using it; see that rank's error",
        )
    return fd
