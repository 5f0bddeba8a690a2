"""Format version 2: a large state is spread over several tensor files, written by one writer
each; the manifest lists every file with its CRC, the one reader checks each of them, and a
version 1 checkpoint (one tensor file) still loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import crc32c
import pytest
import torch
from safetensors.torch import load_file, save_file

from spotwise.checkpoint.format import MANIFEST, STATE_FILE, TENSORS_FILE
from spotwise.errors import CorruptCheckpointError
from spotwise.runtime.commit import load_checkpoint, verify_checkpoint, write_checkpoint
from spotwise.runtime.snapshot import SnapshotBuffer

MiB = 1 << 20
PART_1 = "tensors-1.safetensors"


def manifest_of(path: Path) -> dict:
    return json.loads((path / MANIFEST).read_text())


def edit_manifest(path: Path, version: int, *signed: str) -> None:
    """Set the manifest's version and (re)sign files ``signed`` with their current bytes."""
    manifest = manifest_of(path)
    manifest["version"] = version
    for name in signed:
        data = (path / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
    (path / MANIFEST).write_text(json.dumps(manifest))


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for name, tensor in a.items():
        assert b[name].dtype == tensor.dtype and torch.equal(b[name], tensor), name


def test_large_state_is_spread_over_listed_files_each_checked(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {f"layer{i}.weight": torch.rand(4 * MiB, generator=g) for i in range(17)}  # 272 MiB
    tensors["step"] = torch.tensor(7, dtype=torch.int64)
    info = write_checkpoint(tmp_path, 1, tensors, {"k": 1})
    manifest = manifest_of(info.path)
    assert manifest["version"] == 2
    parts = [TENSORS_FILE, PART_1]  # 272 MiB: two files of at least 128 MiB
    assert sorted(os.listdir(info.path)) == sorted([MANIFEST, STATE_FILE, *parts])
    seen: dict[str, torch.Tensor] = {}
    for name in parts:
        data = (info.path / name).read_bytes()
        crc = f"{crc32c.crc32c(data):08x}"
        header = data[: 8 + int.from_bytes(data[:8], "little")]  # each file's record of it
        assert manifest["files"][name] == {
            "size": len(data),
            "crc32c": crc,
            "header_crc32c": f"{crc32c.crc32c(header):08x}",
        }
        assert len(data) >= 128 * MiB  # dealt out evenly (9 and 8 tensors + 1 small one)
        part = load_file(info.path / name)  # each is a standard safetensors file
        assert not set(part) & set(seen)
        seen.update(part)
    assert_same(tensors, seen)
    loaded = load_checkpoint(info.path)
    assert_same(tensors, loaded.tensors)
    assert loaded.state == {"k": 1}

    # Run's async path hands over one flat snapshot buffer: the same files, byte for byte
    again = write_checkpoint(tmp_path, 2, SnapshotBuffer().capture(tensors), {"k": 1})
    for name in parts:
        assert (again.path / name).read_bytes() == (info.path / name).read_bytes(), name

    # a flipped byte, then a missing file, in the second tensor file: one verdict, as for the first
    with open(info.path / PART_1, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        byte = f.read(1)[0]
        f.seek(-5, os.SEEK_END)
        f.write(bytes([byte ^ 1]))
    verdict = verify_checkpoint(info.path)
    assert not verdict.valid and f"{PART_1} fails its CRC32C check" in str(verdict.problem)
    os.unlink(info.path / PART_1)
    assert f"{PART_1} is missing" in str(verify_checkpoint(info.path).problem)


def test_further_tensor_files_by_version(tmp_path: Path) -> None:
    info = write_checkpoint(tmp_path, 1, {"x": torch.ones(4)})  # small: one file, as in version 1
    assert sorted(os.listdir(info.path)) == sorted([MANIFEST, STATE_FILE, TENSORS_FILE])
    save_file({"y": torch.arange(3)}, str(info.path / PART_1))
    edit_manifest(info.path, 2, PART_1)
    assert set(load_checkpoint(info.path).tensors) == {"x", "y"}

    # version 1 had one tensor file: a further listed file is only checked, never read as tensors
    edit_manifest(info.path, 1)
    loaded = load_checkpoint(info.path)
    assert set(loaded.tensors) == {"x"} and torch.equal(loaded.tensors["x"], torch.ones(4))

    save_file({"x": torch.zeros(4)}, str(info.path / PART_1))  # the same tensor in two files
    edit_manifest(info.path, 2, PART_1)
    with pytest.raises(CorruptCheckpointError, match="tensor 'x' is in two files"):
        load_checkpoint(info.path)
    assert not verify_checkpoint(info.path).valid
