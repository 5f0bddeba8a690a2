"""Reading a checkpoint directory without torch: the checks of listing and of the bytes.

One opening (:func:`opened_checkpoint`) is the start of every verdict, here and in the runtime's
loading: the step directory is opened relative to its parent with ``O_NOFOLLOW``, every file
relative to it with ``O_NOFOLLOW | O_NONBLOCK`` after an ``lstat``, only regular files are
accepted (a FIFO cannot hang a reader, a device cannot feed it), the manifest is parsed within
the limits of :mod:`spotwise.checkpoint.format`, every listed file's type and size is checked
and every tensor file's header parsed before any large read. Beyond that, :func:`check_bytes`
checks every byte's CRC32C in bounded memory (before an upload, after a download), and the
runtime's loader (``spotwise.runtime.commit``) reads the tensors and decodes the state. So
``ckpt list``, the controller's progress and retention read manifests without importing torch.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from spotwise.checkpoint.crcjoin import join
from spotwise.checkpoint.durable import io_pool
from spotwise.checkpoint.format import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Header,
    Manifest,
    header_length,
    parse_header,
    parse_manifest,
    step_of_dir,
)
from spotwise.dirfd import NOFOLLOW, entry_mode, open_dir, open_subdir
from spotwise.errors import CorruptCheckpointError

READ_CHUNK = 16 << 20  # what one reader fills at a time
_PIECE = 256 << 10  # what a reader reads, then checksums, at a time: it stays in the CPU's cache
# Reads in flight per file: a virtual or NVMe disk reaches its speed only with several requests
# queued (one stream gets about half of it here; see the benchmark).
_STREAMS = 4
_NOFOLLOW = os.O_RDONLY | NOFOLLOW


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


def open_checkpoint_dir(path: Path) -> int:
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


def open_member(dir_fd: int, name: str, where: Path) -> tuple[int, int]:
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


def pread_exact(fd: int, size: int, offset: int, file: Path) -> bytes:
    data = os.pread(fd, size, offset)
    while len(data) < size:
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            raise CorruptCheckpointError(f"{file} ended early while reading (truncated)")
        data += more
    return data


def readinto_all(fd: int, view: memoryview, file: Path, offset: int = 0) -> None:
    while len(view):
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise CorruptCheckpointError(f"{file} ended early while reading (truncated)")
        view, offset = view[n:], offset + n


def _read_chunk(fd: int, chunk: memoryview, file: Path, offset: int, checksum: bool) -> int:
    """Fill ``chunk`` from ``fd`` at ``offset`` piece by piece, each piece checksummed as soon
    as it has arrived (while it is in the CPU's cache); its CRC32C, or 0 without ``checksum``."""
    crc = 0
    for start in range(0, len(chunk), _PIECE):
        piece = chunk[start : start + _PIECE]
        readinto_all(fd, piece, file, offset + start)
        if checksum:
            crc = crc32c.crc32c(piece, crc)
    return crc


def read_with_crc(fd: int, view: memoryview, file: Path) -> int:
    """Fill ``view`` from ``fd`` with up to ``_STREAMS`` chunks read at once, each checksummed
    by its reader as it arrives; the chunks' CRCs are joined here in order. (A second pass over
    the buffer took about a tenth of a distributed load from the page cache, two ranks on two
    cores.) A last, shorter chunk is checksummed here, after the others: joining needs a map
    per length, and that would cost more than the pass."""
    if len(view) <= READ_CHUNK:
        return _read_chunk(fd, view, file, 0, True)
    starts = range(0, len(view), READ_CHUNK)
    crc = 0
    pool, queued = io_pool(), iter(starts)
    pending: deque[Future[int]] = deque()

    def read_next() -> None:
        start = next(queued, None)
        if start is not None:
            chunk = view[start : start + READ_CHUNK]
            whole = len(chunk) == READ_CHUNK
            pending.append(pool.submit(_read_chunk, fd, chunk, file, start, whole))

    for _ in range(_STREAMS):
        read_next()
    try:
        for start in starts:
            chunk_crc = pending.popleft().result()
            read_next()
            chunk = view[start : start + READ_CHUNK]
            if len(chunk) == READ_CHUNK:
                crc = join(crc, chunk_crc, READ_CHUNK)
            else:
                crc = crc32c.crc32c(chunk, crc)
    finally:  # a failed read: the others must not go on filling the buffer (or use the fd)
        for done in pending:
            done.cancel()
        wait(pending)
    return crc


def stream_crc(fd: int, size: int, file: Path) -> int:
    """The CRC32C of the first ``size`` bytes of ``fd``, read through one bounded buffer."""
    buf = memoryview(bytearray(min(size, READ_CHUNK)))
    crc, offset = 0, 0
    while offset < size:
        piece = buf[: min(size - offset, len(buf))]
        readinto_all(fd, piece, file, offset)
        crc = crc32c.crc32c(piece, crc)
        offset += len(piece)
    return crc


def check_crc(crc: int, entry: FileEntry, file: Path) -> None:
    if f"{crc:08x}" != entry.crc32c:
        raise CorruptCheckpointError(
            f"{file} fails its CRC32C check (got {crc:08x}, manifest {entry.crc32c}): "
            "the bytes on disk changed after the save"
        )


def tensor_header(fd: int, size: int, entry: FileEntry, file: Path) -> Header:
    """The parsed header of a tensor file, checked against the manifest's record of it."""
    first8 = pread_exact(fd, min(size, 8), 0, file)
    length = header_length(first8, size, str(file))
    raw = pread_exact(fd, length, 8, file)
    header = Header(length, raw, parse_header(raw, size - 8 - length, str(file)))
    if entry.header_crc32c is not None:
        crc = crc32c.crc32c(raw, crc32c.crc32c(first8))
        if f"{crc:08x}" != entry.header_crc32c:
            raise CorruptCheckpointError(
                f"{file}: its tensors (names, dtypes, shapes or byte ranges) differ from the "
                "manifest's record of them"
            )
    return header


@dataclass
class Opened:
    """A checkpoint directory opened and checked as deep as listing goes: its manifest, a read
    descriptor and the size of every file it lists, and each tensor file's parsed header."""

    path: Path
    manifest: Manifest
    manifest_raw: bytes
    files: dict[str, tuple[int, int]]  # name -> (descriptor, size), closed on leaving
    headers: dict[str, Header]


@contextmanager
def opened_checkpoint(path: Path, step: int | None) -> Iterator[Opened]:
    """The start of every verdict: raises CorruptCheckpointError naming the first problem.

    ``step`` is the step the directory must hold; None takes it from the directory's name (a
    staging directory of a download passes it explicitly)."""
    if step is None:
        step = step_of_dir(path.name)
        if step is None:
            raise CorruptCheckpointError(f"{path} is not named step-NNNNNNNN")
    dir_fd = open_checkpoint_dir(path)
    opened: dict[str, tuple[int, int]] = {}
    try:
        try:
            fd, size = open_member(dir_fd, MANIFEST, path)
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
        raw = pread_exact(fd, size, 0, path / MANIFEST)
        manifest = parse_manifest(raw, str(path / MANIFEST))
        if manifest.step != step:
            raise CorruptCheckpointError(
                f"{path} holds step {manifest.step} but is named for step {step}"
            )
        for name, entry in manifest.files.items():  # every type and size before any big read
            opened[name] = open_member(dir_fd, name, path)
            if opened[name][1] != entry.size:
                raise CorruptCheckpointError(
                    f"{path / name} has {opened[name][1]} bytes, the manifest says "
                    f"{entry.size} (truncated?)"
                )
        # the headers next, from their few bytes: a bad one is refused before any big read
        headers = {
            name: tensor_header(*opened[name], manifest.files[name], path / name)
            for name in manifest.tensor_files
        }
        yield Opened(path, manifest, raw, opened, headers)
    finally:
        for fd, _ in opened.values():
            os.close(fd)
        os.close(dir_fd)


def info_of(path: Path, manifest: Manifest, manifest_raw: bytes) -> CheckpointInfo:
    """The info of a checkpoint that passed its checks."""
    m = manifest
    total = m.data_bytes + len(manifest_raw)
    return CheckpointInfo(m.step, path, m.wall_time, total, True, None, dict(m.metrics))


def check_bytes(path: Path, *, step: int | None = None) -> tuple[Manifest, bytes]:
    """Check every byte of a checkpoint against its manifest in bounded memory (before an upload,
    after a download); returns the manifest and its raw bytes. Raises CorruptCheckpointError."""
    with opened_checkpoint(path, step) as ck:
        for name, entry in ck.manifest.files.items():
            check_crc(stream_crc(*ck.files[name], path / name), entry, path / name)
        return ck.manifest, ck.manifest_raw


def verdict(path: Path, check: Callable[[], CheckpointInfo]) -> CheckpointInfo:
    """``check()``'s info, or one that carries the problem it raised: never raises for a bad
    checkpoint."""
    try:
        return check()
    except CorruptCheckpointError as exc:
        named = step_of_dir(path.name)
        return CheckpointInfo(named if named is not None else -1, path, problem=exc.message)


def verify_listed(path: Path, *, step: int | None = None) -> CheckpointInfo:
    """The verdict of listing: everything but the bytes' content (manifest, file types and
    sizes, the tensor headers)."""

    def check() -> CheckpointInfo:
        with opened_checkpoint(path, step) as ck:
            return info_of(path, ck.manifest, ck.manifest_raw)

    return verdict(path, check)


def step_dirs(run_dir: Path) -> list[tuple[int, str]]:
    """``(step, name)`` of every ``step-*`` entry of ``run_dir``, oldest first."""
    try:
        names = os.listdir(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((s, n) for n in names if (s := step_of_dir(n)) is not None)


def list_checkpoints(
    run_dir: str | os.PathLike[str], verify: Callable[[Path], CheckpointInfo] = verify_listed
) -> list[CheckpointInfo]:
    """Every ``step-*`` entry of ``run_dir``, oldest first, each verified by ``verify`` (the
    runtime passes its deeper one). Temporary directories of unfinished saves are not listed."""
    run_dir = Path(run_dir)
    return [verify(run_dir / name) for _, name in step_dirs(run_dir)]
