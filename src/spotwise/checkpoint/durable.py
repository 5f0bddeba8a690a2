"""Durable files: the one atomic write, fsync of files and directories, removal without
following links, and the errno map that tells a user what a failed write means.

A file replaced through :func:`write_atomic` is seen by a reader, or after a crash, as the old
content or the new, whole: the new bytes go to a hidden temporary in the same directory, are
fsynced, renamed over the target and the directory is fsynced. Every step is relative to a
descriptor of the directory (:mod:`spotwise.dirfd`, the lower layer that also serves the event
log), so a link planted in place of the target or its temporary is replaced, never followed.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import IO

from spotwise.dirfd import open_entry, opened_dir, remove_entry, remove_path

log = logging.getLogger(__name__)

ATOMIC_TMP_PREFIX = ".spotwise-tmp-"  # names of in-progress atomic writes; no reader lists them
IO_THREADS = 8  # checksums, chunk reads and fsyncs of one save or load (see io_pool)
_io: tuple[int, ThreadPoolExecutor] | None = None

Fill = Callable[[IO[bytes]], object]  # writes a file's new content into the open temporary


def io_pool() -> ThreadPoolExecutor:
    """The threads that checksum written batches, read a file's chunks and fsync a commit's
    files, started once per process (a pool started per file stalled the calling thread about
    5 ms, more under load, while its threads came up: several times per save or load). They
    are given only work that waits on nothing else, so concurrent users only queue. A forked
    child starts its own."""
    global _io
    if _io is None or _io[0] != os.getpid():
        _io = (os.getpid(), ThreadPoolExecutor(IO_THREADS, "spotwise-io"))
    return _io[1]


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, no wait


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux only; Python has no binding), or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Have the kernel start writing bytes ``offset``..``offset + length`` of ``fd`` to the
    disk now, without waiting for it. A checkpoint file's later fsync then finds most of it
    written while the rest was still being copied in, instead of the whole file dirty: the
    durable save of 2,000 tensors / 256 MiB went from 0.72-0.83x to 0.85-0.95x of 4 raw
    writers here (``bench_checkpoint.py``). Only a hint: where it is missing or refused
    (another OS, a pipe), nothing changes but the speed."""
    call = _sync_file_range()
    if call is not None:
        call(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def close_all(fds: list[int]) -> None:
    """Close every descriptor of ``fds`` (a failure is logged) and empty the list."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError as exc:
            log.warning("could not close a checkpoint file: %s", exc)
    fds.clear()


def write_atomic_at(parent: int, name: str, fill: Fill, *, mode: int = 0o644) -> None:
    """Replace entry ``name`` of directory ``parent`` (a descriptor) with what ``fill`` writes,
    durably and atomically (see the module's docstring). The temporary is removed on failure."""
    tmp = f"{ATOMIC_TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    try:
        fd = open_entry(parent, tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        with open(fd, "w+b") as out:  # readable too: a download checks what it wrote
            fill(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=parent)
        raise
    os.fsync(parent)


def write_atomic(path: str | os.PathLike[str], data: bytes | Fill, *, mode: int = 0o644) -> None:
    """Replace file ``path`` with ``data`` (or what a fill function writes into the open file),
    durably and atomically: a reader, or a crash, sees the old file or the new one, whole."""
    path = Path(path)
    fill: Fill = (lambda out: out.write(data)) if isinstance(data, bytes) else data
    with opened_dir(path.parent) as parent:
        write_atomic_at(parent, path.name, fill, mode=mode)


def disk_problem(exc: OSError) -> str | None:
    """What a failed write means for the user: ``"full"``, ``"too-large"`` (file-size limit),
    ``"read-only"``, or None for anything else. The one errno map of the project."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "full"
    if exc.errno == errno.EFBIG:
        return "too-large"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "read-only"
    return None


def remove_tree(path: Path) -> None:
    """Remove ``path`` without following links (:func:`~spotwise.dirfd.remove_path`):
    a link (or a stray file) is unlinked itself, a directory's contents are removed by
    descriptors. Failures are logged: a leftover costs disk space, not correctness."""
    try:
        remove_path(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


def remove_logged(parent: int, name: str, where: Path) -> None:
    try:
        remove_entry(parent, name)
    except OSError as exc:
        log.warning("could not remove %s: %s", where / name, exc)
