"""A step uploaded again (saved again after a fallback) never overwrites the files a standing
remote manifest lists: a crash between its data files and its manifest leaves no such step,
never one that fails its CRCs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotwise.checkpoint.remote import scan_remote
from spotwise.runtime.commit import write_checkpoint
from spotwise.runtime.tiered import pull_newest, push
from spotwise.storage.s3 import S3Storage

from .conftest import FAST_RETRY, SMALL_TRANSFER
from .fault_proxy import Fault, FaultProxy


def _save(run_dir: Path, step: int, seed: int):
    torch.manual_seed(seed)  # same shapes for every seed: the sizes match, the bytes do not
    return write_checkpoint(run_dir, step, {"w": torch.randn(1000)}, {"seed": seed})


def test_a_crash_in_a_resaved_upload_leaves_no_checkpoint_failing_its_crcs(
    proxy: FaultProxy, bucket: str, tmp_path: Path
) -> None:
    store = S3Storage(bucket, "run", endpoint_url=proxy.url, transfer=SMALL_TRANSFER,
                      retry=FAST_RETRY)  # fmt: skip
    push(store, _save(tmp_path / "a", 100, seed=0).path)
    push(store, _save(tmp_path / "a", 200, seed=1).path)  # the standing step 200
    # step 200 again, other bytes: its tensors go up, then the process dies (state.json fails)
    proxy.add(Fault("status", method="PUT", path_contains="step-00000200/state.json",
                    status=503, times=100))  # fmt: skip
    with pytest.raises(Exception, match="still failing"):
        push(store, _save(tmp_path / "b", 200, seed=2).path)
    assert [(c.step, c.valid) for c in scan_remote(store)] == [(100, True), (200, False)]
    assert pull_newest(store, tmp_path / "c").name == "step-00000100"
