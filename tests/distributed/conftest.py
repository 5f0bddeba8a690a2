"""Helpers of the torchrun tests: start a job (the digits example or another script), find and
signal its processes, collect its output and what it printed, wait for a file it writes; and a
one-rank process group in the test's own process."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "digits" / "train.py"
HASH = re.compile(r"final-weights-sha256: ([0-9a-f]{64})")
RESUMED = re.compile(r"resumed from step (\d+)")
# the ranks share one pipe: their lines may run together
SAVED = re.compile(r"saved step (\d+) in \S+; exiting with code 75")
# every process of a job inherits this variable from its agent: found by it, one left behind by
# a killed parent (and holding the job's output) can still be ended when the test gives up
JOB_MARKER = "TEST_JOB_UNDER_TEST"
_MARKS: dict[int, bytes] = {}  # the agent's pid -> its job's JOB_MARKER=value entry


def launch(
    nproc: int,
    script: str | Path,
    *args: str,
    env: dict[str, str] | None = None,
    launcher: str = "torch.distributed.run",
) -> subprocess.Popen[str]:
    """``torchrun --standalone`` of ``script`` with ``nproc`` ranks, the agent in a process
    group of its own (torch elastic puts each worker in one of its own too); ``launcher`` may
    be ``spotwise.runtime.launch`` (same arguments, exit 75 kept)."""
    argv = [sys.executable, "-m", launcher, "--standalone"]
    argv += [f"--nproc-per-node={nproc}", str(script), *args]
    env = {**os.environ, "SPOTWISE_PLATFORM": "none", "OMP_NUM_THREADS": "1", **(env or {})}
    env[JOB_MARKER] = uuid.uuid4().hex
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _MARKS[proc.pid] = f"{JOB_MARKER}={env[JOB_MARKER]}".encode()
    return proc


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


def wait_stopped(pids: list[int], timeout: float = 30) -> None:
    """Wait until every thread of the processes ``pids`` has stopped (SIGSTOP) or ended.
    kill() returns before the stop takes effect: a thread stops only when it next leaves the
    kernel, so a file it is creating at that moment appears after kill() has returned."""
    deadline = time.monotonic() + timeout
    while True:
        running = []
        for pid in pids:
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):  # gone meanwhile
                    continue
                if state not in "TtZX":
                    running.append(f"{pid}/{task.name} ({state})")
        if not running:
            return
        assert time.monotonic() < deadline, f"still running after SIGSTOP: {running}"
        time.sleep(0.001)


def job_processes(proc: subprocess.Popen[str]) -> list[int]:
    """Every living process of a job from :func:`launch`, orphans included (by its marker)."""
    marker = _MARKS.get(proc.pid)
    if marker is None:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    """The job's exit status and output, once every process that holds its output has ended;
    past ``timeout`` the agent's group and every process of the job are SIGKILLed, and the
    test fails."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in job_processes(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        raise
    return proc.returncode, out


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def torchrun(
    nproc: int,
    run_dir: Path,
    steps: int,
    *args: str,
    env: dict[str, str] | None = None,
    launcher: str = "torch.distributed.run",
) -> subprocess.Popen[str]:
    """``torchrun --standalone`` of the digits example, in its own process group."""
    args = ("--run-dir", str(run_dir), "--steps", str(steps), "--save-every", "10", *args)
    return launch(nproc, SCRIPT, *args, env=env, launcher=launcher)


def completed(nproc: int, run_dir: Path, steps: int, *args: str) -> tuple[str, list[int]]:
    """The final hash of a torchrun that must succeed, and the steps its ranks resumed from."""
    rc, out = finish(torchrun(nproc, run_dir, steps, *args))
    assert rc == 0, out[-3000:]
    hashes = HASH.findall(out)
    assert len(hashes) == 1, out[-3000:]  # rank 0 alone prints it
    return hashes[0], [int(s) for s in RESUMED.findall(out)]


@pytest.fixture(scope="session")
def digits_reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final hash of an uninterrupted 40-step digits run on two ranks (run once)."""
    return completed(2, tmp_path_factory.mktemp("reference"), 40)[0]


def rank_pid(proc: subprocess.Popen[str], rank: int, timeout: float = 60) -> int:
    """The pid of torchrun worker ``rank`` (a child of the agent with RANK=rank)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in workers(proc):
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return int(child)
        time.sleep(0.05)
    raise AssertionError(f"no worker of rank {rank}")


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A real one-rank gloo process group in this process (torch.distributed without torchrun)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
