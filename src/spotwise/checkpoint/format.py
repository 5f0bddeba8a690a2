"""The checkpoint format: names, the safetensors layout, and parsers that stay within fixed limits.

Layout of one checkpoint (``run_dir/step-00001200/``):

- ``tensors.safetensors`` (and, from format version 2, ``tensors-1.safetensors`` ... when the
  state is large): every tensor of the state, each in exactly one of these standard safetensors
  files (8-byte little-endian header length, JSON header, raw bytes). A few files instead of one
  per tensor keep a model with thousands of small parameters as fast to save as one large blob;
  a few instead of one let several writers reach the disk's multi-stream speed (on ext4 the
  buffered writes of one file serialize on its inode lock).
- ``state.json``: everything else (counters, hyper-parameters, RNG words), referring to tensors by
  name.
- ``manifest.json``: written last; each file's size and CRC32C, the format version, the step, the
  wall time and user metrics. Optional records (older readers ignore them): each tensor file's
  ``header_crc32c``, the CRC32C of its safetensors header, which is the record of its tensors'
  names, dtypes, shapes and byte ranges; and ``kind``, ``"spotwise.Run"`` when ``state.json`` is
  Run's document, whose structure every reader then checks. With them, a checkpoint whose files
  were changed and their CRCs recomputed is refused alike by ``ckpt verify`` and by loading.

Everything read back is treated as hostile: a run directory may be shared, and a buggy or
malicious writer must cost a skipped checkpoint, never a hang, a traceback, unbounded memory or
code execution. So every parser here checks sizes before reading, JSON nesting depth and string
lengths after parsing, and every number's type and range before it is used. Nothing here does
I/O (``read.py`` and ``write.py`` do), nothing pickles and nothing imports torch (the tensor side
of the format is ``spotwise.runtime.format``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple, TypeGuard

from spotwise.errors import CorruptCheckpointError

FORMAT = "spotwise-checkpoint"
FORMAT_VERSION = 2  # 2: the tensors may be spread over several files (1: one file)
MANIFEST = "manifest.json"
TENSORS_FILE = "tensors.safetensors"  # the first (in version 1 the only) tensor file
TENSOR_PART = re.compile(r"^tensors-([1-9]\d{0,2})\.safetensors$")  # the further ones
STATE_FILE = "state.json"
REQUIRED_FILES = (TENSORS_FILE, STATE_FILE)  # what loading needs; a manifest must list both
STEP_DIR = re.compile(r"^step-(\d{8,15})$")

# Limits on what a reader accepts. They sit far above anything spotwise writes (a manifest is a
# few hundred bytes, a header a few hundred KiB for thousands of tensors) and far below what would
# exhaust memory or the interpreter's recursion limit.
MAX_MANIFEST_BYTES = 1 << 20
MAX_MANIFEST_DEPTH = 8
MAX_FILES = 1024
MAX_NAME_CHARS = 255  # one path component, as on every common file system
MAX_STRING_CHARS = 4096
MAX_STEP = 10**15 - 1  # what a step directory name can hold
MAX_FILE_BYTES = 1 << 50
MAX_HEADER_BYTES = 100 << 20
MAX_TENSORS = 1_000_000
MAX_NDIM = 64
MAX_STATE_BYTES = 1 << 30
MAX_STATE_DEPTH = 64
MAX_STATE_STRING_CHARS = 1 << 20

# The safetensors dtype codes spotwise writes and reads, with their element sizes: what a header
# is checked against without torch (``runtime/format.py`` maps each code to a torch dtype).
ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8,
}  # fmt: skip


def tensor_file_name(part: int) -> str:
    """The name of tensor file number ``part`` (0 is :data:`TENSORS_FILE`)."""
    return TENSORS_FILE if part == 0 else f"tensors-{part}.safetensors"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of_dir(name: str) -> int | None:
    """The step a checkpoint directory is named for, or None if ``name`` is not one."""
    match = STEP_DIR.match(name)
    return int(match.group(1)) if match else None


# --- bounded JSON ------------------------------------------------------------------------------
def _loads(raw: bytes | memoryview, where: str, max_bytes: int) -> Any:
    """``json.loads`` of at most ``max_bytes``; its C parser guards its own recursion, so deep
    nesting is a RecursionError here, never a crash."""
    if len(raw) > max_bytes:
        raise CorruptCheckpointError(f"{where} is {len(raw)} bytes, over the limit of {max_bytes}")
    try:
        return json.loads(bytes(raw))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, big ints
        raise CorruptCheckpointError(f"{where} is not valid JSON ({_short(exc)})") from exc


def bounded_json(
    raw: bytes | memoryview, where: str, *, max_bytes: int, max_depth: int, max_string: int
) -> Any:
    """Parse JSON that may be hostile and whose consumers recurse into it: size first, then the
    depth and string lengths of the result (walked with an explicit stack, so deep nesting
    cannot exhaust the interpreter's)."""
    value = _loads(raw, where, max_bytes)
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if len(item) > max_string:
                raise CorruptCheckpointError(f"{where} holds a string over {max_string} characters")
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth > max_depth:
            raise CorruptCheckpointError(f"{where} is nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            stack.extend((k, depth) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        else:
            stack.extend((v, depth + 1) for v in item)
    return value


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _is_int(value: Any, low: int, high: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_file_name(name: Any) -> str | None:
    """Why ``name`` cannot be a file of a checkpoint directory, or None if it can: one plain path
    component, so a reader opening it relative to the directory cannot leave the directory."""
    if not isinstance(name, str) or not name:
        return "not a non-empty string"
    if len(name) > MAX_NAME_CHARS:
        return f"longer than {MAX_NAME_CHARS} characters"
    if "\x00" in name or "/" in name or "\\" in name:
        return "contains a NUL, '/' or '\\'"
    if name in (".", "..") or name.startswith("."):
        return "starts with '.'"
    if name == MANIFEST:
        return "is the manifest itself"
    return None


# --- manifest ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileEntry:
    size: int
    crc32c: str  # 8 lower-case hex digits
    header_crc32c: str | None = None  # a tensor file's record of its header (None: not kept)


@dataclass(frozen=True)
class Manifest:
    step: int
    wall_time: float | None
    metrics: dict[str, float]
    files: dict[str, FileEntry]
    tensor_files: tuple[str, ...] = (TENSORS_FILE,)  # the listed files that hold the tensors
    kind: str | None = None  # what state.json holds: RUN_KIND (spotwise.runtime.state) or None

    @property
    def data_bytes(self) -> int:
        return sum(f.size for f in self.files.values())


_CRC = re.compile(r"^[0-9a-f]{8}$")


def parse_manifest(raw: bytes | memoryview, where: str) -> Manifest:
    """Validate manifest bytes (from disk or an object store); ``where`` names them in errors."""
    doc = bounded_json(
        raw,
        where,
        max_bytes=MAX_MANIFEST_BYTES,
        max_depth=MAX_MANIFEST_DEPTH,
        max_string=MAX_STRING_CHARS,
    )
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{where}: not a {FORMAT} manifest")
    version = doc.get("version")
    if not _is_int(version, 1, 10**6):
        raise CorruptCheckpointError(f"{where}: format version {version!r} is not a version")
    if version > FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{where}: format version {version} is newer than this spotwise understands "
            f"({FORMAT_VERSION}); upgrade spotwise"
        )
    step = doc.get("step")
    if not _is_int(step, 0, MAX_STEP):
        raise CorruptCheckpointError(f"{where}: step {step!r} is not a step number")
    wall = doc.get("wall_time")
    if wall is not None and not (_is_number(wall) and 0 <= wall <= 1e11 and math.isfinite(wall)):
        raise CorruptCheckpointError(f"{where}: wall_time {wall!r} is not a time")
    metrics = doc.get("metrics", {})
    if not isinstance(metrics, dict) or not all(_is_number(v) for v in metrics.values()):
        raise CorruptCheckpointError(f"{where}: metrics must map names to numbers")
    kind = doc.get("kind")
    if kind is not None and not (isinstance(kind, str) and len(kind) <= MAX_NAME_CHARS):
        raise CorruptCheckpointError(f"{where}: kind {kind!r} is not a name")
    files = _parse_files(doc.get("files"), where)
    parts = [n for n in files if version >= 2 and TENSOR_PART.match(n)]
    return Manifest(
        step=step,
        wall_time=float(wall) if wall else None,
        metrics={k: float(v) for k, v in metrics.items()},
        files=files,
        tensor_files=(TENSORS_FILE, *parts),
        kind=kind,
    )


def _parse_files(files: Any, where: str) -> dict[str, FileEntry]:
    if not isinstance(files, dict) or not files:
        raise CorruptCheckpointError(f"{where}: 'files' must list the checkpoint's files")
    if len(files) > MAX_FILES:
        raise CorruptCheckpointError(f"{where}: lists {len(files)} files, over {MAX_FILES}")
    out = {}
    for name, entry in files.items():
        problem = check_file_name(name)
        if problem is not None:
            raise CorruptCheckpointError(f"{where}: file name {name!r} {problem}")
        if not isinstance(entry, dict):
            raise CorruptCheckpointError(f"{where}: entry of {name!r} is not an object")
        size, crc = entry.get("size"), entry.get("crc32c")
        if not _is_int(size, 0, MAX_FILE_BYTES):
            raise CorruptCheckpointError(f"{where}: size {size!r} of {name!r} is not a size")
        if not isinstance(crc, str) or not _CRC.match(crc):
            raise CorruptCheckpointError(f"{where}: crc32c {crc!r} of {name!r} is not a CRC32C")
        header = entry.get("header_crc32c")
        if header is not None and not (isinstance(header, str) and _CRC.match(header)):
            raise CorruptCheckpointError(
                f"{where}: header_crc32c {header!r} of {name!r} is not a CRC32C"
            )
        out[name] = FileEntry(size, crc, header)
    missing = [n for n in REQUIRED_FILES if n not in out]
    if missing:
        raise CorruptCheckpointError(f"{where} does not list {', '.join(missing)}")
    return out


# --- safetensors -------------------------------------------------------------------------------
class _Entry(NamedTuple):  # a tuple: cheap to build thousands of times per load
    name: str
    dtype: str  # the safetensors code (a key of ITEMSIZE)
    shape: tuple[int, ...]
    start: int
    end: int


def header_length(first8: bytes | memoryview, file_size: int, where: str) -> int:
    """The JSON header length from a safetensors file's first 8 bytes, checked against the
    file's size and the header limit before anything is read."""
    if file_size < 8 or len(first8) < 8:
        raise CorruptCheckpointError(f"{where} is too short to be a safetensors file")
    length = int.from_bytes(bytes(first8[:8]), "little")
    if length > min(file_size - 8, MAX_HEADER_BYTES):
        raise CorruptCheckpointError(f"{where} has an impossible header length {length}")
    return length


def parse_header(raw: bytes | memoryview, data_bytes: int, where: str) -> list[_Entry]:
    """The tensor entries of a safetensors header, in file order. Each entry must have a known
    dtype, a shape of non-negative ints whose product matches its byte length, and the entries
    must tile the data section exactly (no gaps, overlaps or bytes outside it), as the
    safetensors specification requires."""
    doc = _loads(raw, where, MAX_HEADER_BYTES)  # every field is type-checked below, no walk
    if not isinstance(doc, dict):
        raise CorruptCheckpointError(f"{where} has a malformed header")
    entries = []
    for name, entry in doc.items():
        if len(name) > MAX_STRING_CHARS:
            raise CorruptCheckpointError(
                f"{where} names a tensor with over {MAX_STRING_CHARS} characters"
            )
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(
                isinstance(v, str) and len(v) <= MAX_STRING_CHARS for v in entry.values()
            ):
                raise CorruptCheckpointError(f"{where}: __metadata__ must map strings to strings")
            continue
        entries.append(_header_entry(name, entry, data_bytes, where))
    if len(entries) > MAX_TENSORS:
        raise CorruptCheckpointError(f"{where} holds {len(entries)} tensors, over {MAX_TENSORS}")
    entries.sort(key=attrgetter("start", "end"))
    pos = 0
    for e in entries:
        if e.start != pos:
            raise CorruptCheckpointError(
                f"{where}: tensor {e.name!r} lies outside the file or overlaps another "
                f"(starts at {e.start}, expected {pos})"
            )
        pos = e.end
    if pos != data_bytes:
        raise CorruptCheckpointError(
            f"{where}: the tensors cover {pos} bytes, the data section holds {data_bytes} "
            "(a tensor lies outside the file)"
        )
    return entries


def _header_entry(name: str, entry: Any, data_bytes: int, where: str) -> _Entry:
    if not isinstance(entry, dict):
        raise CorruptCheckpointError(f"{where}: bad header entry for {name!r}")
    code = entry.get("dtype")
    itemsize = ITEMSIZE.get(code) if isinstance(code, str) else None
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if itemsize is None or not isinstance(code, str):
        raise CorruptCheckpointError(f"{where}: tensor {name!r} has unknown dtype")
    # exact type checks (bool is an int subclass; JSON gives plain ints): this runs per tensor
    if (
        type(shape) is not list
        or len(shape) > MAX_NDIM
        or not all(type(d) is int and 0 <= d <= MAX_FILE_BYTES for d in shape)
    ):
        raise CorruptCheckpointError(f"{where}: tensor {name!r} has a bad shape {shape!r}")
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or not all(type(x) is int and 0 <= x <= data_bytes for x in offsets)
        or offsets[0] > offsets[1]
    ):
        raise CorruptCheckpointError(f"{where}: tensor {name!r} lies outside the file")
    count = math.prod(shape)
    if offsets[1] - offsets[0] != count * itemsize:
        raise CorruptCheckpointError(f"{where}: tensor {name!r} has the wrong byte length")
    return _Entry(name, code, tuple(shape), offsets[0], offsets[1])


@dataclass(frozen=True)
class Header:
    """A parsed safetensors header: its length, its bytes and its tensors in file order."""

    length: int
    raw: bytes
    entries: list[_Entry]


def parse_state(raw: bytes | memoryview, where: str) -> Any:
    """The parsed ``state.json``, within the state limits."""
    return bounded_json(
        raw,
        where,
        max_bytes=MAX_STATE_BYTES,
        max_depth=MAX_STATE_DEPTH,
        max_string=MAX_STATE_STRING_CHARS,
    )
