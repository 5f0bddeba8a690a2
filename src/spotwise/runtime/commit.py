"""Committing one checkpoint of torch tensors to a directory, and loading one back.

The format, the durable writes, the publish step, the checks of listing and of the bytes, and
retention are torch-free, in :mod:`spotwise.checkpoint`; this module adds what needs torch:
packing live tensors into the files (:func:`write_checkpoint`, :func:`commit_files` for the
ranks of a distributed job) and loading, which checks everything listing and the checksums
check and then views the tensors out of the files and decodes the state, so ``ckpt verify`` and
loading give one verdict (:func:`verify_checkpoint`).
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import torch

from spotwise import settings
from spotwise.checkpoint.durable import close_all, remove_tree
from spotwise.checkpoint.format import (
    MANIFEST,
    STATE_FILE,
    FileEntry,
    Manifest,
    parse_state,
    step_dir_name,
    tensor_file_name,
)
from spotwise.checkpoint.memory import fresh_region
from spotwise.checkpoint.read import (
    READ_CHUNK,
    CheckpointInfo,
    check_crc,
    info_of,
    open_checkpoint_dir,
    open_member,
    opened_checkpoint,
    read_with_crc,
    step_dirs,
    stream_crc,
    verdict,
    verify_listed,
)
from spotwise.checkpoint.read import list_checkpoints as _list_checkpoints
from spotwise.checkpoint.write import (
    manifest_bytes,
    publish,
    save_error,
    temporary_dir,
    write_file,
)
from spotwise.dirfd import NOFOLLOW, opened_dir
from spotwise.errors import CorruptCheckpointError
from spotwise.runtime.format import TensorBlob, pack_tensors, split_blob, tensor_views
from spotwise.runtime.state import RUN_KIND, check_run_state, decode

log = logging.getLogger(__name__)

# A large state is written as up to _WRITERS tensor files of at least _PART_BYTES each, by as
# many threads: a disk reaches its speed only with several writes in flight (4 streams get
# about 1.5x one here; see the benchmark), and the buffered writes of one file serialize.
# 256 MiB goes in 2 files (0.94-0.95x of 4 raw writers here, 0.85-0.95x in one file); a
# state under 192 MiB stays in one.
_WRITERS = 4
_PART_BYTES = 96 << 20


def write_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    tensors: Mapping[str, torch.Tensor] | TensorBlob,
    state: Mapping[str, Any] | bytes = b"{}",
    *,
    metrics: Mapping[str, float] | None = None,
    wall_time: float | None = None,
    kind: str | None = None,
    direct: bool = True,
) -> CheckpointInfo:
    """Durably write and commit checkpoint ``step``; returns its info once it is visible.
    ``kind`` (``state.RUN_KIND`` from Run) has every reader check the state's structure;
    ``direct`` False writes the large files through the page cache.

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
                n: pool.submit(write_file, tmp / n, c, opened, sync=len(parts) > 1, direct=direct)
                for n, c in contents.items()
            }
        files: dict[str, dict[str, Any]] = {n: w.result() for n, w in writes.items()}
        for i, part in enumerate(parts):  # the record of each file's tensors
            files[tensor_file_name(i)]["header_crc32c"] = f"{crc32c.crc32c(part.layout.header):08x}"
        # failpoint: a crash test SIGKILLs the process here, its files written, no manifest yet
        delay = settings.TEST_WRITE_DELAY_S.seconds(None, 0.0)
        if delay > 0:
            time.sleep(delay)
        raw = manifest_bytes(step, wall, metrics, files, kind=kind)
        write_file(tmp / MANIFEST, (raw,), opened)
        _publish(tmp, final, opened)
    except BaseException as exc:
        close_all(opened)
        if tmp is not None:
            remove_tree(tmp)
        if isinstance(exc, OSError):
            raise save_error(exc, step, run_dir) from exc
        raise
    total = sum(f["size"] for f in files.values()) + len(raw)
    return CheckpointInfo(step, final, wall, total, True, None, dict(metrics or {}))


# --- several writers, one commit (torch.distributed ranks) -------------------------------------
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
        files = {name: write_file(tmp / name, chunks, opened) for name, chunks in own.items()}
        files.update({name: dict(entry) for name, entry in others.items()})
        raw = manifest_bytes(step, wall, metrics, files)
        write_file(tmp / MANIFEST, (raw,), opened)
        _publish(tmp, final, opened)
    except BaseException as exc:
        close_all(opened)
        remove_tree(tmp)
        if isinstance(exc, OSError):
            raise save_error(exc, step, tmp.parent) from exc
        raise
    total = sum(f["size"] for f in files.values()) + len(raw)
    return CheckpointInfo(step, final, wall, total, True, None, dict(metrics or {}))


def read_member(path: Path, name: str, entry: FileEntry) -> torch.Tensor:
    """The bytes of file ``name`` of checkpoint directory ``path`` (read without following
    links), checked against its manifest ``entry``: what one rank reads of a checkpoint other
    ranks wrote. Raises CorruptCheckpointError."""
    dir_fd = open_checkpoint_dir(path)
    try:
        fd, size = open_member(dir_fd, name, path)
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
                opened.append(os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=staged))
        _publish(tmp, final, opened)
    finally:
        close_all(opened)


def _standing_valid(final: Path) -> bool:
    """Whether a checkpoint already at ``final`` loads: then it holds the same step's state and
    the publish step keeps it."""
    return verify_checkpoint(final).valid


def _publish(tmp: Path, final: Path, opened: list[int]) -> None:
    publish(tmp, final, opened, _standing_valid)


# --- loading -----------------------------------------------------------------------------------
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


def fresh_buffer(size: int, *, zeroed: bool = False) -> torch.Tensor:
    """An uninitialized (or ``zeroed``) uint8 tensor of ``size`` bytes to read a file or a
    state into. A large one is a :func:`~spotwise.checkpoint.memory.fresh_region` (zero-filled,
    with huge pages where they pay); the tensor keeps the mapping alive, and it is unmapped
    when the last view of it goes."""
    if size < READ_CHUNK:
        return (torch.zeros if zeroed else torch.empty)(size, dtype=torch.uint8)
    return torch.frombuffer(fresh_region(size), dtype=torch.uint8)


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
    check_crc(read_with_crc(fd, view, file), entry, file)
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


def _inspect(path: Path, step: int | None, share: Share | None = None) -> _Read:
    """The one verdict of loading: raises CorruptCheckpointError naming the first problem found.

    ``step`` is the step the directory must hold; None takes it from the directory's name.
    ``share`` narrows the byte checks of the members beyond the tensors and state to those it
    names, which are read whole and kept; the others get the checks of listing only."""
    with opened_checkpoint(path, step) as ck:
        manifest, headers = ck.manifest, ck.headers
        read = _Read(manifest, ck.manifest_raw)
        mine = None if share is None else frozenset(share(manifest))
        for name, entry in manifest.files.items():
            fd, size = ck.files[name]
            file = path / name
            if name in headers or name == STATE_FILE:
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
            else:
                check_crc(stream_crc(fd, size, file), entry, file)
        read.doc = _decoded(read.state, read.tensors, path / STATE_FILE)
        if manifest.kind == RUN_KIND:
            try:
                check_run_state(read.doc, manifest.step)
            except CorruptCheckpointError as exc:
                raise CorruptCheckpointError(
                    f"{path / STATE_FILE}: {exc.message}", hint=exc.hint
                ) from exc
        return read


def _decoded(state: Any, tensors: Mapping[str, torch.Tensor], file: Path) -> Any:
    try:
        return decode(state, tensors)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{file}: {exc.message}") from exc
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise CorruptCheckpointError(f"{file} does not decode ({type(exc).__name__})") from exc


def load_checkpoint(
    path: str | os.PathLike[str], *, step: int | None = None, share: Share | None = None
) -> LoadedCheckpoint:
    """Read and verify one checkpoint; CorruptCheckpointError names what is wrong.

    With ``share``, the bytes of the members beyond the tensors and state are checked only for
    the names ``share(manifest)`` returns, and those are kept read in ``members``: one rank of a
    distributed job checks its share of the files, which it is about to read anyway, and the
    ranks agree on the verdict (:func:`spotwise.runtime.distributed.sharded.agreed_checkpoints`)."""
    path = Path(path)
    read = _inspect(path, step, share)
    info = info_of(path, read.manifest, read.manifest_raw)
    return LoadedCheckpoint(
        info, read.tensors, read.state, read.doc, read.manifest, read.manifest_raw, read.members
    )


def verify_checkpoint(
    path: str | os.PathLike[str], *, deep: bool = True, step: int | None = None
) -> CheckpointInfo:
    """The verdict on one checkpoint directory. ``deep`` is exactly what loading checks
    (checksums, tensors, state); without it, everything but the bytes' content (manifest, file
    types and sizes, the tensor header). Never raises for a bad checkpoint; the problem is in
    the returned info."""
    path = Path(path)
    if not deep:
        return verify_listed(path, step=step)

    def check() -> CheckpointInfo:
        read = _inspect(path, step)
        return info_of(path, read.manifest, read.manifest_raw)

    return verdict(path, check)


def list_checkpoints(
    run_dir: str | os.PathLike[str], *, deep: bool = False
) -> list[CheckpointInfo]:
    """Every ``step-*`` entry of ``run_dir``, oldest first, each verified (see
    :func:`verify_checkpoint`). Temporary directories of unfinished saves are not listed."""
    return _list_checkpoints(run_dir, lambda path: verify_checkpoint(path, deep=deep))


def _skip_warning(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def loadable_checkpoints(run_dir: str | os.PathLike[str]) -> Iterator[LoadedCheckpoint]:
    """The checkpoints of ``run_dir`` that load, newest first, each read only when the caller
    asks for the next one; each that does not load is skipped with a warning."""
    run_dir = Path(run_dir)
    found = step_dirs(run_dir)
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
