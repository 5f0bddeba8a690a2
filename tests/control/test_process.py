"""Machine processes (local/sim providers): liveness by lock, outcome by exit file."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from spotwise.control.providers.base import LaunchRequest, Phase, Placement
from spotwise.control.providers.process import ProcessMachines, lock_held


def _req(tmp_path: Path, code: str) -> LaunchRequest:
    return LaunchRequest(
        job_id="j",
        n=1,
        argv=(sys.executable, "-c", code),
        workdir=tmp_path,
        env=dict(os.environ),
        log_path=tmp_path / "log",
        attempt_dir=tmp_path / "attempts" / "1",
        placement=Placement("on-demand"),
    )


def _wait_end(m: ProcessMachines, handle, timeout_s: float = 60):
    deadline = time.time() + timeout_s
    while True:
        status = m.status(handle)
        if status.phase in (Phase.EXITED, Phase.LOST):
            return status
        assert time.time() < deadline
        time.sleep(0.05)


def test_terminate_right_after_launch_still_stops_it(tmp_path: Path):
    m = ProcessMachines(settle_s=5.0)  # (single-node attempts: nothing settles)
    req = _req(tmp_path, "import time; time.sleep(120)")
    handle = m.launch(req)
    m.terminate(handle)  # before the machine has even written machine.json
    _wait_end(m, handle, 60)
    assert not lock_held(req.attempt_dir / "lock")


def test_find_and_exit_code_without_being_the_parent(tmp_path: Path):
    m = ProcessMachines(settle_s=5.0)  # (single-node attempts: nothing settles)
    req = _req(tmp_path, "import sys, time; time.sleep(0.5); sys.exit(75)")
    assert m.find(tmp_path / "attempts") == []
    handle = m.launch(req)
    found = m.find(tmp_path / "attempts")
    assert [(h["n"], h["pid"]) for h in found] == [(1, handle["pid"])]
    status = _wait_end(m, handle)
    assert (status.phase, status.exit_code) == (Phase.EXITED, 75)
    assert status.ended_at is not None and status.running_at is not None
