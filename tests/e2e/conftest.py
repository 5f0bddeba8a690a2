"""What the e2e tests share: the CLI as a user runs it, the same training run, never
interrupted, to compare against, and the loopback S3 the cloud doubles' machines save to."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotwise.control.spec import JobSpec

HASH = re.compile(r"final-weights-sha256: ([0-9a-f]{64})")
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``spotwise ARGS`` in a fresh interpreter, as a user runs it, its output captured."""
    return subprocess.run(
        [*SPOTWISE, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture()
def uninterrupted(tmp_path: Path) -> Iterator[Callable[[JobSpec], Callable[[], str]]]:
    """``start(spec)`` runs the job's command locally in the background, with its own run
    directory and no interruption; calling what it returns waits and gives the final hash."""
    started: list[subprocess.Popen[str]] = []

    def start(spec: JobSpec) -> Callable[[], str]:
        run_dir = str(tmp_path / "uninterrupted")
        argv = [a.replace("$SPOTWISE_CHECKPOINT_DIR", run_dir) for a in spec.command[1:]]
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=spec.workdir,
            env={**os.environ, "SPOTWISE_PLATFORM": "none"},
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)

        def final_hash() -> str:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0
            return HASH.findall(out)[-1]

        return final_hash

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def aws_client(service: str, env: dict[str, str]) -> Any:
    """A boto3 client of the loopback AWS endpoint in ``env`` (fake credentials)."""
    import boto3

    return boto3.client(
        service,
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def s3_checkpoints(env: dict[str, str], besides: Collection[str] = ()) -> dict[str, set[int]]:
    """The steps of each job's checkpoints in S3 (``s3://spotwise-digits/jobs``, where the
    example jobs' machines save them), but for the jobs in ``besides`` (moto's state is one
    per test process: the other clouds' tests' jobs are there too)."""
    listed = aws_client("s3", env).list_objects_v2(Bucket="spotwise-digits", Prefix="jobs/")
    return checkpoint_steps((o["Key"] for o in listed.get("Contents", [])), besides)


def checkpoint_steps(keys: Iterable[str], besides: Collection[str] = ()) -> dict[str, set[int]]:
    """The steps of each job's checkpoints among a store's ``keys`` (``jobs/<id>/checkpoint/
    step-N/...``), but for the jobs in ``besides``."""
    found: dict[str, set[int]] = {}
    for key in keys:
        m = re.fullmatch(r"jobs/([^/]+)/checkpoint/step-(\d+)/.*", key)
        if m and m.group(1) not in besides:
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    return found
