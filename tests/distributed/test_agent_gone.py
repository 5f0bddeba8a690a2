"""torchrun's agent killed, its ranks not: torch elastic starts each rank in a session of its own,
so ``kill -9 -PGID`` of the agent's group leaves the ranks running. They take the agent's end as
a notice (save together, exit 75) or, when they cannot agree any more (a peer rank died too, a
collective hangs), end within the notice grace; a supervisor's immediate restart waits for the
run directory a previous generation still holds (bounded, naming its PID) instead of failing."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from spotwise import Run
from spotwise.errors import CheckpointError

from .conftest import HASH, RESUMED, SAVED, finish, torchrun, wait_for

pytestmark = pytest.mark.e2e


def test_ranks_of_a_killed_agent_save_and_an_immediate_restart_finishes(
    tmp_path: Path, digits_reference: str
) -> None:
    run_dir = tmp_path / "run"
    # the agent's process group SIGKILLed (the ranks are in sessions of their own): both ranks
    # save the same step and exit 75 instead of training on to the end
    first = torchrun(2, run_dir, 40, "--step-sleep", "0.2")
    wait_for(run_dir / "step-00000010", first)
    os.killpg(first.pid, signal.SIGKILL)
    killed = time.monotonic()
    # restarted at once (under spotwise's launcher), it may find rank 0 still holding the run
    restart = torchrun(2, run_dir, 40, launcher="spotwise.runtime.launch")
    rc, out = finish(first, timeout=60)  # the pipe closes once both orphaned ranks are gone
    assert rc == -signal.SIGKILL
    saved = SAVED.findall(out)
    assert len(saved) == 2 and saved[0] == saved[1], out[-3000:]
    assert "agent notice" in out and not HASH.findall(out), out[-3000:]
    assert time.monotonic() - killed < 30, out[-3000:]  # the notice grace

    rc, out = finish(restart)
    assert rc == 0, out[-3000:]
    assert RESUMED.findall(out) == saved and HASH.findall(out) == [digits_reference]


# a rank's stand-in: the agent watch a Run starts in a torchrun rank, and then a collective that
# never completes (a peer that hangs)
RANK = """
import threading
from spotwise.runtime.distributed.agent import watch_agent
watch_agent(None)
print("watching", flush=True)
threading.Event().wait(60)  # bounded: a failed test leaves nothing behind for long
"""
# an agent's stand-in: starts the rank in a session of its own, as torch elastic does
AGENT = """
import signal, subprocess, sys
subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
signal.pause()
"""


def test_a_rank_that_cannot_agree_ends_within_the_grace_of_its_agent() -> None:
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "test", "SPOTWISE_GRACE_S": "1"}
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, RANK],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert agent.stdout is not None
    try:
        assert agent.stdout.readline() == "watching\n"
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
    killed = time.monotonic()
    out, _ = agent.communicate(timeout=30)  # EOF: the rank is gone too
    assert 1 <= time.monotonic() - killed < 1 + 10, out
    assert "is gone; this rank saves with the others and exits 75, within 1 s" in out
    assert "did not end within 1 s of its agent's end" in out
    assert "exiting with code 75" in out


# --- the run directory held by another process: waited for, up to the grace -----------------
HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``tmp_path``'s run directory lock until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


class ReleaseWhenWaiting(logging.Handler):
    """Ends the holder the moment the Run says that it waits for it."""

    def __init__(self, holder: subprocess.Popen[str]) -> None:
        super().__init__(logging.WARNING)
        self.holder = holder
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        assert self.holder.stdin is not None
        self.holder.stdin.close()


def test_a_restart_waits_for_the_process_still_holding_the_run(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    waiting = ReleaseWhenWaiting(holder)
    logger = logging.getLogger("spotwise.runtime.dirlock")
    logger.addHandler(waiting)
    try:
        run = Run(tmp_path, state={"model": torch.nn.Linear(2, 1)}, notices=None)
    finally:
        logger.removeHandler(waiting)
    run.close()
    assert len(waiting.messages) == 1
    assert f"another process (PID {holder.pid}) holds {tmp_path}" in waiting.messages[0]
    assert "waiting up to 30 s" in waiting.messages[0]


def test_the_wait_is_bounded_by_the_grace(
    tmp_path: Path, holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOTWISE_GRACE_S", "0.5")
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=rf"another process \(PID {holder.pid}\) is using"):
        Run(tmp_path, state={"model": torch.nn.Linear(2, 1)}, notices=None)
    assert time.monotonic() - started >= 0.5
