"""On-disk format: atomic commit, checksums, fallback, retention; no pickle anywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spotwise.checkpoint.format import MANIFEST, STATE_FILE, TENSORS_FILE
from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.retention import RetentionPolicy, choose_deletions, retain
from spotwise.checkpoint.write import clean_temporaries
from spotwise.errors import CorruptCheckpointError
from spotwise.runtime.commit import (
    list_checkpoints,
    load_checkpoint,
    load_newest_valid,
    verify_checkpoint,
    write_checkpoint,
)


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(5, 3, generator=g),
        "b16": torch.randn(7, generator=g).to(torch.bfloat16),
        "half": torch.randn(3, generator=g).half(),
        "i64": torch.arange(9, dtype=torch.int64).reshape(3, 3),
        "u8": torch.arange(5, dtype=torch.uint8),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # non-contiguous
        "conj": torch.randn(4, dtype=torch.complex64, generator=g).conj(),  # a lazy conjugate
        "param": torch.nn.Parameter(torch.randn(2, generator=g)),  # requires grad
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert torch.equal(a[name], b[name]), name


def test_round_trip_every_dtype(tmp_path: Path) -> None:
    tensors = sample_tensors()
    info = write_checkpoint(tmp_path, 12, tensors, {"lr": 0.1}, metrics={"loss": 0.5})
    assert info.path == tmp_path / "step-00000012" and info.valid
    loaded = load_checkpoint(info.path)
    assert_same(tensors, loaded.tensors)
    assert loaded.state == {"lr": 0.1}
    assert loaded.info.step == 12 and loaded.info.metrics == {"loss": 0.5}
    assert sorted(os.listdir(info.path)) == sorted([MANIFEST, STATE_FILE, TENSORS_FILE])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_tensor_file_is_standard_safetensors(tmp_path: Path) -> None:
    tensors = sample_tensors()
    info = write_checkpoint(tmp_path, 1, tensors)
    loaded = load_file(info.path / TENSORS_FILE)
    assert_same({k: v.contiguous() for k, v in tensors.items()}, loaded)


def test_loaded_tensors_are_aligned_views_of_one_buffer(tmp_path: Path) -> None:
    info = write_checkpoint(tmp_path, 1, sample_tensors())
    loaded = load_checkpoint(info.path).tensors
    storages = {t.untyped_storage().data_ptr() for t in loaded.values() if t.numel()}
    assert len(storages) == 1  # one read, no per-tensor copies
    for t in loaded.values():
        assert t.data_ptr() % t.element_size() == 0


def test_manifest_records_sizes_and_crc32c(tmp_path: Path) -> None:
    info = write_checkpoint(tmp_path, 3, {"x": torch.ones(4)})
    manifest = json.loads((info.path / MANIFEST).read_text())
    assert manifest["format"] == "spotwise-checkpoint" and manifest["version"] == 2
    assert manifest["step"] == 3
    for name in (TENSORS_FILE, STATE_FILE):
        entry = manifest["files"][name]
        assert entry["size"] == (info.path / name).stat().st_size
        assert len(entry["crc32c"]) == 8


def corrupt_flip(path: Path) -> None:
    data = bytearray((path / TENSORS_FILE).read_bytes())
    data[-3] ^= 0x01
    (path / TENSORS_FILE).write_bytes(bytes(data))


def corrupt_truncate(path: Path) -> None:
    with open(path / TENSORS_FILE, "r+b") as f:
        f.truncate(f.seek(0, 2) - 10)


def corrupt_delete_manifest(path: Path) -> None:
    (path / MANIFEST).unlink()


def corrupt_delete_state(path: Path) -> None:
    (path / STATE_FILE).unlink()


def corrupt_garbage_manifest(path: Path) -> None:
    (path / MANIFEST).write_text("{not json")


CORRUPTIONS = {
    "flip": (corrupt_flip, "CRC32C"),
    "truncate": (corrupt_truncate, "truncated"),
    "no-manifest": (corrupt_delete_manifest, "never committed"),
    "no-state": (corrupt_delete_state, "missing"),
    "bad-manifest": (corrupt_garbage_manifest, "not valid JSON"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corruption_is_detected_and_newest_valid_falls_back(tmp_path: Path, kind: str) -> None:
    corrupt, words = CORRUPTIONS[kind]
    write_checkpoint(tmp_path, 10, {"x": torch.full((100,), 1.0)}, {"v": 10})
    newest = write_checkpoint(tmp_path, 20, {"x": torch.full((100,), 2.0)}, {"v": 20})
    corrupt(newest.path)
    with pytest.raises(CorruptCheckpointError, match=words):
        load_checkpoint(newest.path)
    assert not verify_checkpoint(newest.path).valid
    with pytest.warns(RuntimeWarning, match="step-00000020"):
        loaded = load_newest_valid(tmp_path)
    assert loaded is not None and loaded.info.step == 10 and loaded.state == {"v": 10}
    assert torch.equal(loaded.tensors["x"], torch.full((100,), 1.0))


def test_malicious_header_offsets_are_rejected(tmp_path: Path) -> None:
    info = write_checkpoint(tmp_path, 1, {"x": torch.ones(4)})
    path = info.path / TENSORS_FILE
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["x"]["data_offsets"] = [0, 1 << 40]
    text = json.dumps(header).encode()
    text += b" " * (n - len(text)) if len(text) <= n else b""
    evil = len(text).to_bytes(8, "little") + text + raw[8 + n :]
    path.write_bytes(evil)
    # re-sign the manifest so only the header validation can catch it
    manifest = json.loads((info.path / MANIFEST).read_text())
    import crc32c

    manifest["files"][TENSORS_FILE] = {"size": len(evil), "crc32c": f"{crc32c.crc32c(evil):08x}"}
    (info.path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match="outside the file"):
        load_checkpoint(info.path)


def test_interrupted_save_leftovers_are_invisible_and_cleaned(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 5, {"x": torch.ones(2)})
    partial = tmp_path / ".tmp-step-00000010-deadbeef"
    partial.mkdir()
    (partial / TENSORS_FILE).write_bytes(b"half")
    uncommitted = tmp_path / "step-00000010"  # a directory without manifest
    uncommitted.mkdir()
    assert [c.step for c in list_checkpoints(tmp_path) if c.valid] == [5]
    with pytest.warns(RuntimeWarning):
        assert load_newest_valid(tmp_path).info.step == 5  # type: ignore[union-attr]
    assert clean_temporaries(tmp_path) == [partial]
    # a new save of the same step replaces the invalid directory
    write_checkpoint(tmp_path, 10, {"x": torch.zeros(2)})
    assert load_newest_valid(tmp_path).info.step == 10  # type: ignore[union-attr]


def test_saving_an_existing_valid_step_keeps_it(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 7, {"x": torch.ones(2)}, {"first": True})
    write_checkpoint(tmp_path, 7, {"x": torch.ones(2)}, {"first": False})
    assert load_checkpoint(tmp_path / "step-00000007").state == {"first": True}
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000007"]


def test_no_valid_checkpoint_returns_none(tmp_path: Path) -> None:
    assert load_newest_valid(tmp_path / "missing") is None
    assert load_newest_valid(tmp_path) is None


def info(step: int, valid: bool = True, **metrics: float) -> CheckpointInfo:
    return CheckpointInfo(step, Path(f"step-{step:08d}"), valid=valid, metrics=dict(metrics))


def steps(infos: list[CheckpointInfo]) -> list[int]:
    return [i.step for i in infos]


@pytest.mark.parametrize(
    ("policy", "checkpoints", "deleted"),
    [
        (RetentionPolicy(keep_last=3), [info(s) for s in (1, 2, 3, 4, 5)], [1, 2]),
        (RetentionPolicy(keep_last=1), [info(1), info(2)], [1]),
        (RetentionPolicy(keep_last=2, keep_every=2), [info(s) for s in (1, 2, 3, 4, 5)], [1, 3]),
        (
            RetentionPolicy(keep_last=1, keep_best=1, best_metric="loss"),
            [info(1, loss=0.9), info(2, loss=0.1), info(3, loss=0.5), info(4, loss=0.7)],
            [1, 3],
        ),
        (
            RetentionPolicy(keep_last=1, keep_best=2, best_metric="acc", best_mode="max"),
            [info(1, acc=0.9), info(2, acc=0.1), info(3, acc=0.95), info(4)],
            [2],
        ),
        # invalid ones older than the newest valid go; newer invalid ones stay for inspection
        (RetentionPolicy(keep_last=1), [info(1, False), info(2), info(3, False)], [1]),
        # nothing valid: nothing is deleted
        (RetentionPolicy(keep_last=1), [info(1, False), info(2, False)], []),
    ],
)
def test_retention_decisions(
    policy: RetentionPolicy, checkpoints: list[CheckpointInfo], deleted: list[int]
) -> None:
    assert steps(choose_deletions(checkpoints, policy)) == deleted


def test_retention_never_deletes_the_newest() -> None:
    with pytest.raises(ValueError, match="newest"):
        RetentionPolicy(keep_last=0)
    policy = RetentionPolicy(keep_last=1, keep_best=1, best_metric="loss")
    cands = [info(1, loss=0.1), info(2, loss=0.9)]
    assert steps(choose_deletions(cands, policy)) == []


def test_retain_applies_on_disk(tmp_path: Path) -> None:
    for s in range(1, 6):
        write_checkpoint(tmp_path, s, {"x": torch.tensor([float(s)])})
    deleted = retain(tmp_path, RetentionPolicy(keep_last=2))
    assert steps(deleted) == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]
