"""Checkpoints in a local directory: write, fsync, manifest last, rename; verify; load; retain.

Layout of one checkpoint (``run_dir/step-00001200/``):

- ``tensors.safetensors``: every tensor of the state, in one file (standard safetensors: 8-byte
  little-endian header length, JSON header, raw bytes). One file instead of one per tensor keeps
  a model with thousands of small parameters as fast to save as one large blob.
- ``state.json``: everything else (counters, hyper-parameters, RNG words), referring to tensors by
  name.
- ``manifest.json``: written last; each file's size and CRC32C, the format version, the step, the
  wall time and user metrics. A directory without a valid manifest does not exist for loading.

A checkpoint is built in a hidden sibling (``.tmp-step-...``): the tensors and state are written,
the manifest is written last, every file and the directory are fsynced, then the directory is
renamed into place (the commit) and the parent directory fsynced. A
crash at any instant therefore leaves either the complete new checkpoint or none of it, and never
touches older ones. Nothing here pickles or unpickles; loading never executes code from a file.

These functions work on a plain directory, independently of :class:`spotwise.runtime.Run`.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import torch

from spotwise.errors import CorruptCheckpointError, SaveError

log = logging.getLogger(__name__)

FORMAT = "spotwise-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
TMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = ".trash-step-"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_CHUNK = 64 << 20  # I/O and checksum granularity: large enough for full disk speed
_IOV = 512  # pieces per writev (the limit is IOV_MAX, 1024 on Linux)
_MAX_HEADER = 100 << 20  # a safetensors header larger than this is treated as corrupt
# Failpoint for crash tests: seconds to sleep after the tensor file is written and before the
# manifest, so that a test can SIGKILL the process while a save is half done.
_WRITE_DELAY_ENV = "SPOTWISE_TEST_WRITE_DELAY_S"


def _dtype_table() -> dict[torch.dtype, str]:
    names = {
        "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
        "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
        "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
        "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
        "complex64": "C64",
    }  # fmt: skip
    return {getattr(torch, n): s for n, s in names.items() if hasattr(torch, n)}


DTYPE_TO_ST: dict[torch.dtype, str] = _dtype_table()
ST_TO_DTYPE: dict[str, torch.dtype] = {v: k for k, v in DTYPE_TO_ST.items()}


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


# --- tensor payloads ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class TensorLayout:
    """Where each tensor lives in the data section: tensors with larger elements first, so every
    offset is a multiple of its element size and a loaded tensor can be a view of one buffer."""

    specs: tuple[TensorSpec, ...]  # in file order
    offsets: tuple[int, ...]
    header: bytes  # 8-byte length + JSON, padded so the data section starts 8-byte aligned
    data_bytes: int

    @staticmethod
    def plan(specs: Iterable[TensorSpec]) -> TensorLayout:
        ordered = sorted(specs, key=lambda s: -s.dtype.itemsize)  # stable: keeps given order
        offsets, entries, pos = [], {}, 0
        for spec in ordered:
            if spec.dtype not in DTYPE_TO_ST:
                raise SaveError(
                    f"tensor {spec.name!r} has dtype {spec.dtype}, which safetensors cannot store",
                    hint="convert it to a supported dtype before saving",
                )
            offsets.append(pos)
            entries[spec.name] = {
                "dtype": DTYPE_TO_ST[spec.dtype],
                "shape": list(spec.shape),
                "data_offsets": [pos, pos + spec.nbytes],
            }
            pos += spec.nbytes
        header_obj: dict[str, Any] = {"__metadata__": {"format": "pt"}, **entries}
        text = json.dumps(header_obj, separators=(",", ":")).encode()
        text += b" " * (-(8 + len(text)) % 8)
        header = len(text).to_bytes(8, "little") + text
        return TensorLayout(tuple(ordered), tuple(offsets), header, pos)


@dataclass(frozen=True)
class TensorBlob:
    """A safetensors file ready to be written: header plus data chunks in file order."""

    layout: TensorLayout
    chunks: tuple[memoryview, ...]

    @property
    def file_bytes(self) -> int:
        return len(self.layout.header) + self.layout.data_bytes


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    nbytes = tensor.numel() * tensor.element_size()
    return TensorSpec(name, tensor.dtype, tuple(tensor.shape), nbytes)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous, detached CPU tensor, without copying."""
    if tensor.numel() == 0:
        return memoryview(b"")
    try:
        array = tensor.numpy()  # the cheap path, for every dtype NumPy knows
    except TypeError:  # bfloat16, float8...: reinterpret the bytes
        array = tensor.view(-1).view(torch.uint8).numpy()
    return memoryview(array).cast("B")  # type: ignore[arg-type]


def _host(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def pack_tensors(tensors: Mapping[str, torch.Tensor]) -> TensorBlob:
    """Zero-copy payload of live CPU tensors (device tensors are copied to the host first)."""
    cpu = {n: _host(t) for n, t in tensors.items()}
    layout = TensorLayout.plan(spec_of(n, t) for n, t in cpu.items())
    return TensorBlob(layout, tuple(byte_view(cpu[s.name]) for s in layout.specs))


# --- writing -----------------------------------------------------------------------------------
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: Future[int] | None = None
        for batch in _batches(chunks):
            if pending is not None:
                crc = pending.result()
            pending = pool.submit(_crc_of, batch, crc)
            _writev_all(fd, batch)
        if pending is not None:
            crc = pending.result()
    return crc


def _write_file(
    path: Path, chunks: Sequence[memoryview | bytes], opened: list[int]
) -> dict[str, Any]:
    """Write one file (not yet fsynced: its descriptor goes to ``opened``) and return its
    manifest entry."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    opened.append(fd)
    crc = _write_all(fd, chunks)
    return {"size": os.fstat(fd).st_size, "crc32c": f"{crc:08x}"}


def _save_error(exc: OSError, step: int, run_dir: Path) -> SaveError:
    what = f"could not write checkpoint step {step} in {run_dir}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SaveError(
            f"{what}: no space left on the device ({exc.strerror})",
            hint="free disk space or use a --run-dir on a larger disk; earlier checkpoints are "
            "intact",
        )
    if exc.errno == errno.EFBIG:
        return SaveError(
            f"{what}: file too large for this file system or the process's file-size limit "
            f"(ulimit -f) ({exc.strerror})",
            hint="raise the limit or use a different file system; earlier checkpoints are intact",
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return SaveError(
            f"{what}: the location is read-only or not writable ({exc.strerror})",
            hint="point the run directory at a writable location; earlier checkpoints are intact",
        )
    return SaveError(f"{what}: {exc}", hint="earlier checkpoints are intact")


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


def write_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    tensors: Mapping[str, torch.Tensor] | TensorBlob,
    state: Mapping[str, Any] | bytes = b"{}",
    *,
    metrics: Mapping[str, float] | None = None,
    wall_time: float | None = None,
) -> CheckpointInfo:
    """Durably write and commit checkpoint ``step``; returns its info once it is visible.

    Raises SaveError (naming the cause: disk full, read-only...) with the temporary directory
    removed and every earlier checkpoint untouched.
    """
    run_dir = Path(run_dir)
    blob = tensors if isinstance(tensors, TensorBlob) else pack_tensors(tensors)
    state_bytes = state if isinstance(state, bytes) else json.dumps(state).encode()
    final = run_dir / step_dir_name(step)
    tmp = run_dir / f"{TMP_PREFIX}{step:08d}-{uuid.uuid4().hex[:8]}"
    wall = time.time() if wall_time is None else wall_time
    opened: list[int] = []
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        files: dict[str, dict[str, Any]] = {
            TENSORS_FILE: _write_file(
                tmp / TENSORS_FILE, (blob.layout.header, *blob.chunks), opened
            ),
            STATE_FILE: _write_file(tmp / STATE_FILE, (state_bytes,), opened),
        }
        delay = float(os.environ.get(_WRITE_DELAY_ENV, "0") or 0)
        if delay > 0:
            time.sleep(delay)
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "step": step,
            "wall_time": wall,
            "metrics": dict(metrics or {}),
            "files": files,
        }
        _write_file(tmp / MANIFEST, (json.dumps(manifest, indent=1).encode(),), opened)
        # The rename below is the commit, so the files and their directory may be fsynced
        # concurrently (the file system groups them into one journal commit instead of one per
        # file), as long as all of them are durable before the directory becomes visible.
        opened.append(os.open(tmp, os.O_RDONLY | os.O_DIRECTORY))
        with ThreadPoolExecutor(max_workers=len(opened)) as pool:
            list(pool.map(os.fsync, opened))
        _close_all(opened)
        _commit(tmp, final)
        _fsync_dir(run_dir)
    except OSError as exc:
        _close_all(opened)
        _remove_tree(tmp)
        raise _save_error(exc, step, run_dir) from exc
    except BaseException:
        _close_all(opened)
        _remove_tree(tmp)
        raise
    total = sum(f["size"] for f in files.values()) + _file_size(final / MANIFEST)
    return CheckpointInfo(step, final, wall, total, True, None, dict(metrics or {}))


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError as exc:
            log.warning("could not close a checkpoint file: %s", exc)
    fds.clear()


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _commit(tmp: Path, final: Path) -> None:
    """Rename into place. An existing directory of the same step is replaced only if it is not a
    valid checkpoint (a valid one holds the same step's state, so the new copy is dropped)."""
    if final.exists():
        if verify_checkpoint(final).valid:
            _remove_tree(tmp)
            return
        trash = final.with_name(f"{TRASH_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}")
        os.rename(final, trash)
        os.rename(tmp, final)
        _remove_tree(trash)
        return
    os.rename(tmp, final)


# --- reading and verifying ---------------------------------------------------------------------
def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed manifest of checkpoint directory ``path``; CorruptCheckpointError if absent or
    malformed."""
    path = Path(path)
    try:
        raw = (path / MANIFEST).read_bytes()
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(
            f"{path} has no {MANIFEST}: the save never committed",
            hint="it is ignored for loading; 'spotwise ckpt list' shows the valid ones",
        ) from exc
    except OSError as exc:
        raise CorruptCheckpointError(f"cannot read {path / MANIFEST}: {exc}") from exc
    return parse_manifest(raw, str(path / MANIFEST))


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """Validate manifest bytes (from disk or an object store); ``where`` names them in errors."""
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"{where} is not valid JSON ({exc})") from exc
    problems = []
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        problems.append(f"not a {FORMAT} manifest")
    elif not isinstance(manifest.get("version"), int) or manifest["version"] > FORMAT_VERSION:
        problems.append(
            f"format version {manifest.get('version')!r} is newer than this spotwise "
            f"understands ({FORMAT_VERSION}); upgrade spotwise"
        )
    elif not isinstance(manifest.get("step"), int) or not isinstance(manifest.get("files"), dict):
        problems.append("missing step or files")
    else:
        for name, entry in manifest["files"].items():
            bad_name = not isinstance(name, str) or "/" in name or name.startswith(".")
            bad_entry = not isinstance(entry, dict) or not isinstance(entry.get("size"), int)
            if bad_name or bad_entry or not isinstance(entry.get("crc32c"), str):
                problems.append(f"bad file entry {name!r}")
    if problems:
        raise CorruptCheckpointError(f"{where}: {'; '.join(problems)}")
    return manifest


def _read_verified(path: Path, name: str, entry: Mapping[str, Any]) -> torch.Tensor:
    """Read a whole file into one uint8 tensor, checking size and CRC32C (overlapping the
    checksum of one chunk with the read of the next)."""
    file = path / name
    try:
        fd = os.open(file, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{file} is missing") from exc
    except OSError as exc:
        raise CorruptCheckpointError(f"cannot open {file}: {exc}") from exc
    try:
        size = os.fstat(fd).st_size
        if size != entry["size"]:
            raise CorruptCheckpointError(
                f"{file} has {size} bytes, the manifest says {entry['size']} (truncated?)"
            )
        buf = torch.empty(size, dtype=torch.uint8)
        view = memoryview(buf.numpy()).cast("B") if size else memoryview(b"")  # type: ignore[arg-type,unused-ignore]
        crc = _read_with_crc(fd, view, file)
    finally:
        os.close(fd)
    if f"{crc:08x}" != entry["crc32c"]:
        raise CorruptCheckpointError(
            f"{file} fails its CRC32C check (got {crc:08x}, manifest {entry['crc32c']}): "
            "the bytes on disk changed after the save"
        )
    return buf


def _read_with_crc(fd: int, view: memoryview, file: Path) -> int:
    crc = 0
    if len(view) <= _CHUNK:
        _readinto_all(fd, view, file)
        return crc32c.crc32c(view)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for start in range(0, len(view), _CHUNK):
            piece = view[start : start + _CHUNK]
            _readinto_all(fd, piece, file)
            if pending is not None:
                crc = pending.result()
            pending = pool.submit(crc32c.crc32c, piece, crc)
        assert pending is not None
        return pending.result()


def _readinto_all(fd: int, view: memoryview, file: Path) -> None:
    while len(view):
        n = os.readv(fd, [view])
        if n == 0:
            raise CorruptCheckpointError(f"{file} ended early while reading (truncated)")
        view = view[n:]


def verify_checkpoint(path: str | os.PathLike[str], *, deep: bool = True) -> CheckpointInfo:
    """Check a checkpoint directory: manifest, file sizes and (``deep``) checksums. Never raises
    for a bad checkpoint; the problem is in the returned info."""
    path = Path(path)
    match = _STEP_DIR.match(path.name)
    info = CheckpointInfo(int(match.group(1)) if match else -1, path)
    try:
        manifest = read_manifest(path)
        info.wall_time = float(manifest.get("wall_time") or 0) or None
        info.metrics = _metrics(manifest)
        if manifest["step"] != info.step:
            raise CorruptCheckpointError(
                f"{path} holds step {manifest['step']} but is named for step {info.step}"
            )
        total = _file_size(path / MANIFEST)
        for name, entry in manifest["files"].items():
            if deep:
                _read_verified(path, name, entry)
            else:
                size = _file_size(path / name) if (path / name).is_file() else -1
                if size != entry["size"]:
                    raise CorruptCheckpointError(
                        f"{path / name} is missing or has the wrong size (truncated?)"
                    )
            total += entry["size"]
        info.size_bytes = total
        info.valid = True
    except CorruptCheckpointError as exc:
        info.problem = exc.message
    return info


def _metrics(manifest: Mapping[str, Any]) -> dict[str, float]:
    raw = manifest.get("metrics") or {}
    if not isinstance(raw, dict):
        return {}
    return {k: float(v) for k, v in raw.items() if isinstance(v, (int, float))}


def list_checkpoints(
    run_dir: str | os.PathLike[str], *, deep: bool = False
) -> list[CheckpointInfo]:
    """Every ``step-*`` directory of ``run_dir``, oldest first, each verified (sizes only, or
    checksums too with ``deep``). Temporary directories of unfinished saves are not listed."""
    run_dir = Path(run_dir)
    try:
        names = os.listdir(run_dir)
    except FileNotFoundError:
        return []
    found = sorted(
        (int(m.group(1)), name) for name in names if (m := _STEP_DIR.match(name)) is not None
    )
    return [verify_checkpoint(run_dir / name, deep=deep) for _, name in found]


@dataclass
class LoadedCheckpoint:
    info: CheckpointInfo
    tensors: dict[str, torch.Tensor]  # views into one buffer holding the whole file
    state: Any  # the parsed state.json
    manifest: dict[str, Any]


def parse_safetensors(buf: torch.Tensor, where: str) -> dict[str, torch.Tensor]:
    """Tensors viewed out of a whole safetensors file held in ``buf`` (uint8), validating every
    header field against the buffer first."""
    size = buf.numel()
    if size < 8:
        raise CorruptCheckpointError(f"{where} is too short to be a safetensors file")
    header_len = int.from_bytes(bytes(buf[:8].numpy()), "little")
    if header_len > min(size - 8, _MAX_HEADER):
        raise CorruptCheckpointError(f"{where} has an impossible header length {header_len}")
    try:
        header = json.loads(bytes(buf[8 : 8 + header_len].numpy()))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"{where} has a malformed header ({exc})") from exc
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"{where} has a malformed header")
    data = buf[8 + header_len :]
    out: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = ST_TO_DTYPE[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            start, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptCheckpointError(f"{where}: bad header entry for {name!r}") from exc
        count = 1
        for d in shape:
            count *= d
        if min(shape, default=0) < 0 or not 0 <= start <= end <= data.numel():
            raise CorruptCheckpointError(f"{where}: tensor {name!r} lies outside the file")
        if end - start != count * dtype.itemsize:
            raise CorruptCheckpointError(f"{where}: tensor {name!r} has the wrong byte length")
        raw = data[start:end]
        if raw.storage_offset() % dtype.itemsize:
            raw = raw.clone()  # files from other writers may not align tensors
        out[name] = raw.view(dtype).reshape(shape)
    return out


def load_checkpoint(path: str | os.PathLike[str]) -> LoadedCheckpoint:
    """Read and verify one checkpoint; CorruptCheckpointError names what is wrong."""
    path = Path(path)
    manifest = read_manifest(path)
    files = manifest["files"]
    for required in (TENSORS_FILE, STATE_FILE):
        if required not in files:
            raise CorruptCheckpointError(f"{path / MANIFEST} does not list {required}")
    tensor_buf = _read_verified(path, TENSORS_FILE, files[TENSORS_FILE])
    state_buf = _read_verified(path, STATE_FILE, files[STATE_FILE])
    try:
        state = json.loads(bytes(state_buf.numpy()))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"{path / STATE_FILE} is not valid JSON ({exc})") from exc
    tensors = parse_safetensors(tensor_buf, str(path / TENSORS_FILE))
    info = CheckpointInfo(
        manifest["step"],
        path,
        float(manifest.get("wall_time") or 0) or None,
        sum(f["size"] for f in files.values()),
        True,
        None,
        _metrics(manifest),
    )
    return LoadedCheckpoint(info, tensors, state, manifest)


def load_newest_valid(run_dir: str | os.PathLike[str]) -> LoadedCheckpoint | None:
    """The newest checkpoint that verifies, warning about each newer one that does not."""
    candidates = sorted(
        (
            (int(m.group(1)), name)
            for name in (os.listdir(run_dir) if Path(run_dir).is_dir() else [])
            if (m := _STEP_DIR.match(name)) is not None
        ),
        reverse=True,
    )
    for _, name in candidates:
        try:
            return load_checkpoint(Path(run_dir) / name)
        except CorruptCheckpointError as exc:
            message = f"skipping checkpoint {name}: {exc.message}; falling back to an older one"
            log.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
    if candidates:
        warnings.warn(
            f"no valid checkpoint in {run_dir} ({len(candidates)} invalid); starting from scratch",
            RuntimeWarning,
            stacklevel=2,
        )
    return None


def clean_temporaries(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove the leftovers of saves that a crash interrupted (call only while no save runs)."""
    removed: list[Path] = []
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return removed
    for name in os.listdir(run_dir):
        if name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            _remove_tree(run_dir / name)
            removed.append(run_dir / name)
    return removed


# --- retention ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int = 3
    keep_best: int = 0
    best_metric: str | None = None
    best_mode: str = "min"  # "min" or "max"
    keep_every: int | None = None  # keep each checkpoint whose step is a multiple of this

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError("keep_last must be at least 1: the newest checkpoint is always kept")
        if self.best_mode not in ("min", "max"):
            raise ValueError("best_mode must be 'min' or 'max'")
        if self.keep_best and not self.best_metric:
            raise ValueError("keep_best needs best_metric, the metric name to rank by")


def choose_deletions(
    checkpoints: Sequence[CheckpointInfo], policy: RetentionPolicy
) -> list[CheckpointInfo]:
    """Which checkpoints to delete (pure). Only valid ones count; invalid ones older than the
    newest valid are deleted too; invalid newer ones are left for inspection."""
    valid = sorted((c for c in checkpoints if c.valid), key=lambda c: c.step)
    if not valid:
        return []
    keep = {c.step for c in valid[-policy.keep_last :]}
    if policy.keep_every:
        keep |= {c.step for c in valid if c.step % policy.keep_every == 0}
    if policy.keep_best and policy.best_metric:
        metric = policy.best_metric
        ranked = sorted(
            (c for c in valid if metric in c.metrics),
            key=lambda c: c.metrics[metric] if policy.best_mode == "min" else -c.metrics[metric],
        )
        keep |= {c.step for c in ranked[: policy.keep_best]}
    newest = valid[-1].step
    doomed = [c for c in valid if c.step not in keep]
    doomed += [c for c in checkpoints if not c.valid and c.step < newest]
    return sorted(doomed, key=lambda c: c.step)


def delete_checkpoint(path: Path) -> None:
    """Remove the manifest first, so a half-deleted directory is never mistaken for valid."""
    (path / MANIFEST).unlink(missing_ok=True)
    _remove_tree(path)


def retain(run_dir: str | os.PathLike[str], policy: RetentionPolicy) -> list[CheckpointInfo]:
    """Apply ``policy`` to ``run_dir`` and return what was deleted. Call it after a commit."""
    doomed = choose_deletions(list_checkpoints(run_dir), policy)
    for info in doomed:
        delete_checkpoint(info.path)
    return doomed
