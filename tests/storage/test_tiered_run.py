"""Run with a remote run_dir: local staging + background upload, resume across both tiers."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from spotwise.errors import ConfigError
from spotwise.runtime import Run
from spotwise.runtime.tiered import TieredMirror, scan_remote
from spotwise.storage.memory import MemoryStorage


def _train(run_dir: str, local: Path, steps: int, stop_after: int | None = None) -> str:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    run = Run(run_dir, model=model, optimizer=opt, steps=steps, every=5, keep_last=2,
              notices=None, local_dir=local)  # fmt: skip
    for step in run:
        x = torch.randn(8, 4)
        loss = (model(x) - torch.ones(8, 2)).pow(2).mean() + 0 * step
        opt.zero_grad()
        loss.backward()
        opt.step()
        if stop_after is not None and run.step + 1 == stop_after:
            break
    run.close()
    digest = hashlib.sha256()
    for _, tensor in sorted(model.state_dict().items()):
        digest.update(tensor.detach().numpy().tobytes())
    return digest.hexdigest()


def test_resume_on_a_new_machine_from_the_remote_tier(tmp_path: Path) -> None:
    uri = f"memory://tiered-{uuid.uuid4().hex}"
    reference = _train(f"memory://ref-{uuid.uuid4().hex}", tmp_path / "ref", 23)
    _train(uri, tmp_path / "vm1", 23, stop_after=12)
    store = MemoryStorage.from_uri(uri)
    assert [(c.step, c.valid) for c in scan_remote(store)] == [(5, True), (10, True)]
    # a new VM: nothing on its local disk; the run resumes from the remote step 10
    assert _train(uri, tmp_path / "vm2", 23) == reference
    steps = [c.step for c in scan_remote(store) if c.valid]
    assert steps == [20, 23]  # remote retention kept the newest two (keep_last=2)


def test_remote_run_dir_and_mirror_are_exclusive(tmp_path: Path) -> None:
    mirror = TieredMirror(MemoryStorage())
    with pytest.raises(ConfigError, match="either a remote run_dir or mirror="):
        Run("memory://x", model=nn.Linear(1, 1), mirror=mirror, local_dir=tmp_path, notices=None)


def test_missing_bucket_fails_at_start_with_a_hint(aws_env: str, tmp_path: Path) -> None:
    from spotwise.errors import StorageNotFoundError

    with pytest.raises(StorageNotFoundError, match="does not exist") as err:
        Run("s3://no-such-bucket-e2e/run", model=nn.Linear(1, 1), local_dir=tmp_path / "a",
            notices=None)  # fmt: skip
    assert "aws s3 mb" in str(err.value)
    # the staging directory was released: a corrected run can use it right away
    run = Run("memory://fixed", model=nn.Linear(1, 1), local_dir=tmp_path / "a", notices=None)
    run.close()
