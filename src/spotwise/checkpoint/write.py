"""Writing a checkpoint's files durably, its manifest, and the publish step (the commit).

A checkpoint is built in a hidden sibling (``.tmp-step-...``): the files are written, the
manifest last, every file and the directory are fsynced, then the directory is renamed into
place (the commit) and the parent directory fsynced. A crash at any instant therefore leaves
either the complete new checkpoint or none of it, and never touches older ones. Pulling a
checkpoint from an object store ends in the same commit. Torch-free: the runtime packs tensors
into byte chunks (``spotwise.runtime.format``) and hands them to :func:`write_file`.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import crc32c

from spotwise.checkpoint.durable import (
    close_all,
    disk_problem,
    io_pool,
    remove_logged,
    start_writeback,
)
from spotwise.checkpoint.format import FORMAT, FORMAT_VERSION
from spotwise.dirfd import entry_mode, open_dir, open_subdir, opened_dir, rename_entry
from spotwise.errors import SaveError

TMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = ".trash-step-"
_CHUNK = 64 << 20  # write and checksum granularity: large enough for full disk speed
_IOV = 512  # pieces per writev (the limit is IOV_MAX, 1024 on Linux)


def save_error(exc: OSError, step: int, run_dir: Path) -> SaveError:
    what = f"could not write checkpoint step {step} in {run_dir}"
    problem = disk_problem(exc)
    if problem == "full":
        return SaveError(
            f"{what}: no space left on the device ({exc.strerror})",
            hint="free disk space or use a --run-dir on a larger disk; earlier checkpoints are "
            "intact",
        )
    if problem == "too-large":
        return SaveError(
            f"{what}: file too large for this file system or the process's file-size limit "
            f"(ulimit -f) ({exc.strerror})",
            hint="raise the limit or use a different file system; earlier checkpoints are intact",
        )
    if problem == "read-only":
        return SaveError(
            f"{what}: the location is read-only or not writable ({exc.strerror})",
            hint="point the run directory at a writable location; earlier checkpoints are intact",
        )
    return SaveError(f"{what}: {exc}", hint="earlier checkpoints are intact")


def _batches(chunks: Sequence[memoryview | bytes]) -> Iterator[tuple[list[memoryview], int]]:
    """Group the chunks into runs of at most ``_CHUNK`` bytes and ``_IOV`` pieces (one writev
    each), splitting chunks larger than ``_CHUNK``; each run with its size in bytes."""
    batch: list[memoryview] = []
    size = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for start in range(0, len(view), _CHUNK):
            piece = view[start : start + _CHUNK]
            if batch and (size + len(piece) > _CHUNK or len(batch) >= _IOV):
                yield batch, size
                batch, size = [], 0
            batch.append(piece)
            size += len(piece)
    if batch:
        yield batch, size


def _crc_of(pieces: list[memoryview], crc: int) -> int:
    for piece in pieces:
        crc = crc32c.crc32c(piece, crc)
    return crc


def _writev_all(fd: int, pieces: list[memoryview], size: int) -> None:
    written = os.writev(fd, pieces)
    if written == size:
        return
    for piece in pieces:  # a short write: finish piece by piece
        skip = min(written, len(piece))
        written -= skip
        rest = piece[skip:]
        while len(rest):
            rest = rest[os.write(fd, rest) :]


def _write_all(fd: int, chunks: Sequence[memoryview | bytes]) -> int:
    """Write every chunk and return the CRC32C of all bytes. The checksum of each batch runs on
    a helper thread (crc32c releases the GIL) while the batch is written, so it costs no time,
    and the disk is asked to start on each batch once it is in the page cache."""
    crc, offset = 0, 0
    pending: Future[int] | None = None
    try:
        for batch, size in _batches(chunks):
            if pending is not None:
                crc = pending.result()
            pending = io_pool().submit(_crc_of, batch, crc)
            _writev_all(fd, batch, size)
            start_writeback(fd, offset, size)  # the disk starts on it while the next is copied
            offset += size
    finally:  # never leave a checksum running over buffers the caller may reuse
        if pending is not None:
            crc = pending.result()
    return crc


def write_file(
    path: Path, chunks: Sequence[memoryview | bytes], opened: list[int], *, sync: bool = False
) -> dict[str, Any]:
    """Write one file and return its manifest entry. Its descriptor goes to ``opened`` (for the
    commit's fsync); ``sync`` fsyncs it at once too, so that a writer among several gets its
    file's flush going while the others still write (the commit's fsync then finds it clean)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    opened.append(fd)
    crc = _write_all(fd, chunks)
    if sync:
        os.fsync(fd)
    return {"size": os.fstat(fd).st_size, "crc32c": f"{crc:08x}"}


def temporary_dir(run_dir: Path, step: int) -> Path:
    """A new hidden directory next to the checkpoints, to build step ``step`` in."""
    tmp = run_dir / f"{TMP_PREFIX}{step:08d}-{uuid.uuid4().hex[:8]}"
    with opened_dir(run_dir) as parent:
        os.mkdir(tmp.name, dir_fd=parent)
    return tmp


def manifest_bytes(
    step: int,
    wall: float,
    metrics: Mapping[str, float] | None,
    files: Mapping[str, Any],
    *,
    kind: str | None = None,
) -> bytes:
    """The manifest of step ``step`` listing ``files`` (name -> size and CRC32C): the one
    writer of manifests, local or remote."""
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "step": step,
        "wall_time": wall,
        "metrics": dict(metrics or {}),
        "files": dict(files),
    }
    if kind is not None:
        manifest["kind"] = kind
    return json.dumps(manifest, indent=1).encode()


def write_durable(
    directory: Path, contents: Mapping[str, Sequence[memoryview | bytes]]
) -> dict[str, dict[str, Any]]:
    """Write new files into ``directory`` (a checkpoint being built, say), ``contents`` by name,
    and fsync them; returns their manifest entries. The fsyncs run together (the file system
    groups them into one journal commit instead of one per file, as in the commit). Each rank
    makes its own files durable before rank 0 lists them in the manifest."""
    opened: list[int] = []
    try:
        entries = {name: write_file(directory / name, c, opened) for name, c in contents.items()}
        list(io_pool().map(os.fsync, opened))
        return entries
    finally:
        close_all(opened)


def publish(tmp: Path, final: Path, opened: list[int], valid: Callable[[Path], bool]) -> None:
    """The commit: fsync ``opened`` (the files written into ``tmp``, closed here) and ``tmp``,
    rename ``tmp`` to ``final`` and fsync the parent. A step already standing at ``final`` is
    kept if ``valid`` says so (it holds the same step's state), else replaced."""
    # The rename is the commit, so the files and their directory may be fsynced concurrently
    # (the file system groups them into one journal commit instead of one per file), as long as
    # all of them are durable before the directory becomes visible.
    # Every step is relative to the run directory's descriptor: a link planted in place of
    # ``final`` is renamed and removed as the link, never followed.
    with opened_dir(tmp.parent) as parent:
        opened.append(open_subdir(parent, tmp.name))
        list(io_pool().map(os.fsync, opened))
        close_all(opened)
        if entry_mode(parent, final.name) is not None:
            if valid(final):  # a valid one holds the same step's state: keep it
                remove_logged(parent, tmp.name, tmp.parent)
                return
            trash = f"{TRASH_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
            rename_entry(parent, final.name, trash)
            rename_entry(parent, tmp.name, final.name)
            remove_logged(parent, trash, final.parent)
        else:
            rename_entry(parent, tmp.name, final.name)
        os.fsync(parent)


def clean_temporaries(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove the leftovers of saves that a crash interrupted (call only while no save runs)."""
    run_dir = Path(run_dir)
    try:
        parent = open_dir(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        names = [n for n in os.listdir(parent) if n.startswith((TMP_PREFIX, TRASH_PREFIX))]
        for name in names:
            remove_logged(parent, name, run_dir)
    finally:
        os.close(parent)
    return [run_dir / n for n in names]
