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
import torch

from spotwise import CheckpointConfig, Run
from spotwise.checkpoint.remote import scan_remote
from spotwise.errors import ConfigError
from spotwise.runtime.tiered import TieredMirror
from spotwise.storage.base import Storage
from spotwise.storage.memory import MemoryStorage
from spotwise.storage.s3 import S3Storage

from .conftest import (
    HASH,
    RESUMED,
    SAVED,
    SCRIPT,
    completed,
    finish,
    launch,
    rank_pid,
    signal_job,
    workers,
)

STEPS = 100  # however late a phase acts, the job still has steps to go: no race with its end


def remote_run(uri: str, nodes: Path, *args: str) -> subprocess.Popen[str]:
    """The digits example on ``uri``, rank r staging in ``nodes/node<r>`` only."""
    local = str(nodes / "node{rank}")
    argv = ("--run-dir", uri, "--local-dir", local, "--steps", str(STEPS), "--save-every", "10")
    return launch(2, SCRIPT, *argv, *args)


def committed(store: Storage) -> list[int]:
    """The steps the remote holds as whole checkpoints (a manifest and every file it names)."""
    return [c.step for c in scan_remote(store) if c.valid]


def wait_remote(store: S3Storage, step: int, proc: subprocess.Popen[str]) -> None:
    """Until the manifest of ``step`` is up (one cheap listing per poll; the server shares
    the test's CPU with the job)."""
    deadline = time.monotonic() + 90
    while not store.list(f"step-{step:08d}/manifest.json"):
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"step {step} never committed remotely"
        time.sleep(0.1)


def wipe(nodes: Path) -> None:
    """Fresh machines: every rank's local disk empty."""
    shutil.rmtree(nodes, ignore_errors=True)
    nodes.mkdir()


@pytest.mark.e2e
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
    found = scan_remote(store)
    kept = committed(store)[-1]
    # an upload cut short (files of some ranks, no manifest) is no checkpoint
    cut = [c for c in found if not c.valid]
    assert all(c.step > kept and "no manifest" in str(c.problem) for c in cut), cut

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


def train(uri: str, local: Path, steps: int) -> Run:
    """A one-rank distributed Run on ``uri`` staging in ``local``: a model, its optimizer and
    random inputs drawn from the RNG the checkpoint carries."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    run = Run(uri, state={"model": model, "optimizer": optimizer}, steps=steps,
              checkpoint=CheckpointConfig(every=4, local_dir=local), notices=None)  # fmt: skip
    for _ in run:
        optimizer.zero_grad()
        model(torch.randn(16, 8)).pow(2).mean().backward()
        optimizer.step()
    run.extras["weights"] = [t.detach().clone() for t in model.state_dict().values()]
    return run


def test_one_rank_commits_remotely_and_resumes_from_the_store(
    tmp_path: Path, one_rank: None
) -> None:
    uri = f"memory://objstore-{uuid.uuid4().hex}"
    store = MemoryStorage.from_uri(uri)
    reference = train(f"memory://objstore-{uuid.uuid4().hex}", tmp_path / "ref", 20)
    train(uri, tmp_path / "vm1", 14)
    assert committed(store) == [8, 12, 14]  # remote retention: keep_last=3
    names = {o.key.split("/", 1)[1] for o in store.list("step-00000014/")}
    assert {"manifest.json", "dcp-00000.safetensors", "rank-00000.json", "state.json"} <= names
    assert os.listdir(tmp_path / "vm1") == ["rank-00000"]  # the rank's own staging dir ...
    left = os.listdir(tmp_path / "vm1" / "rank-00000")
    assert not [n for n in left if n.startswith((".tmp-", "step-"))]  # ... keeps no copy

    # a half-uploaded step 16 and a corrupt newest committed file: resumed from step 12
    store.put("step-00000016/dcp-00000.safetensors", b"partial")
    key = "step-00000014/dcp-00000.safetensors"
    data = bytearray(store.get(key))
    data[-1] ^= 0xFF
    store.put(key, bytes(data))
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step-00000014: .*CRC32C"):
        resumed = train(uri, tmp_path / "vm2", 20)
    assert resumed.resumed_from is not None and resumed.resumed_from.step == 12
    assert all(
        torch.equal(a, b)
        for a, b in zip(resumed.extras["weights"], reference.extras["weights"], strict=True)
    )
    assert committed(store) == [14, 16, 20]  # the partial 16 was replaced


def test_mirror_is_refused_under_torch_distributed(tmp_path: Path, one_rank: None) -> None:
    with pytest.raises(ConfigError, match=r"mirror= is not supported under torch\.distributed"):
        Run(
            tmp_path,
            state={"model": torch.nn.Linear(1, 1)},
            checkpoint=CheckpointConfig(mirror=TieredMirror(MemoryStorage())),
            notices=None,
        )
