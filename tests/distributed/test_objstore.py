"""A two-rank torchrun job whose ranks share no directory: the run dir is an S3 prefix on the
loopback moto server, each rank stages in a local directory of its own, and the object store
carries the checkpoints. Killed (the machines lost, then a notice), resumed on "fresh machines"
(the local directories wiped), and given a corrupt remote shard: the final weights are those
of an uninterrupted run."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import boto3
import pytest

from spotwise.runtime.tiered import scan_remote
from spotwise.storage.s3 import S3Storage

from .conftest import finish, launch, signal_job, workers
from .test_torchrun import HASH, RESUMED, SAVED, SCRIPT, completed, rank_pid

pytestmark = pytest.mark.e2e
STEPS = 40


def remote_run(uri: str, nodes: Path, *args: str) -> subprocess.Popen[str]:
    """The digits example on ``uri``, rank r staging in ``nodes/node<r>`` only."""
    local = str(nodes / "node{rank}")
    argv = ("--run-dir", uri, "--local-dir", local, "--steps", str(STEPS), "--save-every", "10")
    return launch(2, SCRIPT, *argv, *args)


def committed(store: S3Storage) -> list[int]:
    """The steps the remote holds as whole checkpoints (a manifest and every file it names)."""
    return [c.step for c in scan_remote(store) if c.valid]


def wait_remote(store: S3Storage, step: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    while step not in committed(store):
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"step {step} never committed remotely"
        time.sleep(0.05)


def wipe(nodes: Path) -> None:
    """Fresh machines: every rank's local disk empty."""
    shutil.rmtree(nodes, ignore_errors=True)
    nodes.mkdir()


def test_ranks_without_a_shared_directory_checkpoint_through_the_object_store(
    aws_env: str, tmp_path: Path
) -> None:
    bucket = f"dist-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=aws_env).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/ddp"
    store = S3Storage.from_uri(uri)
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    reference, _ = completed(2, tmp_path / "reference", STEPS)

    # the machines lost: every process SIGKILLed at once, while uploads may be in flight
    proc = remote_run(uri, nodes, "--step-sleep", "0.2")
    wait_remote(store, 10, proc)
    assert sorted(p.name for p in nodes.iterdir()) == ["node0", "node1"]
    assert [p.name for p in (nodes / "node1").iterdir()] == ["rank-00001"]  # rank 1's alone
    signal_job(proc, signal.SIGKILL, workers(proc))
    rc, out = finish(proc, timeout=30)
    assert rc == -signal.SIGKILL, out[-3000:]
    assert committed(store)[-1] >= 10  # an upload cut short is no checkpoint
    kept = committed(store)[-1]

    # fresh machines; SIGTERM to rank 1: both ranks save the same step, upload it, exit 75
    wipe(nodes)
    proc = remote_run(uri, nodes, "--step-sleep", "0.05")
    wait_remote(store, kept + 10, proc)
    os.kill(rank_pid(proc, 1), signal.SIGTERM)
    rc, out = finish(proc)
    assert RESUMED.findall(out) == [str(kept), str(kept)], out[-3000:]
    saved = [int(s) for s in SAVED.findall(out)]
    assert len(saved) == 2 and saved[0] == saved[1], out[-3000:]
    assert re.findall(r"^\s*exitcode\s+:\s*(-?\d+)", out, re.M) == ["75", "75"], out[-3000:]
    newest = committed(store)[-1]
    assert newest == saved[0]  # uploaded and committed before the exit
    assert not any((nodes / "node1" / "rank-00001").glob(".tmp-step-*"))  # local copies gone

    # rank 1's shard of the newest remote checkpoint rots: both ranks fall back together
    key = f"ddp/step-{newest:08d}/dcp-00001.safetensors"
    s3 = boto3.client("s3", endpoint_url=aws_env)
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[-3] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))  # same size: only the CRC tells
    older = [s for s in committed(store) if s < newest][-1]
    wipe(nodes)
    rc, out = finish(remote_run(uri, nodes))
    assert rc == 0, out[-3000:]
    assert RESUMED.findall(out) == [str(older), str(older)], out[-3000:]
    assert HASH.findall(out) == [reference]
    assert committed(store)[-1] == STEPS
    assert len(committed(store)) <= 3  # remote retention: keep_last=3
