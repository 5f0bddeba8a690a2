"""Hugging Face Accelerate with two processes (``accelerate launch --multi_gpu``, DDP over gloo
on the CPU) under spotwise: the machine lost, a notice to one rank, and the resumed run ends
bit-identical to the uninterrupted one."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HASH, RESUMED, SAVED, finish, rank_pid, signal_job, wait_for, workers

pytestmark = pytest.mark.e2e

CHILD = Path(__file__).with_name("_accelerate_child.py")
STEPS = 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accelerate(run_dir: Path, sleep_s: float) -> subprocess.Popen[str]:
    """``accelerate launch`` of two CPU processes, the launcher in a process group of its own."""
    argv = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
    argv += ["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    argv += ["--dynamo_backend", "no", "--main_process_port", str(free_port())]
    argv += [str(CHILD), str(run_dir), str(STEPS), str(sleep_s)]
    env = {**os.environ, "SPOTWISE_PLATFORM": "none", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def test_two_processes_survive_the_machine_lost_and_a_notice_to_one_rank(tmp_path: Path) -> None:
    rc, out = finish(accelerate(tmp_path / "reference", 0.0), timeout=300)
    assert rc == 0, out[-3000:]
    reference = HASH.findall(out)
    assert len(reference) == 1, out[-3000:]  # the main process alone prints it

    # the machine lost: the launcher and both ranks (each in a session of its own) SIGKILLed
    run_dir = tmp_path / "run"
    proc = accelerate(run_dir, 0.3)
    wait_for(run_dir / "step-00000008", proc, timeout=240)
    signal_job(proc, signal.SIGKILL, workers(proc))
    rc, out = finish(proc, timeout=60)
    assert rc == -signal.SIGKILL, out[-3000:]

    # restarted at once; a notice (SIGTERM) to rank 1 alone: both ranks save the same step, 75
    proc = accelerate(run_dir, 0.3)
    wait_for(run_dir / "step-00000012", proc, timeout=240)
    os.kill(rank_pid(proc, 1), signal.SIGTERM)
    rc, out = finish(proc, timeout=240)
    assert RESUMED.findall(out) == ["8", "8"], out[-3000:]
    saved = [int(s) for s in SAVED.findall(out)]
    assert len(saved) == 2 and saved[0] == saved[1] >= 12, out[-3000:]
    assert re.findall(r"^\s*exitcode\s+:\s*(-?\d+)", out, re.M) == ["75", "75"], out[-3000:]

    # the last restart resumes from that step and ends with the uninterrupted run's weights
    rc, out = finish(accelerate(run_dir, 0.0), timeout=300)
    assert rc == 0, out[-3000:]
    assert RESUMED.findall(out) == [str(saved[0])] * 2, out[-3000:]
    assert HASH.findall(out) == reference
