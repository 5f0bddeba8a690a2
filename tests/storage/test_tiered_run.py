"""Run with a remote run_dir: local staging + background upload, resume across both tiers."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from spotwise.checkpoint.remote import scan_remote
from spotwise.errors import ConfigError
from spotwise.runtime import CheckpointConfig, Run
from spotwise.runtime.tiered import TieredMirror
from spotwise.storage.memory import MemoryStorage
from spotwise.storage.s3 import S3Storage


def _train(run_dir: str, local: Path, steps: int, stop_after: int | None = None) -> str:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    run = Run(
        run_dir,
        state={"model": model, "optimizer": opt},
        steps=steps,
        checkpoint=CheckpointConfig(every=5, keep_last=2, local_dir=local),
        notices=None,
    )
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


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_resume_on_a_new_machine_from_a_gcs_or_azure_run_dir(
    scheme: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """What job-gcp.yaml / job-azure.yaml rely on: Run saves to gs:// (az://) through the
    official client and the loopback double, and a VM with an empty disk resumes from there."""
    from spotwise.storage import open_storage

    bucket = request.getfixturevalue("gcs_bucket" if scheme == "gs" else "azure_container")
    uri = f"{scheme}://{bucket}/runs/tiny"
    reference = _train(f"memory://ref-{uuid.uuid4().hex}", tmp_path / "ref", 23)
    _train(uri, tmp_path / "vm1", 23, stop_after=12)
    store = open_storage(uri)
    # a commit made while the previous one is still uploading may be replaced by the next one
    # (the mirror uploads the newest), so which older steps reached the store depends on timing
    assert [c.step for c in scan_remote(store) if c.valid][-1] == 10
    assert _train(uri, tmp_path / "vm2", 23) == reference
    kept = [c.step for c in scan_remote(store)]
    assert kept[-1] == 23 and len(kept) <= 2  # remote retention (keep_last=2)


def test_remote_run_dir_and_mirror_are_exclusive(tmp_path: Path) -> None:
    mirror = TieredMirror(MemoryStorage())
    with pytest.raises(ConfigError, match="either a remote run_dir or mirror="):
        Run(
            "memory://x",
            state={"model": nn.Linear(1, 1)},
            checkpoint=CheckpointConfig(mirror=mirror, local_dir=tmp_path),
            notices=None,
        )


def test_missing_bucket_fails_at_start_with_a_hint(aws_env: str, tmp_path: Path) -> None:
    from spotwise.errors import StorageNotFoundError

    with pytest.raises(StorageNotFoundError, match="does not exist") as err:
        Run(
            "s3://no-such-bucket-e2e/run",
            state={"model": nn.Linear(1, 1)},
            checkpoint=CheckpointConfig(local_dir=tmp_path / "a"),
            notices=None,
        )
    assert "aws s3 mb" in str(err.value)
    # the staging directory was released: a corrected run can use it right away
    run = Run(
        "memory://fixed",
        state={"model": nn.Linear(1, 1)},
        checkpoint=CheckpointConfig(local_dir=tmp_path / "a"),
        notices=None,
    )
    run.close()


class _TerminateAt:
    """A NoticeSource that reports a terminate notice from the n-th step boundary on."""

    def __init__(self, at_call: int) -> None:
        from spotwise.notices.base import Notice, NoticeKind

        self.at_call, self.calls, self.acknowledged = at_call, 0, False
        self.notice = Notice("fake", NoticeKind.TERMINATE, 1.0, None, "terminate")

    def current(self):
        self.calls += 1
        return self.notice if self.calls >= self.at_call else None

    def acknowledge(self, notice) -> None:
        self.acknowledged = True

    def close(self) -> None:
        return None


def test_notice_with_the_store_down_still_exits_75_with_a_local_checkpoint(
    aws_env: str, bucket: str, proxy, monkeypatch, tmp_path: Path
) -> None:
    """The emergency save commits locally; the failed upload is logged, not raised, so the
    process still says "interrupted, state saved" and nothing partial is visible remotely."""
    from spotwise.runtime.commit import list_checkpoints

    from .fault_proxy import Fault

    proxy.add(Fault("status", method="PUT", status=503, code="SlowDown", times=10_000))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    notices = _TerminateAt(3)
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    run = Run(
        f"s3://{bucket}/run",
        state={"model": model},
        steps=10,
        checkpoint=CheckpointConfig(every=None, local_dir=tmp_path / "vm"),
        notices=notices,
    )
    with pytest.raises(SystemExit) as exited:
        for _ in run:
            pass
    assert exited.value.code == 75 and notices.acknowledged
    assert [c.step for c in list_checkpoints(tmp_path / "vm") if c.valid] == [3]
    store = S3Storage(bucket, "run", endpoint_url=aws_env)
    assert not any(c.valid for c in scan_remote(store))


def test_aws_max_attempts_is_honoured(monkeypatch) -> None:
    from spotwise.storage.s3 import RetryPolicy

    assert RetryPolicy.from_env({"AWS_MAX_ATTEMPTS": "3"}).max_attempts == 3
    assert RetryPolicy.from_env({}).max_attempts == RetryPolicy().max_attempts
    with pytest.raises(ConfigError, match="AWS_MAX_ATTEMPTS"):
        RetryPolicy.from_env({"AWS_MAX_ATTEMPTS": "zero"})
