"""Machine processes (local/sim providers): liveness by lock, outcome by exit file."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

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


def _attempt_processes(attempt_dir: Path) -> list[int]:
    """Processes whose command line names the attempt (the machine and its timers)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(attempt_dir).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_a_stop_the_command_ignores_takes_the_machine_away_after_the_grace(tmp_path: Path):
    """SIGTERM ignored: the machine is taken away once the grace has passed, and nothing of it
    (its timer included) is left running."""
    m = ProcessMachines(settle_s=5.0)
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); open('ignoring', 'w').close()"
    req = _req(tmp_path, f"import signal, time; {ignore}; time.sleep(120)")
    req = LaunchRequest(**{**req.__dict__, "grace_s": 1.0})
    handle = m.launch(req, notice_at=time.time() + 600, lost_at=time.time() + 1200)
    deadline = time.time() + 60
    while not (tmp_path / "ignoring").exists():  # (its interpreter may start slowly)
        assert time.time() < deadline
        time.sleep(0.05)
    m.terminate(handle)
    status = _wait_end(m, handle)
    assert (status.phase, status.detail, status.exit_code) == (Phase.LOST, "terminated", None)
    log = req.log_path.read_text()
    assert "stop requested: SIGTERM" in log and "machine taken away: SIGKILL" in log
    assert "interruption notice" not in log
    assert _attempt_processes(req.attempt_dir) == []


@pytest.mark.parametrize("slow", ["date", "awk"])
def test_a_stop_while_the_machine_sets_its_timers_still_gives_the_grace(tmp_path: Path, slow: str):
    """A stop that lands after the command started, while the machine sets up its schedule's
    timer: a loaded host, here a ``date`` or ``awk`` on the machine's PATH that takes 2 s until
    the stop is sent. The command notes SIGTERM and carries on, so it ends by the grace's
    SIGKILL, and no sooner. The machine used to replace the stop's timer with its schedule's
    (with ``date``: the command ran to its end), or to take the stop's figures for its own
    (``awk``: killed at once)."""
    shims, slowly = tmp_path / "bin", tmp_path / "slowly"
    shims.mkdir()
    slowly.touch()
    shim = shims / slow
    shim.write_text(f'#!/bin/sh\n[ -e {slowly} ] && sleep 2\nexec {shutil.which(slow)} "$@"\n')
    shim.chmod(0o755)
    m = ProcessMachines(settle_s=5.0)
    note = "lambda *_: open('termed', 'w').write(repr(time.time()))"
    ignore = f"signal.signal(signal.SIGTERM, {note}); open('ignoring', 'w').close()"
    req = _req(tmp_path, f"import signal, time; {ignore}; time.sleep(120)")
    env = {**req.env, "PATH": f"{shims}:{req.env['PATH']}"}
    req = LaunchRequest(**{**req.__dict__, "grace_s": 1.0, "env": env})
    handle = m.launch(req)
    deadline = time.time() + 60
    while not (tmp_path / "ignoring").exists():
        assert time.time() < deadline
        time.sleep(0.01)
    m.terminate(handle)  # the machine is in its slow command: the trap runs after it
    slowly.unlink()
    status = _wait_end(m, handle, 30)
    assert status.ended_at - float((tmp_path / "termed").read_text()) >= req.grace_s
    assert (status.phase, status.detail, status.exit_code) == (Phase.LOST, "terminated", None)
    log = req.log_path.read_text()
    assert "stop requested: SIGTERM" in log and "machine taken away: SIGKILL" in log
    assert _attempt_processes(req.attempt_dir) == []


IGNORING_LAUNCHER = """
import json, os, signal, sys, time
from pathlib import Path

for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, signal.SIG_IGN)  # as a controller started with them ignored would have

from spotwise.control.providers.base import LaunchRequest, Phase, Placement
from spotwise.control.providers.process import ProcessMachines
from spotwise.proctree import children, proc_state

tmp, m = Path(sys.argv[1]), ProcessMachines(settle_s=5.0)


def req(name):
    sleep = (sys.executable, "-c", "import time; time.sleep(120)")
    return LaunchRequest(job_id="j", n=1, argv=sleep, workdir=tmp, env=dict(os.environ),
                         log_path=tmp / f"{name}.log", attempt_dir=tmp / name / "1",
                         placement=Placement("on-demand"))


def end(handle):
    started = time.monotonic()
    while time.monotonic() < started + 25:
        if m.status(handle).phase in (Phase.EXITED, Phase.LOST):
            return round(time.monotonic() - started, 1)
        time.sleep(0.05)
    return None


out = {}
stopped = m.launch(req("at-once"))
m.terminate(stopped)  # before the machine is even up
out["terminated at once"] = end(stopped)
running = m.launch(req("running"))
while m.status(running).phase is not Phase.RUNNING:
    time.sleep(0.05)
m.terminate(running)
out["terminated running"] = end(running)
out["taken away"] = end(m.launch(req("lost"), lost_at=time.time() + 1.0))
out["zombies"] = [p for p in children(os.getpid()) if (proc_state(p) or ("",))[0] == "Z"]
print(json.dumps(out))
"""


def test_a_launcher_that_ignores_the_machines_signals_still_stops_and_loses_it(tmp_path: Path):
    """A shell cannot trap a signal ignored when it started, so a controller that ignores
    SIGTERM (or USR1, USR2) must not pass that on: its machines ignored terminate and ran their
    command to the end. Ended machines are also collected, none left a zombie."""
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", IGNORING_LAUNCHER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out.pop("zombies") == []
    assert all(took is not None and took < 10 for took in out.values()), out
    assert "stop requested: SIGTERM" in (tmp_path / "running.log").read_text()
    assert "machine taken away: SIGKILL" in (tmp_path / "lost.log").read_text()
