"""spotwise.Run under real torchrun jobs (two gloo ranks on the CPU) training the digits example
with DDP and FSDP2: interrupted in each way a spot machine can go, restarted, and resharded."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load_file
from typer.testing import CliRunner

from spotwise.cli.main import app
from spotwise.runtime.commit import list_checkpoints
from spotwise.telemetry.events import read_events

from .conftest import (
    RESUMED,
    SAVED,
    completed,
    finish,
    rank_pid,
    signal_job,
    torchrun,
    wait_for,
    workers,
)

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sha256_of(state: dict[str, torch.Tensor]) -> str:
    """The example's ``final-weights-sha256``: the raw bytes of the tensors in key order."""
    digest = hashlib.sha256()
    for _, tensor in sorted(state.items()):
        digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def steps_in(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in run_dir.glob("step-*"))


def test_ddp_survives_kills_and_notices_and_a_corrupt_shard(
    tmp_path: Path, digits_reference: str
) -> None:
    run_dir = tmp_path / "run"

    # the machine lost (every process, DataLoader workers too, SIGKILLed at once), while one port
    # serves /metrics: the process of local rank 0 binds it, rank 1 (same machine) does not try
    port = free_port()
    metrics_port = {"SPOTWISE_METRICS_PORT": str(port)}
    proc = torchrun(2, run_dir, 40, "--step-sleep", "0.2", "--workers", "2", env=metrics_port)
    wait_for(run_dir / "step-00000010", proc)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    signal_job(proc, signal.SIGKILL, workers(proc))  # the machine lost: every process at once
    rc, out = finish(proc, timeout=30)
    assert rc == -signal.SIGKILL, out[-3000:]  # killed mid-run: 30 steps of 0.2 s were left
    assert families["spotwise_run_steps"].samples[0].value >= 10
    assert [e["port"] for e in read_events(run_dir / "events.jsonl", "metrics-endpoint")] == [port]
    left = list_checkpoints(run_dir, deep=True)  # what the kill left: only whole checkpoints
    assert [c.step for c in left] == [10] and left[0].valid

    # one rank's main process SIGKILLed (the OOM killer: its DataLoader workers are orphaned),
    # restarted at once: the survivor cannot finish a collective, torchrun ends the job
    proc = torchrun(2, run_dir, 40, "--step-sleep", "0.05", "--workers", "2")
    wait_for(run_dir / "step-00000020", proc)
    os.kill(rank_pid(proc, 1), signal.SIGKILL)
    killed = time.monotonic()
    rc, out = finish(proc, timeout=90)
    assert rc != 0 and time.monotonic() - killed < 60, out[-3000:]
    assert RESUMED.findall(out) == ["10", "10"], out[-3000:]
    left = list_checkpoints(run_dir, deep=True)
    assert [c.step for c in left] == [10, 20] and all(c.valid for c in left)

    # SIGTERM to rank 1 only: both ranks save the same step and exit 75 (the 10 steps left
    # after step 30's commit last 3 s: time for the agreement's two checks, however loaded)
    proc = torchrun(2, run_dir, 40, "--step-sleep", "0.3")
    wait_for(run_dir / "step-00000030", proc)
    os.kill(rank_pid(proc, 1), signal.SIGTERM)
    rc, out = finish(proc)
    saved = [int(s) for s in SAVED.findall(out)]
    assert len(saved) == 2 and saved[0] == saved[1] >= 30, out[-3000:]
    assert re.findall(r"^\s*exitcode\s+:\s*(-?\d+)", out, re.M) == ["75", "75"], out[-3000:]
    newest = steps_in(run_dir)[-1]
    assert newest == saved[0]

    # rank 1's shard of the newest checkpoint rots on disk: both ranks fall back together
    shard = run_dir / f"step-{newest:08d}" / "dcp-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    older = [s for s in steps_in(run_dir) if s < newest][-1]
    final, resumed = completed(2, run_dir, 40)
    assert resumed == [older, older]
    assert final == digits_reference


def test_fsdp2_state_reshards_between_world_sizes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    at_20, _ = completed(2, run_dir, 20, "--fsdp")
    assert {p.name for p in (run_dir / "step-00000020").glob("dcp-*")} == {
        "dcp-00000.safetensors",
        "dcp-00001.safetensors",
    }  # each rank wrote its own shards
    # 2 -> 1: the finished run read back by one rank holds exactly the weights of step 20
    again, resumed = completed(1, run_dir, 20, "--fsdp")
    assert (again, resumed) == (at_20, [20])
    # one rank trains on and saves; 1 -> 2: two ranks read back exactly its weights
    at_30, resumed = completed(1, run_dir, 30, "--fsdp")
    assert resumed == [20] and at_30 != at_20
    again, resumed = completed(2, run_dir, 30, "--fsdp")
    assert (again, resumed) == (at_30, [30, 30])

    # export: the shards of both ranks as one file that the safetensors library reads
    out = tmp_path / "model.safetensors"
    result = CliRunner().invoke(
        app, ["ckpt", "export", str(run_dir / "step-00000020"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    weights = load_file(out)
    assert set(weights) == {"0.weight", "0.bias", "3.weight", "3.bias"}
    assert sha256_of(weights) == at_20

    # a different model: the error names the tensor that does not fit
    rc, out = finish(torchrun(1, run_dir, 30, "--fsdp", "--hidden", "64"))
    assert rc != 0
    expected = "tensor 'model/0.weight' is (128, 64) torch.float32 in the checkpoint and (64, 64)"
    assert expected in out
