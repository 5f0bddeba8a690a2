"""Committing one checkpoint to a directory, reading one back, and removing them.

Writing: a checkpoint is built in a hidden sibling (``.tmp-step-...``): the tensors and state are
written, the manifest is written last, every file and the directory are fsynced, then the
directory is renamed into place (the commit) and the parent directory fsynced. A crash at any
instant therefore leaves either the complete new checkpoint or none of it, and never touches
older ones. Pulling a checkpoint from an object store ends in the same commit.

Reading: one reader (:func:`_inspect`) gives the one verdict that ``ckpt list``/``verify``,
loading, uploading and pulling all use, at three depths (sizes, checksums, full load). It never
follows a symbolic link (the step directory is opened with ``O_NOFOLLOW``, every file relative
to it with ``O_NOFOLLOW | O_NONBLOCK`` after an ``lstat``), accepts only regular files, so a FIFO
cannot hang it and a device cannot feed it, and parses everything within the limits of
:mod:`spotwise.runtime.format`.

Removing (retention, temporaries, the replaced copy of a step): nothing is ever followed out of
the run directory; a link is removed as a link, and the manifest goes first so a half-deleted
checkpoint is never mistaken for a valid one. Every removal and rename, and every open of a
checkpoint's directory, is relative to a descriptor of the directory holding the entry
(:mod:`spotwise.dirfd`).
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import stat
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import crc32c
import torch

from spotwise.dirfd import (
    NOFOLLOW,
    entry_mode,
    open_dir,
    open_subdir,
    opened_dir,
    remove_entry,
    remove_path,
    rename_entry,
)
from spotwise.errors import CorruptCheckpointError, SaveError
from spotwise.runtime.format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    STATE_FILE,
    FileEntry,
    Header,
    Manifest,
    TensorBlob,
    header_length,
    pack_tensors,
    parse_header,
    parse_manifest,
    parse_state,
    split_blob,
    step_dir_name,
    step_of_dir,
    tensor_file_name,
    tensor_views,
)
from spotwise.runtime.retention import RetentionPolicy, choose_deletions
from spotwise.runtime.state import RUN_KIND, check_run_state, decode

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = ".trash-step-"
_CHUNK = 64 << 20  # write and checksum granularity: large enough for full disk speed
_READ_CHUNK = 16 << 20  # read granularity: the last chunk's checksum is not overlapped
# Reads in flight per file: a virtual or NVMe disk reaches its speed only with several requests
# queued (one stream gets about half of it here; see the benchmark).
_STREAMS = 4
_IOV = 512  # pieces per writev (the limit is IOV_MAX, 1024 on Linux)
# A large state is written as up to _WRITERS tensor files of at least _PART_BYTES each, by as
# many threads: a disk reaches its speed only with several writes in flight (4 streams get
# about 1.5x one here; see the benchmark), and the buffered writes of one file serialize. A
# smaller state stays in one file: with 3 files of ~85 MiB, 256 MiB saved no faster here.
_WRITERS = 4
_PART_BYTES = 128 << 20
# Failpoint for crash tests: seconds to sleep after the tensor file is written and before the
# manifest, so that a test can SIGKILL the process while a save is half done.
_WRITE_DELAY_ENV = "SPOTWISE_TEST_WRITE_DELAY_S"
_NOFOLLOW = os.O_RDONLY | NOFOLLOW
_helpers: tuple[int, ThreadPoolExecutor] | None = None  # see _helper_pool


def _helper_pool() -> ThreadPoolExecutor:
    """The threads that checksum written batches, read a file's chunks and fsync a commit's
    files, started once per process (a pool started per file stalled the calling thread about
    5 ms, more under load, while its threads came up: several times per save or load). They
    are given only work that waits on nothing else, so concurrent users only queue. A forked
    child starts its own."""
    global _helpers
    if _helpers is None or _helpers[0] != os.getpid():
        _helpers = (os.getpid(), ThreadPoolExecutor(_WRITERS + _STREAMS, "spotwise-io"))
    return _helpers[1]


@dataclass
class CheckpointInfo:
    step: int
    path: Path
    wall_time: float | None = None
    size_bytes: int = 0
    valid: bool = False
    problem: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "path": str(self.path),
            "wall_time": self.wall_time,
            "size_bytes": self.size_bytes,
            "valid": self.valid,
            "problem": self.problem,
            "metrics": self.metrics,
        }


# --- durable-file primitives (also used by storage/local.py) -----------------------------------
def fsync_dir(path: Path) -> None:
    with opened_dir(path) as fd:
        os.fsync(fd)


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


def _save_error(exc: OSError, step: int, run_dir: Path) -> SaveError:
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


# --- writing -----------------------------------------------------------------------------------
def _batches(chunks: Sequence[memoryview | bytes]) -> Iterator[list[memoryview]]:
    """Group the chunks into runs of at most ``_CHUNK`` bytes and ``_IOV`` pieces (one writev
    each), splitting chunks larger than ``_CHUNK``."""
    batch: list[memoryview] = []
    size = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for start in range(0, len(view), _CHUNK):
            piece = view[start : start + _CHUNK]
            if batch and (size + len(piece) > _CHUNK or len(batch) >= _IOV):
                yield batch
                batch, size = [], 0
            batch.append(piece)
            size += len(piece)
    if batch:
        yield batch


def _crc_of(pieces: list[memoryview], crc: int) -> int:
    for piece in pieces:
        crc = crc32c.crc32c(piece, crc)
    return crc


def _writev_all(fd: int, pieces: list[memoryview]) -> None:
    written = os.writev(fd, pieces)
    if written == sum(len(p) for p in pieces):
        return
    for piece in pieces:  # a short write: finish piece by piece
        skip = min(written, len(piece))
        written -= skip
        rest = piece[skip:]
        while len(rest):
            rest = rest[os.write(fd, rest) :]


def _write_all(fd: int, chunks: Sequence[memoryview | bytes]) -> int:
    """Write every chunk and return the CRC32C of all bytes. The checksum of each batch runs on
    a helper thread (crc32c releases the GIL) while the batch is written, so it costs no time."""
    crc = 0
    pending: Future[int] | None = None
    try:
        for batch in _batches(chunks):
            if pending is not None:
                crc = pending.result()
            pending = _helper_pool().submit(_crc_of, batch, crc)
            _writev_all(fd, batch)
    finally:  # never leave a checksum running over buffers the caller may reuse
        if pending is not None:
            crc = pending.result()
    return crc


def _write_file(
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


def write_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    tensors: Mapping[str, torch.Tensor] | TensorBlob,
    state: Mapping[str, Any] | bytes = b"{}",
    *,
    metrics: Mapping[str, float] | None = None,
    wall_time: float | None = None,
    kind: str | None = None,
) -> CheckpointInfo:
    """Durably write and commit checkpoint ``step``; returns its info once it is visible.
    ``kind`` (``state.RUN_KIND`` from Run) has every reader check the state's structure.

    Raises SaveError (naming the cause: disk full, read-only...) with the temporary directory
    removed and every earlier checkpoint untouched.
    """
    run_dir = Path(run_dir)
    blob = tensors if isinstance(tensors, TensorBlob) else pack_tensors(tensors)
    state_bytes = state if isinstance(state, bytes) else json.dumps(state).encode()
    final = run_dir / step_dir_name(step)
    wall = time.time() if wall_time is None else wall_time
    opened: list[int] = []
    tmp: Path | None = None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = temporary_dir(run_dir, step)
        parts = split_blob(blob, max(1, min(_WRITERS, blob.layout.data_bytes // _PART_BYTES)))
        contents: dict[str, tuple[memoryview | bytes, ...]] = {
            tensor_file_name(i): (p.layout.header, *p.chunks) for i, p in enumerate(parts)
        }
        contents[STATE_FILE] = (state_bytes,)
        with ThreadPoolExecutor(max_workers=len(contents)) as pool:  # one writer per file
            writes = {
                n: pool.submit(_write_file, tmp / n, c, opened, sync=len(parts) > 1)
                for n, c in contents.items()
            }
        files: dict[str, dict[str, Any]] = {n: w.result() for n, w in writes.items()}
        for i, part in enumerate(parts):  # the record of each file's tensors
            files[tensor_file_name(i)]["header_crc32c"] = f"{crc32c.crc32c(part.layout.header):08x}"
        delay = float(os.environ.get(_WRITE_DELAY_ENV, "0") or 0)
        if delay > 0:
            time.sleep(delay)
        raw = manifest_bytes(step, wall, metrics, files, kind=kind)
        _write_file(tmp / MANIFEST, (raw,), opened)
        _publish(tmp, final, opened)
    except BaseException as exc:
        _close_all(opened)
        if tmp is not None:
            remove_tree(tmp)
        if isinstance(exc, OSError):
            raise _save_error(exc, step, run_dir) from exc
        raise
    total = sum(f["size"] for f in files.values()) + len(raw)
    return CheckpointInfo(step, final, wall, total, True, None, dict(metrics or {}))


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


# --- several writers, one commit (torch.distributed ranks) -------------------------------------
def write_durable(
    directory: Path, contents: Mapping[str, Sequence[memoryview | bytes]]
) -> dict[str, dict[str, Any]]:
    """Write new files into ``directory`` (a checkpoint being built, say), ``contents`` by name,
    and fsync them; returns their manifest entries. The fsyncs run together (the file system
    groups them into one journal commit instead of one per file, as in the commit). Each rank
    makes its own files durable before rank 0 lists them in the manifest."""
    opened: list[int] = []
    try:
        entries = {name: _write_file(directory / name, c, opened) for name, c in contents.items()}
        list(_helper_pool().map(os.fsync, opened))
        return entries
    finally:
        _close_all(opened)


def commit_files(
    tmp: Path,
    step: int,
    own: Mapping[str, Sequence[memoryview | bytes]],
    others: Mapping[str, Mapping[str, Any]],
    *,
    metrics: Mapping[str, float] | None = None,
) -> CheckpointInfo:
    """Rank 0's half of a distributed commit: write its ``own`` files into ``tmp``, then the
    manifest listing them and the ``others`` (files every other rank already wrote and fsynced
    there, with their sizes and CRCs), and publish ``tmp`` as step ``step`` by the same fsync
    and rename as :func:`write_checkpoint`. A file missing from ``others`` is missing from the
    manifest, and a manifest naming a file that is not there is refused by the reader, so a
    checkpoint lacking any rank's file never loads. Raises SaveError with ``tmp`` removed."""
    final = tmp.parent / step_dir_name(step)
    wall = time.time()
    opened: list[int] = []
    try:
        files = {name: _write_file(tmp / name, chunks, opened) for name, chunks in own.items()}
        files.update({name: dict(entry) for name, entry in others.items()})
        raw = manifest_bytes(step, wall, metrics, files)
        _write_file(tmp / MANIFEST, (raw,), opened)
        _publish(tmp, final, opened)
    except BaseException as exc:
        _close_all(opened)
        remove_tree(tmp)
        if isinstance(exc, OSError):
            raise _save_error(exc, step, tmp.parent) from exc
        raise
    total = sum(f["size"] for f in files.values()) + len(raw)
    return CheckpointInfo(step, final, wall, total, True, None, dict(metrics or {}))


def read_member(path: Path, name: str, entry: FileEntry) -> torch.Tensor:
    """The bytes of file ``name`` of checkpoint directory ``path`` (read without following
    links), checked against its manifest ``entry``: what one rank reads of a checkpoint other
    ranks wrote. Raises CorruptCheckpointError."""
    dir_fd = _open_dir(path)
    try:
        fd, size = _open_member(dir_fd, name, path)
        try:
            if size != entry.size:
                raise CorruptCheckpointError(
                    f"{path / name} has {size} bytes, the manifest says {entry.size} (truncated?)"
                )
            return _read_whole(fd, size, entry, path / name)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def commit_staged(tmp: Path, final: Path) -> None:
    """Commit a directory whose files were placed by someone else (a download): fsync each file
    and the directory, rename into place, fsync the parent."""
    opened: list[int] = []
    try:
        with opened_dir(tmp, follow=False) as staged:
            for name in os.listdir(staged):
                opened.append(os.open(name, _NOFOLLOW, dir_fd=staged))
        _publish(tmp, final, opened)
    finally:
        _close_all(opened)


def _publish(tmp: Path, final: Path, opened: list[int]) -> None:
    # The rename is the commit, so the files and their directory may be fsynced concurrently
    # (the file system groups them into one journal commit instead of one per file), as long as
    # all of them are durable before the directory becomes visible.
    # Every step is relative to the run directory's descriptor: a link planted in place of
    # ``final`` is renamed and removed as the link, never followed.
    with opened_dir(tmp.parent) as parent:
        opened.append(open_subdir(parent, tmp.name))
        list(_helper_pool().map(os.fsync, opened))
        _close_all(opened)
        if entry_mode(parent, final.name) is not None:
            if verify_checkpoint(final).valid:  # a valid one holds the same step's state: keep it
                _remove_logged(parent, tmp.name, tmp.parent)
                return
            trash = f"{TRASH_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
            rename_entry(parent, final.name, trash)
            rename_entry(parent, tmp.name, final.name)
            _remove_logged(parent, trash, final.parent)
        else:
            rename_entry(parent, tmp.name, final.name)
        os.fsync(parent)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError as exc:
            log.warning("could not close a checkpoint file: %s", exc)
    fds.clear()


# --- the one reader ----------------------------------------------------------------------------
class Depth(IntEnum):
    """How far :func:`_inspect` reads. Every depth runs every check of the ones below it."""

    SIZES = 0  # manifest, file types and sizes, safetensors header: what listing needs
    CHECKSUMS = 1  # + the CRC32C of every byte, streamed in bounded memory (upload, download)
    LOAD = 2  # + the tensors viewed out of the file and the state decoded (verify, load)


@dataclass
class LoadedCheckpoint:
    info: CheckpointInfo
    tensors: dict[str, torch.Tensor]  # views into one buffer holding the whole file
    state: Any  # the parsed state.json, as written
    doc: Any  # the state with its tensor references resolved (``state.decode``)
    manifest: Manifest
    manifest_raw: bytes = b""
    # further members read whole and checked, by name (what a ``share`` named; see load_checkpoint)
    members: dict[str, torch.Tensor] = field(default_factory=dict)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link (checkpoints are never read through links)"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _lstat_mode(path: str | Path, shown: Path, dir_fd: int | None = None) -> int:
    """The type and mode of ``path`` itself (a link is not followed)."""
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{shown} is missing") from exc
    except OSError as exc:
        raise CorruptCheckpointError(f"cannot read {shown}: {exc.strerror}") from exc


def _open_dir(path: Path) -> int:
    """The checkpoint directory ``path``, opened relative to its parent without following a
    link in its place."""
    try:
        parent = open_dir(path.parent)
    except OSError as exc:
        raise CorruptCheckpointError(f"cannot open {path.parent}: {exc.strerror}") from exc
    try:
        mode = _lstat_mode(path.name, path, parent)
        if not stat.S_ISDIR(mode):
            raise CorruptCheckpointError(f"{path} is {_kind(mode)}, not a checkpoint directory")
        try:
            return open_subdir(parent, path.name)
        except OSError as exc:  # replaced by a link between the lstat and the open
            raise CorruptCheckpointError(f"cannot open {path}: {exc.strerror}") from exc
    finally:
        os.close(parent)


def _open_member(dir_fd: int, name: str, where: Path) -> tuple[int, int]:
    """A read descriptor and size of regular file ``name`` inside the directory ``dir_fd``."""
    mode = _lstat_mode(name, where / name, dir_fd)
    if not stat.S_ISREG(mode):
        raise CorruptCheckpointError(f"{where / name} is {_kind(mode)}, not a regular file")
    try:
        fd = os.open(name, _NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise CorruptCheckpointError(f"cannot open {where / name}: {exc.strerror}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # swapped between the lstat and the open
        os.close(fd)
        raise CorruptCheckpointError(f"{where / name} is {_kind(st.st_mode)}, not a regular file")
    return fd, st.st_size


def _pread_exact(fd: int, size: int, offset: int, file: Path) -> bytes:
    data = os.pread(fd, size, offset)
    while len(data) < size:
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            raise CorruptCheckpointError(f"{file} ended early while reading (truncated)")
        data += more
    return data


def _readinto_all(fd: int, view: memoryview, file: Path, offset: int = 0) -> None:
    while len(view):
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise CorruptCheckpointError(f"{file} ended early while reading (truncated)")
        view, offset = view[n:], offset + n


def _read_with_crc(fd: int, view: memoryview, file: Path) -> int:
    """Fill ``view`` from ``fd`` with up to ``_STREAMS`` reads in flight, checksumming each
    chunk in order on this thread as soon as it has arrived."""
    if len(view) <= _READ_CHUNK:
        _readinto_all(fd, view, file)
        return crc32c.crc32c(view)
    starts = range(0, len(view), _READ_CHUNK)
    crc = 0
    pool, queued = _helper_pool(), iter(starts)
    pending: deque[Future[None]] = deque()

    def read_next() -> None:
        start = next(queued, None)
        if start is not None:
            chunk = view[start : start + _READ_CHUNK]
            pending.append(pool.submit(_readinto_all, fd, chunk, file, start))

    for _ in range(_STREAMS):
        read_next()
    try:
        for start in starts:
            pending.popleft().result()
            read_next()
            crc = crc32c.crc32c(view[start : start + _READ_CHUNK], crc)
    finally:  # a failed read: the others must not go on filling the buffer (or use the fd)
        for done in pending:
            done.cancel()
        wait(pending)
    return crc


def _stream_crc(fd: int, size: int, file: Path) -> int:
    """The CRC32C of the first ``size`` bytes of ``fd``, read through one bounded buffer."""
    buf = memoryview(bytearray(min(size, _READ_CHUNK)))
    crc, offset = 0, 0
    while offset < size:
        piece = buf[: min(size - offset, len(buf))]
        _readinto_all(fd, piece, file, offset)
        crc = crc32c.crc32c(piece, crc)
        offset += len(piece)
    return crc


def _check_crc(crc: int, entry: FileEntry, file: Path) -> None:
    if f"{crc:08x}" != entry.crc32c:
        raise CorruptCheckpointError(
            f"{file} fails its CRC32C check (got {crc:08x}, manifest {entry.crc32c}): "
            "the bytes on disk changed after the save"
        )


def _tensor_header(fd: int, size: int, entry: FileEntry, file: Path) -> Header:
    """The parsed header of a tensor file, checked against the manifest's record of it."""
    first8 = _pread_exact(fd, min(size, 8), 0, file)
    length = header_length(first8, size, str(file))
    raw = _pread_exact(fd, length, 8, file)
    header = Header(length, raw, parse_header(raw, size - 8 - length, str(file)))
    if entry.header_crc32c is not None:
        crc = crc32c.crc32c(raw, crc32c.crc32c(first8))
        if f"{crc:08x}" != entry.header_crc32c:
            raise CorruptCheckpointError(
                f"{file}: its tensors (names, dtypes, shapes or byte ranges) differ from the "
                "manifest's record of them"
            )
    return header


def fresh_buffer(size: int, *, zeroed: bool = False) -> torch.Tensor:
    """An uninitialized (or ``zeroed``) uint8 tensor of ``size`` bytes to read a file or a
    state into. A large one is an anonymous mapping (zero-filled by the kernel) advised to use
    transparent huge pages: first-touch page faults, one per 4 KiB page otherwise, cost as much
    as the disk read itself on a virtual machine (256 MiB faulted in at about 1.3 GB/s here),
    and one fault per 2 MiB page makes them negligible. The tensor keeps the mapping alive; it
    is unmapped when the last view of it goes."""
    if size < _READ_CHUNK or not hasattr(mmap, "MADV_HUGEPAGE"):
        return (torch.zeros if zeroed else torch.empty)(size, dtype=torch.uint8)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(region, dtype=torch.uint8)


def _read_whole(fd: int, size: int, entry: FileEntry, file: Path) -> torch.Tensor:
    """The whole file in one buffer, its CRC32C checked. A size no machine could hold (a sparse
    file, say) is refused before anything is allocated."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if size > memory:
        raise CorruptCheckpointError(
            f"{file} is {size} bytes, more than this machine's {memory} bytes of memory"
        )
    try:
        buf = fresh_buffer(size)
    except (RuntimeError, OSError) as exc:  # the allocator's or mmap's "not enough memory"
        raise CorruptCheckpointError(f"cannot allocate {size} bytes to read {file}") from exc
    view = memoryview(buf.numpy()).cast("B") if size else memoryview(b"")  # type: ignore[arg-type,unused-ignore]
    _check_crc(_read_with_crc(fd, view, file), entry, file)
    return buf


@dataclass
class _Read:
    manifest: Manifest
    manifest_raw: bytes
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    state: Any = None
    doc: Any = None
    members: dict[str, torch.Tensor] = field(default_factory=dict)


Share = Callable[[Manifest], Collection[str]]  # the further members one reader checks


def _inspect(path: Path, step: int | None, depth: Depth, share: Share | None = None) -> _Read:
    """The one verdict: raises CorruptCheckpointError naming the first problem found.

    ``step`` is the step the directory must hold; None takes it from the directory's name (a
    staging directory of a download passes it explicitly). ``share`` (at ``Depth.LOAD``)
    narrows the byte checks of the members beyond the tensors and state to those it names,
    which are read whole and kept; the others get the checks of listing only."""
    if step is None:
        step = step_of_dir(path.name)
        if step is None:
            raise CorruptCheckpointError(f"{path} is not named step-NNNNNNNN")
    dir_fd = _open_dir(path)
    opened: dict[str, tuple[int, int]] = {}
    try:
        try:
            fd, size = _open_member(dir_fd, MANIFEST, path)
        except CorruptCheckpointError as exc:
            if entry_mode(dir_fd, MANIFEST) is not None:
                raise
            raise CorruptCheckpointError(
                f"{path} has no {MANIFEST}: the save never committed",
                hint="it is ignored for loading; 'spotwise ckpt list' shows the valid ones",
            ) from exc
        opened[MANIFEST] = (fd, size)
        if size > MAX_MANIFEST_BYTES:
            raise CorruptCheckpointError(f"{path / MANIFEST} is {size} bytes, over the limit")
        raw = _pread_exact(fd, size, 0, path / MANIFEST)
        manifest = parse_manifest(raw, str(path / MANIFEST))
        if manifest.step != step:
            raise CorruptCheckpointError(
                f"{path} holds step {manifest.step} but is named for step {step}"
            )
        for name, entry in manifest.files.items():  # every type and size before any big read
            opened[name] = _open_member(dir_fd, name, path)
            if opened[name][1] != entry.size:
                raise CorruptCheckpointError(
                    f"{path / name} has {opened[name][1]} bytes, the manifest says "
                    f"{entry.size} (truncated?)"
                )
        # the headers next, from their few bytes: a bad one is refused before any big read
        headers = {
            name: _tensor_header(*opened[name], manifest.files[name], path / name)
            for name in manifest.tensor_files
        }
        read = _Read(manifest, raw)
        mine = None if share is None or depth != Depth.LOAD else frozenset(share(manifest))
        for name, entry in manifest.files.items():
            fd, size = opened[name]
            file = path / name
            if depth == Depth.LOAD and (name in headers or name == STATE_FILE):
                buf = _read_whole(fd, size, entry, file)
                if name == STATE_FILE:
                    read.state = parse_state(buf.numpy().tobytes(), str(file))
                    continue
                part = tensor_views(buf, headers[name], str(file))
                twice = next((t for t in part if t in read.tensors), None)
                if twice is not None:
                    raise CorruptCheckpointError(f"{path}: tensor {twice!r} is in two files")
                read.tensors.update(part)
            elif mine is not None:
                if name in mine:
                    read.members[name] = _read_whole(fd, size, entry, file)
            elif depth >= Depth.CHECKSUMS:
                _check_crc(_stream_crc(fd, size, file), entry, file)
        if depth == Depth.LOAD:
            read.doc = _decoded(read.state, read.tensors, path / STATE_FILE)
            if manifest.kind == RUN_KIND:
                try:
                    check_run_state(read.doc, manifest.step)
                except CorruptCheckpointError as exc:
                    raise CorruptCheckpointError(
                        f"{path / STATE_FILE}: {exc.message}", hint=exc.hint
                    ) from exc
        return read
    finally:
        for fd, _ in opened.values():
            os.close(fd)
        os.close(dir_fd)


def _decoded(state: Any, tensors: Mapping[str, torch.Tensor], file: Path) -> Any:
    try:
        return decode(state, tensors)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{file}: {exc.message}") from exc
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise CorruptCheckpointError(f"{file} does not decode ({type(exc).__name__})") from exc


def _info(path: Path, read: _Read) -> CheckpointInfo:
    m = read.manifest
    total = m.data_bytes + len(read.manifest_raw)
    return CheckpointInfo(m.step, path, m.wall_time, total, True, None, dict(m.metrics))


def load_checkpoint(
    path: str | os.PathLike[str], *, step: int | None = None, share: Share | None = None
) -> LoadedCheckpoint:
    """Read and verify one checkpoint; CorruptCheckpointError names what is wrong.

    With ``share``, the bytes of the members beyond the tensors and state are checked only for
    the names ``share(manifest)`` returns, and those are kept read in ``members``: one rank of a
    distributed job checks its share of the files, which it is about to read anyway, and the
    ranks agree on the verdict (:func:`spotwise.runtime.sharded.agreed_checkpoints`)."""
    path = Path(path)
    read = _inspect(path, step, Depth.LOAD, share)
    info = _info(path, read)
    return LoadedCheckpoint(
        info, read.tensors, read.state, read.doc, read.manifest, read.manifest_raw, read.members
    )


def check_bytes(path: Path, *, step: int | None = None) -> tuple[Manifest, bytes]:
    """Check every byte of a checkpoint against its manifest in bounded memory (before an upload,
    after a download); returns the manifest and its raw bytes. Raises CorruptCheckpointError."""
    read = _inspect(path, step, Depth.CHECKSUMS)
    return read.manifest, read.manifest_raw


def verify_checkpoint(
    path: str | os.PathLike[str], *, deep: bool = True, step: int | None = None
) -> CheckpointInfo:
    """The verdict on one checkpoint directory. ``deep`` is exactly what loading checks
    (checksums, tensors, state); without it, everything but the bytes' content (manifest, file
    types and sizes, the tensor header). Never raises for a bad checkpoint; the problem is in
    the returned info."""
    path = Path(path)
    try:
        return _info(path, _inspect(path, step, Depth.LOAD if deep else Depth.SIZES))
    except CorruptCheckpointError as exc:
        named = step_of_dir(path.name)
        return CheckpointInfo(named if named is not None else -1, path, problem=exc.message)


def _step_dirs(run_dir: Path) -> list[tuple[int, str]]:
    """``(step, name)`` of every ``step-*`` entry of ``run_dir``, oldest first."""
    try:
        names = os.listdir(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((s, n) for n in names if (s := step_of_dir(n)) is not None)


def list_checkpoints(
    run_dir: str | os.PathLike[str], *, deep: bool = False
) -> list[CheckpointInfo]:
    """Every ``step-*`` entry of ``run_dir``, oldest first, each verified (see
    :func:`verify_checkpoint`). Temporary directories of unfinished saves are not listed."""
    run_dir = Path(run_dir)
    return [verify_checkpoint(run_dir / name, deep=deep) for _, name in _step_dirs(run_dir)]


def _skip_warning(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def loadable_checkpoints(run_dir: str | os.PathLike[str]) -> Iterator[LoadedCheckpoint]:
    """The checkpoints of ``run_dir`` that load, newest first, each read only when the caller
    asks for the next one; each that does not load is skipped with a warning."""
    run_dir = Path(run_dir)
    found = _step_dirs(run_dir)
    yielded = False
    for _, name in reversed(found):
        try:
            loaded = load_checkpoint(run_dir / name)
        except CorruptCheckpointError as exc:
            _skip_warning(
                f"skipping checkpoint {name}: {exc.message}; falling back to an older one"
            )
            continue
        yielded = True
        yield loaded
    if found and not yielded:
        _skip_warning(
            f"no valid checkpoint in {run_dir} ({len(found)} invalid); starting from scratch"
        )


def load_newest_valid(run_dir: str | os.PathLike[str]) -> LoadedCheckpoint | None:
    """The newest checkpoint that loads, warning about each newer one that does not."""
    return next(iter(loadable_checkpoints(run_dir)), None)


# --- removing ----------------------------------------------------------------------------------
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
            _remove_logged(parent, name, run_dir)
    finally:
        os.close(parent)
    return [run_dir / n for n in names]


def _remove_logged(parent: int, name: str, where: Path) -> None:
    try:
        remove_entry(parent, name)
    except OSError as exc:
        log.warning("could not remove %s: %s", where / name, exc)


def delete_checkpoint(path: Path) -> None:
    """Remove the manifest first, so a half-deleted directory is never mistaken for valid. The
    directory is opened relative to the run directory without following links, so a link in
    its place is removed itself and nothing it points to is touched."""
    try:
        parent = open_dir(path.parent)
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
        return
    try:
        try:
            dir_fd = open_subdir(parent, path.name)
        except OSError:  # gone, or not a real directory: just the entry goes
            _remove_logged(parent, path.name, path.parent)
            return
        try:
            os.unlink(MANIFEST, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove %s: %s", path / MANIFEST, exc)
        finally:
            os.close(dir_fd)
        _remove_logged(parent, path.name, path.parent)
    finally:
        os.close(parent)


def retain(run_dir: str | os.PathLike[str], policy: RetentionPolicy) -> list[CheckpointInfo]:
    """Apply ``policy`` to ``run_dir`` and return what was deleted. Call it after a commit."""
    doomed = choose_deletions(list_checkpoints(run_dir), policy)
    for info in doomed:
        delete_checkpoint(info.path)
    return doomed
