"""The digits example trains with ``--run-dir s3://...`` against the loopback S3 server, is
SIGKILLed mid-run, resumes on a "new machine" (an empty local staging dir) from the remote
tier, and ends with exactly the weights of a run that was never interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from spotwise.checkpoint.remote import scan_remote
from spotwise.storage.s3 import S3Storage

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "digits" / "train.py"
STEPS, SAVE_EVERY = 60, 10


def train(run_dir: str, cache: Path, *, sleep: float = 0.0) -> subprocess.Popen[str]:
    env = dict(os.environ, SPOTWISE_CACHE_DIR=str(cache), SPOTWISE_PLATFORM="none")
    argv = [sys.executable, str(TRAIN), "--run-dir", run_dir, "--steps", str(STEPS)]
    argv += ["--save-every", str(SAVE_EVERY), "--step-sleep", str(sleep)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def final_sha(stdout: str) -> str:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("final-weights-sha256: "), stdout[-2000:]
    return last.split(": ", 1)[1]


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


def test_kill_and_resume_from_s3_on_a_new_machine(aws_env: str, tmp_path: Path) -> None:
    import boto3

    bucket = f"e2e-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=aws_env).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/runs/digits"
    store = S3Storage(bucket, "runs/digits")
    uninterrupted = train(str(tmp_path / "local-run"), tmp_path / "unused")  # runs alongside

    proc = train(uri, tmp_path / "vm1", sleep=0.05)
    try:
        deadline = time.monotonic() + 240
        while not any(c.valid for c in scan_remote(store)):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint reached S3 within 240 s"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    remote = scan_remote(store)
    committed = [c.step for c in remote if c.valid]
    assert committed and max(committed) < STEPS
    # whatever the kill interrupted, nothing half-uploaded may look committed
    assert all(c.valid or "never committed" in (c.problem or "") for c in remote)

    out = finish(train(uri, tmp_path / "vm2"))  # a new VM: empty local disk
    assert f"resumed from step {max(committed)}\n" in out  # the newest remote commit
    assert final_sha(out) == final_sha(finish(uninterrupted))

    assert max(c.step for c in scan_remote(store) if c.valid) == STEPS
    verify = subprocess.run(
        [sys.executable, "-c", "from spotwise.cli.main import main; main()", "ckpt", "verify", uri],
        capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "checkpoints valid" in verify.stdout
