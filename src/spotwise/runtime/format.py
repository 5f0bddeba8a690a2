"""The checkpoint format's tensor side: torch dtypes, packing live tensors into safetensors
payloads, and viewing loaded bytes as tensors. The format itself (names, limits, the manifest
and header parsers) is torch-free, in :mod:`spotwise.checkpoint.format`."""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from spotwise.checkpoint.format import Header, header_length, parse_header
from spotwise.errors import CorruptCheckpointError, SaveError


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
    data_bytes: int

    @staticmethod
    def plan(specs: Iterable[TensorSpec]) -> TensorLayout:
        ordered = sorted(specs, key=lambda s: -s.dtype.itemsize)  # stable: keeps given order
        offsets, pos = [], 0
        for spec in ordered:
            if spec.dtype not in DTYPE_TO_ST:
                raise SaveError(
                    f"tensor {spec.name!r} has dtype {spec.dtype}, which safetensors cannot store",
                    hint="convert it to a supported dtype before saving",
                )
            offsets.append(pos)
            pos += spec.nbytes
        return TensorLayout(tuple(ordered), tuple(offsets), pos)

    @functools.cached_property
    def header(self) -> bytes:
        """8-byte length + JSON, padded so the data section starts 8-byte aligned. Built when
        first asked for: a layout that a save splits into several files never needs its own."""
        entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        for spec, pos in zip(self.specs, self.offsets, strict=True):
            entries[spec.name] = {
                "dtype": DTYPE_TO_ST[spec.dtype],
                "shape": list(spec.shape),
                "data_offsets": [pos, pos + spec.nbytes],
            }
        text = json.dumps(entries, separators=(",", ":")).encode()
        text += b" " * (-(8 + len(text)) % 8)
        return len(text).to_bytes(8, "little") + text


@dataclass(frozen=True)
class TensorBlob:
    """A safetensors file ready to be written: header plus data chunks in file order."""

    layout: TensorLayout
    chunks: tuple[memoryview, ...]
    # split_blob's answers: a snapshot's blob is written again at every save, and the files'
    # headers are Python work that holds the GIL (3 ms for 2,000 tensors) on the saving
    # thread while training goes on, which then waits for the GIL
    _splits: dict[int, list[TensorBlob]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

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
    """``tensor`` as plain CPU memory that NumPy can view. Each step runs only where needed: a
    ``detach`` alone, on every tensor, was 7 of the 12 ms that packing 2,000 tensors took."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.is_conj() or tensor.is_neg():  # lazy views whose bytes are not yet their values
        tensor = tensor.resolve_conj().resolve_neg()
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def pack_tensors(tensors: Mapping[str, torch.Tensor]) -> TensorBlob:
    """Zero-copy payload of live CPU tensors (device tensors are copied to the host first)."""
    cpu = {n: _host(t) for n, t in tensors.items()}
    layout = TensorLayout.plan(spec_of(n, t) for n, t in cpu.items())
    return TensorBlob(layout, tuple(byte_view(cpu[s.name]) for s in layout.specs))


def _cut(chunks: Iterable[memoryview], edges: list[int]) -> list[tuple[memoryview, ...]]:
    """The concatenated ``chunks`` cut at the byte offsets ``edges`` (0 first, the total
    last), in one pass, as views: one chunk for a snapshot, one per tensor for
    :func:`pack_tensors`."""
    out: list[list[memoryview]] = [[] for _ in edges[1:]]
    part, pos = 0, 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while len(view):
            while pos == edges[part + 1]:  # (a range of empty tensors holds no bytes)
                part += 1
            take = min(len(view), edges[part + 1] - pos)
            out[part].append(view[:take])
            view, pos = view[take:], pos + take
    return [tuple(views) for views in out]


def split_blob(blob: TensorBlob, parts: int) -> list[TensorBlob]:
    """``blob`` cut into at most ``parts`` safetensors files of nearly equal size, without
    copying: several writers can then write them at once. Each file is a run of consecutive
    tensors, never cut, so it is a standard safetensors file whose data is one range of the
    blob's (a writer copies it in a few large pieces, not tensor by tensor, holding the GIL
    less). The answer is kept on ``blob``, for a blob written again."""
    if parts not in blob._splits:
        blob._splits[parts] = _split(blob, parts)
    return blob._splits[parts]


def _split(blob: TensorBlob, parts: int) -> list[TensorBlob]:
    layout = blob.layout
    if parts <= 1 or len(layout.specs) <= 1:
        return [blob]
    starts = layout.offsets
    cuts = [0]  # the index of each file's first tensor: the boundary nearest each ideal cut
    for k in range(1, parts):
        ideal = layout.data_bytes * k // parts
        i = bisect.bisect_left(starts, ideal, lo=cuts[-1] + 1)
        if i > cuts[-1] + 1 and (i == len(starts) or ideal - starts[i - 1] < starts[i] - ideal):
            i -= 1
        if i < len(starts):
            cuts.append(i)
    bounds = [*cuts, len(starts)]
    edges = [*(starts[i] for i in cuts), layout.data_bytes]
    # a run of the layout's tensors keeps its order, larger elements first: plan() leaves it as
    # it is, every offset moved by the same multiple of the largest element size
    return [
        TensorBlob(TensorLayout.plan(layout.specs[first:end]), views)
        for (first, end), views in zip(
            itertools.pairwise(bounds), _cut(blob.chunks, edges), strict=True
        )
    ]


def parse_safetensors(buf: torch.Tensor, where: str) -> dict[str, torch.Tensor]:
    """Tensors viewed out of a whole safetensors file held in ``buf`` (uint8), validating every
    header field against the buffer first."""
    size = buf.numel()
    raw = memoryview(buf.numpy()) if size else memoryview(b"")  # type: ignore[arg-type,unused-ignore]
    length = header_length(raw[:8], size, where)
    header = bytes(raw[8 : 8 + length])
    return tensor_views(buf, Header(length, header, parse_header(header, size - 8 - length, where)))


def tensor_views(buf: torch.Tensor, header: Header, where: str = "") -> dict[str, torch.Tensor]:
    """The tensors of ``header`` viewed out of the whole file held in ``buf``. Consecutive
    tensors of one dtype are cut out of one typed view with a single ``split``, so thousands of
    small tensors cost one call, not thousands of slice/view/reshape calls. ``header`` may have
    been read separately (before the file, to refuse it early): the buffer must hold the same
    header bytes."""
    if bytes(buf[8 : 8 + header.length].numpy()) != header.raw:
        raise CorruptCheckpointError(f"{where}: the header changed while the file was read")
    entries = header.entries
    data = buf[8 + header.length :]
    out: dict[str, torch.Tensor] = {}
    i = 0
    while i < len(entries):
        j = i
        while j < len(entries) and entries[j].dtype == entries[i].dtype:
            j += 1
        run, dtype = entries[i:j], ST_TO_DTYPE.get(entries[i].dtype)
        if dtype is None:  # a code this torch build has no dtype for
            raise CorruptCheckpointError(f"{where}: tensor {run[0].name!r} has unknown dtype")
        flat = data[run[0].start : run[-1].end]
        if flat.storage_offset() % dtype.itemsize:
            flat = flat.clone()  # files from other writers may not align tensors
        pieces = flat.view(dtype).split([math.prod(e.shape) for e in run])
        for entry, piece in zip(run, pieces, strict=True):  # split gives 1-D pieces already
            out[entry.name] = piece if len(entry.shape) == 1 else piece.view(entry.shape)
        i = j
    return out
