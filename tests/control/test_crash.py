"""A controller killed with SIGKILL at the worst moments, then restarted (``spotwise resume``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from spotwise.control.providers.process import lock_held
from spotwise.control.store import JobState, Store
from spotwise.control.submission import submit


def _controller(job_id: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from spotwise.cli.main import main; main()",
            "resume",
            job_id,
            "--quiet",
        ],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )


def _wait(pred: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.time() + timeout_s
    while not pred():
        assert time.time() < deadline, "timed out waiting"
        time.sleep(0.05)


def _machines_alive(store: Store, job_id: str) -> list[int]:
    return [
        a.n
        for a in store.attempts(job_id)
        if a.handle and lock_held(Path(a.handle["dir"]) / "lock")
    ]


def test_sigkill_during_launching(workdir: Path, kit):
    # on-demand on the sim provider, with a 3 s machine boot: LAUNCHING lasts 3 s
    spec = kit.spec(
        workdir,
        command="python standin.py 0 0.5",
        market="on-demand",
        provider={"name": "sim", "zones": ["us-east-1a"], "boot_s": 3},
    )
    store = Store()
    job = submit(store, spec)
    first = _controller(job.id)
    _wait(
        lambda: (
            store.job(job.id).state is JobState.LAUNCHING
            and bool(store.attempts(job.id))
            and store.attempts(job.id)[0].handle is not None
        )
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert _machines_alive(store, job.id) == [1]  # the machine outlives its controller
    second = _controller(job.id)
    assert second.wait(timeout=120) == 0
    job = store.job(job.id)
    attempts = store.attempts(job.id)
    assert job.state is JobState.SUCCEEDED
    assert len(attempts) == 1 and kit.runs(workdir) == 1  # adopted: no duplicate attempt
    assert attempts[0].cost_usd(time.time()) > 0  # billed from its launch, across the crash
    _wait(lambda: _machines_alive(store, job.id) == [], 10)


def test_sigkill_during_recovering(workdir: Path, kit):
    spec = kit.spec(workdir, command="python standin.py 1,0", max_restarts=1, restart_backoff="4s")
    store = Store()
    job = submit(store, spec)
    first = _controller(job.id)
    _wait(lambda: store.job(job.id).state is JobState.RECOVERING)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert [a.state for a in store.attempts(job.id)] == ["ended"]
    _wait(lambda: _machines_alive(store, job.id) == [], 10)  # its machine exits just after
    second = _controller(job.id)
    assert second.wait(timeout=120) == 0
    attempts = store.attempts(job.id)
    assert store.job(job.id).state is JobState.SUCCEEDED
    assert [a.reason for a in attempts] == ["error", "succeeded"]
    assert kit.runs(workdir) == 2
    # the backoff chosen before the crash was kept, not restarted or skipped
    assert attempts[1].started_at - attempts[0].ended_at >= 4.0 - 0.1


def test_preempted_while_the_controller_is_down(workdir: Path, kit):
    spec = kit.spec(workdir, command="python standin.py 75,0 3")
    store = Store()
    job = submit(store, spec)
    first = _controller(job.id)
    _wait(lambda: store.job(job.id).state is JobState.RUNNING)
    first.send_signal(signal.SIGKILL)
    first.wait()
    _wait(lambda: (workdir / "runs").exists() and not _machines_alive(store, job.id))
    assert os.path.exists(Path(store.attempts(job.id)[0].handle["dir"]) / "exit.json")
    second = _controller(job.id)
    assert second.wait(timeout=120) == 0
    assert [a.reason for a in store.attempts(job.id)] == ["preempted", "succeeded"]
