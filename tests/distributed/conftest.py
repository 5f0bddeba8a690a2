"""Helpers of the torchrun tests: start a job, signal all of its processes, collect its output,
wait for a file it writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def launch(
    nproc: int, script: str | Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``torchrun --standalone`` of ``script`` with ``nproc`` ranks, the agent in a process
    group of its own (torch elastic puts each worker in one of its own too)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv += [f"--nproc-per-node={nproc}", str(script), *args]
    env = {**os.environ, "SPOTWISE_PLATFORM": "none", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def workers(proc: subprocess.Popen[str]) -> list[int]:
    """The pids of the torchrun agent's child processes (its workers)."""
    return [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]


def signal_job(proc: subprocess.Popen[str], signum: int, pids: list[int]) -> None:
    """Send ``signum`` to each worker's process group (``pids``, from :func:`workers`), then to
    the agent's: a ``killpg`` of the agent's group alone would leave the workers running.
    Every group is tried; ProcessLookupError afterwards when one of them was gone."""
    gone = None
    for group in (*pids, proc.pid):
        try:
            os.killpg(group, signum)
        except ProcessLookupError as exc:
            gone = exc
    if gone is not None:
        raise gone


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
