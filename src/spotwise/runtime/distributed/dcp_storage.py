"""A ``torch.distributed.checkpoint`` storage backend that writes spotwise's own files.

DCP plans the save: its planner de-duplicates replicated (DDP) tensors over the ranks and keeps
each FSDP2/DTensor shard on the rank that holds it, and its metadata records the global layout,
so a checkpoint written by N ranks loads into M. This module only stores what the plan says:

- :class:`SpotwiseWriter`: each rank packs its write items as one safetensors file,
  ``dcp-<rank>.safetensors`` (:attr:`SpotwiseWriter.blob`), either referring to the live tensors
  or copied into reused staging buffers; the caller writes and fsyncs it afterwards, on the
  training thread or in the background (DCP's own ``write_data`` would have to finish before
  its last collective returns). The coordinator's ``finish`` turns DCP's ``Metadata`` into JSON
  (:attr:`SpotwiseWriter.document`) instead of pickling it as DCP's ``FileSystemWriter`` does;
  the Run stores it in ``state.json``.
- :class:`SpotwiseReader`: rebuilds ``Metadata`` from that JSON, parsed as hostile input, and
  reads each file through the checkpoint reader (no links followed, CRC32C checked). It writes
  nothing while DCP loads: every chunk is read and checked first, and the copies into the
  caller's tensors wait for :meth:`SpotwiseReader.apply`, so a failed read leaves them as they
  were without a blank copy of each to load into.

Only tensors are accepted: DCP would pickle any other value (``BYTE_IO`` items), so callers keep
non-tensor state in JSON themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from spotwise.checkpoint.format import MAX_NDIM, FileEntry
from spotwise.errors import CorruptCheckpointError, SaveError
from spotwise.runtime.commit import read_member
from spotwise.runtime.format import DTYPE_TO_ST, ST_TO_DTYPE, TensorBlob, parse_safetensors

DCP_FILE = "dcp-{rank:05d}.safetensors"


@dataclass(frozen=True)
class _Location:
    """Where one write item goes: the file and the tensor's name in it."""

    file: str
    name: str


def _chunk_name(index: MetadataIndex) -> str:
    offsets = ",".join(str(o) for o in index.offset or ())
    return f"{index.fqn}@{offsets}"


class SpotwiseWriter(StorageWriter):
    """Writes one rank's share of a DCP save into ``directory`` (see the module docstring)."""

    def __init__(
        self, directory: Path, rank: int, pack: Callable[[Mapping[str, torch.Tensor]], TensorBlob]
    ) -> None:
        super().__init__()
        self.directory = directory
        self.rank = rank
        self.pack = pack  # pack_tensors (live tensors) or a staging buffer's capture (a copy)
        self.blob: TensorBlob | None = None  # this rank's file, once write_data has run
        self.plan: SavePlan | None = None  # ... and the final plan it wrote, for reuse
        self.document: dict[str, Any] | None = None  # set by finish() on the coordinator

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.directory = Path(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        self.plan = plan
        tensors: dict[str, torch.Tensor] = {}
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                raise SaveError(
                    f"{item.index.fqn!r} is not a tensor; spotwise stores only tensors through "
                    "torch.distributed.checkpoint (anything else would be pickled)",
                    hint="keep non-tensor state in JSON-able values outside the DCP state",
                )
            tensors[_chunk_name(item.index)] = planner.resolve_data(item)  # type: ignore[assignment]
        results: list[WriteResult] = []
        if plan.items:
            file = DCP_FILE.format(rank=self.rank)
            self.blob = self.pack(tensors)
            for item in plan.items:
                size = item.tensor_storage_size() or 0
                location = _Location(file, _chunk_name(item.index))
                results.append(WriteResult(item.index, size, location))
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage = []
        for rank_results in results:
            for result in rank_results:
                location = result.storage_data
                offset = list(result.index.offset or ())
                storage.append([result.index.fqn, offset, location.file, location.name])
        tensors = {}
        for fqn, meta in metadata.state_dict_metadata.items():
            if not isinstance(meta, TensorStorageMetadata):  # write_data refused it already
                raise SaveError(f"{fqn!r} is not a tensor")
            tensors[fqn] = {
                "dtype": DTYPE_TO_ST[meta.properties.dtype],
                "size": list(meta.size),
                "chunks": [[list(c.offsets), list(c.sizes)] for c in meta.chunks],
            }
        self.document = {"tensors": tensors, "storage": storage}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True

    def storage_meta(self) -> StorageMeta | None:
        return None


class SpotwiseReader(StorageReader):
    """Reads a DCP state out of checkpoint directory ``directory``, whose ``state.json`` held
    ``document`` (the writer's JSON) and whose manifest listed ``files``. ``preread`` holds
    files already read and checked (while verifying), which are not read again. ``dcp.load``
    only checks and reads: the copies it asks for are kept (the stored bytes with them) until
    :meth:`apply` makes them, and :attr:`untiled` names the tensors whose stored chunks may
    leave part of them uncovered."""

    def __init__(
        self,
        directory: Path,
        document: Any,
        files: Mapping[str, FileEntry],
        where: str,
        preread: MutableMapping[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.directory = directory
        self.files = dict(files)
        self.preread = preread if preread is not None else {}
        self.where = where
        self.metadata, self.locations = _parse_document(document, self.files, where)
        self.untiled = {
            fqn
            for fqn, meta in self.metadata.state_dict_metadata.items()
            if isinstance(meta, TensorStorageMetadata) and not _tiles(meta)
        }
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (target, source)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_file: dict[str, list[Any]] = {}
        for item in plan.items:
            if item.type != LoadItemType.TENSOR:
                raise CorruptCheckpointError(f"{self.where} asks for a non-tensor value")
            by_file.setdefault(self.locations[item.storage_index][0], []).append(item)
        for file, items in by_file.items():
            buf = self.preread.pop(file, None)
            if buf is None:
                buf = read_member(self.directory, file, self.files[file])
            stored = parse_safetensors(buf, str(self.directory / file))
            for item in items:
                name = self.locations[item.storage_index][1]
                if name not in stored:
                    raise CorruptCheckpointError(f"{self.directory / file} lacks tensor {name!r}")
                source = narrow_tensor_by_index(stored[name], item.storage_offsets, item.lengths)
                target = planner.resolve_tensor(item).detach()
                if target.size() != source.size():
                    raise CorruptCheckpointError(
                        f"{self.directory / file}: tensor {name!r} has shape "
                        f"{tuple(source.size())}, the checkpoint's metadata says "
                        f"{tuple(target.size())}"
                    )
                if target.data_ptr() != source.data_ptr() or target.stride() != source.stride():
                    self._copies.append((target, source))  # else it is the stored shard
                planner.commit_tensor(item, target)  # a no-op in DCP's default planner
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def apply(self) -> None:
        """Copy every chunk ``dcp.load`` read into its target, in the order it read them (one
        ``copy_`` each: a target may sit on an accelerator)."""
        copies, self._copies = self._copies, []
        with torch.no_grad():
            for target, source in copies:
                target.copy_(source)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True


_INT = {int}  # exactly: a bool is no size


def _ints(value: Any, where: str) -> torch.Size:
    if (  # without a generator per list: tens of thousands of lists in a large model's metadata
        type(value) is not list
        or len(value) > MAX_NDIM
        or not set(map(type, value)) <= _INT
        or (value and min(value) < 0)
    ):
        raise CorruptCheckpointError(f"{where}: {value!r} is not a list of sizes")
    return torch.Size(value)


def _tiles(meta: TensorStorageMetadata) -> bool:
    """Whether the stored chunks of a tensor cover each element of it exactly once, as those
    of a save by DCP's planner do (slices along the first dimension, whole in the others); any
    other layout counts as not, which costs a zeroing, not a wrong answer."""
    size = list(meta.size)
    if not size:
        return len(meta.chunks) == 1
    edge = 0
    for chunk in sorted(meta.chunks, key=lambda c: c.offsets[0] if c.offsets else 0):
        if (
            len(chunk.offsets) != len(size)
            or len(chunk.sizes) != len(size)
            or chunk.offsets[0] != edge
            or any(chunk.offsets[1:])
            or list(chunk.sizes[1:]) != size[1:]
        ):
            return False
        edge += chunk.sizes[0]
    return edge == size[0]


def _parse_document(
    document: Any, files: Mapping[str, FileEntry], where: str
) -> tuple[Metadata, dict[MetadataIndex, tuple[str, str]]]:
    """DCP's Metadata and the location of every stored chunk, from the writer's JSON."""
    if not isinstance(document, dict):
        raise CorruptCheckpointError(f"{where}: the distributed state's metadata is missing")
    tensors, storage = document.get("tensors"), document.get("storage")
    if not isinstance(tensors, dict) or not isinstance(storage, list):
        raise CorruptCheckpointError(f"{where}: malformed distributed-state metadata")
    state: dict[str, Any] = {}
    for fqn, meta in tensors.items():
        code = meta.get("dtype") if isinstance(meta, dict) else None
        chunks = meta.get("chunks") if isinstance(meta, dict) else None
        if not isinstance(code, str) or code not in ST_TO_DTYPE or type(chunks) is not list:
            raise CorruptCheckpointError(f"{where}: malformed metadata of tensor {fqn!r}")
        size = _ints(meta.get("size"), f"{where}: tensor {fqn!r}")
        parsed = []
        for chunk in chunks:
            if type(chunk) is not list or len(chunk) != 2:
                raise CorruptCheckpointError(f"{where}: malformed chunk of tensor {fqn!r}")
            offsets, sizes = (_ints(c, f"{where}: tensor {fqn!r}") for c in chunk)
            parsed.append(ChunkStorageMetadata(offsets, sizes))
        properties = TensorProperties(dtype=ST_TO_DTYPE[code])
        state[fqn] = TensorStorageMetadata(properties, size, parsed)
    locations: dict[MetadataIndex, tuple[str, str]] = {}
    for row in storage:
        if (
            type(row) is not list
            or len(row) != 4
            or not isinstance(row[0], str)
            or not all(isinstance(r, str) for r in row[2:])
        ):
            raise CorruptCheckpointError(f"{where}: malformed storage entry {str(row)[:80]}")
        fqn, offset, file, name = row
        if file not in files:
            raise CorruptCheckpointError(
                f"{where}: the distributed state refers to {file!r}, which the manifest does "
                "not list (a rank's file is missing)"
            )
        locations[MetadataIndex(fqn, _ints(offset, f"{where}: {fqn!r}"))] = (file, name)
    return Metadata(state_dict_metadata=state, storage_data=locations), locations


def dcp_tensors(document: Any, where: str) -> dict[str, tuple[torch.dtype, torch.Size]]:
    """The global dtype and shape of every tensor of a distributed state, by DCP key."""
    metadata, _ = _parse_document(
        {**document, "storage": []} if isinstance(document, dict) else document, {}, where
    )
    return {
        fqn: (meta.properties.dtype, meta.size)
        for fqn, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }
