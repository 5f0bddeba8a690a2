"""Progress is committed work, read from what the runtime wrote (local and s3:// run dirs)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from spotwise.control.progress import Committed, compute_s, progress_s, read_committed, step_rate
from spotwise.runtime import CheckpointConfig, Run


def _train(
    run_dir: str, steps: int, stop_after: int | None = None, local: Path | None = None
) -> None:
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Run(run_dir, state={"model": model, "optimizer": opt}, steps=steps,
              checkpoint=CheckpointConfig(every=5, local_dir=local), notices=None)  # fmt: skip
    for _ in run:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if stop_after is not None and run.step + 1 == stop_after:  # the machine goes away:
            break  # steps after the last commit are lost
    run.close()


def test_step_rate_counts_training_stretches_not_the_gaps_between_them():
    points = [
        (0.0, 0, True),
        (1.0, 10, False),
        (2.0, 20, False),  # 10 steps/s
        (50.0, 20, True),
        (54.0, 40, False),
    ]  # resumed much later: 5 steps/s
    assert step_rate(points) == pytest.approx(40 / 6)
    assert step_rate([(0.0, 0, True)]) is None  # started, nothing committed yet
    assert step_rate([]) is None


def test_progress_is_committed_work():
    assert progress_s(Committed(0, None), 100, 50.0) == 0.0
    assert progress_s(Committed(40, None), 100, 50.0) == pytest.approx(20.0)  # share of steps
    # with the rate: total minus what is left at the measured rate
    assert progress_s(Committed(40, 2.0), 100, 50.0) == pytest.approx(20.0)
    assert progress_s(Committed(40, 4.0), 100, 50.0) == pytest.approx(35.0)
    assert progress_s(Committed(40, 2.0), None, 50.0) == pytest.approx(20.0)
    assert compute_s(100, None, 4.0) == 25.0 and compute_s(100, 60.0, None) == 60.0
    assert compute_s(None, None, None) == 0.0


def test_local_run_dir_lost_work_is_lost(tmp_path: Path):
    run_dir = tmp_path / "run"
    assert read_committed(run_dir) == Committed(0, None)
    _train(str(run_dir), steps=40, stop_after=13)  # commits at 5 and 10; steps 11-13 lost
    done = read_committed(run_dir)
    assert done.step == 10 and done.step_rate is not None and done.step_rate > 0
    _train(str(run_dir), steps=40)
    assert read_committed(run_dir).step == 40


def test_s3_run_dir_through_the_storage_seam(aws_env: str, tmp_path: Path):
    import boto3

    bucket = f"spotwise-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=aws_env).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/run"
    _train(uri, steps=40, stop_after=17, local=tmp_path / "stage")
    done = read_committed(uri)
    assert done.step == 15 and done.step_rate is not None and done.step_rate > 0
