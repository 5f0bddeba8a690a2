"""Two-tier checkpoints: local commit, background upload (manifest last), discovery, pull."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from spotwise.checkpoint.remote import is_remote, scan_remote
from spotwise.checkpoint.retention import RetentionPolicy
from spotwise.errors import EncryptionKeyError, NoCheckpointError, SaveError
from spotwise.runtime.commit import (
    list_checkpoints,
    load_newest_valid,
    verify_checkpoint,
    write_checkpoint,
)
from spotwise.runtime.tiered import TieredMirror, pull_newest, push, staging_dir
from spotwise.storage.crypt import EncryptedStorage
from spotwise.storage.s3 import S3Storage

from .conftest import FAST_RETRY, SMALL_TRANSFER
from .fault_proxy import Fault, FaultProxy


def _save(run_dir: Path, step: int, size: int = 1000, **metrics: float):
    torch.manual_seed(step)
    tensors = {"w": torch.randn(size), "b": torch.full((3,), float(step))}
    return write_checkpoint(run_dir, step, tensors, {"step": step}, metrics=metrics)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    loaded = load_newest_valid(path)
    assert loaded is not None
    return loaded.tensors


def _remote_steps(store) -> list[tuple[int, bool]]:
    return [(c.step, c.valid) for c in scan_remote(store)]


def test_push_scan_pull_roundtrip(make_s3, tmp_path: Path) -> None:
    store = make_s3()
    info = _save(tmp_path / "a", 100, size=2_000_000)  # 8 MB: multipart with 5 MiB parts
    push(store, info.path)
    assert _remote_steps(store) == [(100, True)]
    pulled = pull_newest(store, tmp_path / "b")
    assert pulled.name == "step-00000100"
    assert verify_checkpoint(pulled, deep=True).valid
    for name, tensor in _tensors(tmp_path / "a").items():
        assert torch.equal(tensor, _tensors(tmp_path / "b")[name])
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["step-00000100"]  # no temporaries


def test_upload_without_manifest_is_not_a_checkpoint(
    proxy: FaultProxy, bucket: str, make_s3, tmp_path: Path
) -> None:
    """The manifest PUT fails for good: the data is up, yet nobody may treat it as committed."""
    store = S3Storage(bucket, "run", endpoint_url=proxy.url, transfer=SMALL_TRANSFER,
                      retry=FAST_RETRY)  # fmt: skip
    push(store, _save(tmp_path / "a", 100).path)
    proxy.add(Fault("status", method="PUT", path_contains="step-00000200/manifest.json",
                    status=503, times=100))  # fmt: skip
    with pytest.raises(Exception, match="still failing"):
        push(store, _save(tmp_path / "a", 200).path)
    scanned = scan_remote(store)
    assert [(c.step, c.valid) for c in scanned] == [(100, True), (200, False)]
    assert "never committed" in (scanned[1].problem or "")
    assert pull_newest(store, tmp_path / "b").name == "step-00000100"


def test_corrupt_remote_objects_are_skipped(object_store, tmp_path: Path) -> None:
    store = object_store
    for step in (100, 200, 300):
        push(store, _save(tmp_path / "a", step).path)
    # step 300: a data object was cut short (size mismatch shows in the listing alone)
    data = store.get("step-00000300/tensors.safetensors")
    store.put("step-00000300/tensors.safetensors", data[:-8])
    # step 200: same size, different bytes (only the CRC32C check on pull can tell)
    store.put("step-00000200/tensors.safetensors", data[:-1] + bytes([data[-1] ^ 0xFF]))
    assert _remote_steps(store) == [(100, True), (200, True), (300, False)]
    pulled = pull_newest(store, tmp_path / "b")
    assert pulled.name == "step-00000100"
    assert list_checkpoints(tmp_path / "b")[0].valid


def test_pull_from_empty_remote_is_a_clear_error(make_s3, tmp_path: Path) -> None:
    with pytest.raises(NoCheckpointError, match="no valid checkpoint"):
        pull_newest(make_s3(), tmp_path / "b")


def test_mirror_uploads_in_background_and_retains_remotely(make_s3, tmp_path: Path) -> None:
    store = make_s3()
    mirror = TieredMirror(store, retention=RetentionPolicy(keep_last=2))
    for step in (100, 200, 300):
        mirror.committed(_save(tmp_path / "a", step), ())
        mirror.flush()
    assert _remote_steps(store) == [(200, True), (300, True)]
    assert mirror.uploaded_steps == [100, 200, 300]


def test_mirror_newer_commit_replaces_a_pending_one(make_s3, tmp_path: Path) -> None:
    store = make_s3()
    mirror = TieredMirror(store, retention=RetentionPolicy(keep_last=5))
    infos = [_save(tmp_path / "a", step) for step in (100, 200, 300, 400)]
    for info in infos:
        mirror.committed(info, ())
    mirror.flush()
    uploaded = mirror.uploaded_steps
    assert uploaded[-1] == 400 and uploaded == sorted(uploaded)
    assert _remote_steps(store)[-1] == (400, True)


def test_restore_pulls_newer_remote_and_uploads_newer_local(make_s3, tmp_path: Path) -> None:
    store = make_s3()
    for step in (100, 200):
        push(store, _save(tmp_path / "old-vm", step).path)
    fresh = tmp_path / "new-vm"
    TieredMirror(store).restore(fresh)  # a new VM: empty disk, the remote has step 200
    assert [c.step for c in list_checkpoints(fresh) if c.valid] == [200]

    _save(fresh, 300)  # committed locally, then the process died before uploading it
    mirror = TieredMirror(store)
    mirror.restore(fresh)
    mirror.flush()
    assert _remote_steps(store)[-1] == (300, True)


def test_restore_skips_a_remote_checkpoint_that_fails_verification(make_s3, tmp_path: Path) -> None:
    store = make_s3()
    for step in (100, 200):
        push(store, _save(tmp_path / "a", step).path)
    data = bytearray(store.get("step-00000200/state.json"))
    data[0] ^= 0xFF
    store.put("step-00000200/state.json", bytes(data))
    TieredMirror(store).restore(tmp_path / "b")
    assert [c.step for c in list_checkpoints(tmp_path / "b")] == [100]


def test_failed_upload_surfaces_on_flush_and_local_stays(
    proxy: FaultProxy, bucket: str, tmp_path: Path
) -> None:
    store = S3Storage(bucket, "run", endpoint_url=proxy.url, retry=FAST_RETRY)
    proxy.add(Fault("status", method="PUT", status=500, code="InternalError", times=1000))
    mirror = TieredMirror(store)
    info = _save(tmp_path / "a", 100)
    mirror.committed(info, ())
    with pytest.raises(SaveError, match=r"upload to s3://.* failed") as err:
        mirror.flush()
    assert "still failing after 4 attempts" in str(err.value)
    assert verify_checkpoint(info.path, deep=True).valid
    proxy.clear()  # the store recovers: the next commit goes through
    mirror.committed(_save(tmp_path / "a", 200), ())
    mirror.flush()
    assert _remote_steps(store)[-1] == (200, True)


def test_transient_faults_during_mirror_upload_are_retried(
    proxy: FaultProxy, bucket: str, tmp_path: Path
) -> None:
    store = S3Storage(bucket, "run", endpoint_url=proxy.url, transfer=SMALL_TRANSFER,
                      retry=FAST_RETRY)  # fmt: skip
    proxy.add(Fault("status", method="PUT", query_contains="partNumber=2", times=2))
    proxy.add(Fault("reset", method="PUT", path_contains="manifest.json"))
    proxy.add(Fault("cut_body", method="GET", path_contains="tensors.safetensors"))
    mirror = TieredMirror(store)
    mirror.committed(_save(tmp_path / "a", 100, size=3_000_000), ())
    mirror.flush()
    TieredMirror(store).restore(tmp_path / "b")
    assert verify_checkpoint(tmp_path / "b" / "step-00000100", deep=True).valid
    assert store.retries >= 4


def test_encrypted_remote(make_s3, tmp_path: Path) -> None:
    plain = make_s3()
    store = EncryptedStorage(plain, os.urandom(32), spool_dir=tmp_path / "spool")
    mirror = TieredMirror(store)
    mirror.committed(_save(tmp_path / "a", 100), ())
    mirror.flush()
    raw = plain.get("step-00000100/manifest.json")
    assert raw.startswith(b"SPOTWISE-ENCRYPTED") and b"crc32c" not in raw
    TieredMirror(store).restore(tmp_path / "b")
    assert verify_checkpoint(tmp_path / "b" / "step-00000100", deep=True).valid
    with pytest.raises(EncryptionKeyError, match="encrypted and no key is configured"):
        scan_remote(plain)


def test_staging_dir_choice(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPOTWISE_CACHE_DIR", str(tmp_path))
    a = staging_dir("s3://bucket/runs/a")
    assert a.parent == tmp_path and a.name.startswith("bucket_runs_a-")
    assert staging_dir("s3://bucket/runs/b") != a
    assert staging_dir("s3://bucket/runs/a", tmp_path / "x") == tmp_path / "x"
    assert is_remote("s3://b/p") and not is_remote("/tmp/x") and not is_remote("file:///x")
