"""The controller against real local processes (stand-in scripts that exit as training does)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from spotwise.control.controller import Controller
from spotwise.control.providers import LaunchRequest, make_provider
from spotwise.control.providers.process import lock_held
from spotwise.control.store import JobState, Store
from spotwise.control.submission import submit
from spotwise.control.summary import job_summary
from spotwise.errors import BudgetError, ProviderUnavailableError


def _run_until_running(store: Store, job_id: str) -> threading.Thread:
    """A controller in a thread (with its own connection), once its job is RUNNING."""
    thread = threading.Thread(target=lambda: Controller(Store(), job_id).run())
    thread.start()
    deadline = time.time() + 60
    while store.job(job_id).state is not JobState.RUNNING:
        assert time.time() < deadline, "job never reached RUNNING"
        time.sleep(0.05)
    return thread


def test_exit_75_relaunches_until_done_and_is_not_an_error(workdir: Path, kit):
    summary = kit.run(kit.spec(workdir, command="python standin.py 75,75,75,0", max_restarts=0))
    assert summary["state"] == "SUCCEEDED"
    assert [a["reason"] for a in summary["attempts"]] == ["preempted"] * 3 + ["succeeded"]
    assert summary["errors"] == 0 and summary["preemptions"] == 3
    assert kit.runs(workdir) == 4


def test_command_failing_at_once_is_not_retried_forever(workdir: Path, kit):
    summary = kit.run(kit.spec(workdir, command="python standin.py 1 0", max_restarts=2))
    assert summary["state"] == "FAILED"
    assert kit.runs(workdir) == 3  # first try + 2 restarts
    assert "max_restarts=2" in summary["message"]
    assert [a["exit_code"] for a in summary["attempts"]] == [1, 1, 1]


def test_error_restart_then_success(workdir: Path, kit):
    summary = kit.run(kit.spec(workdir, command="python standin.py 3,0", max_restarts=1))
    assert summary["state"] == "SUCCEEDED"
    assert [a["reason"] for a in summary["attempts"]] == ["error", "succeeded"]


def test_missing_command_is_a_clear_failure(workdir: Path, kit):
    summary = kit.run(kit.spec(workdir, command="no-such-binary-xyz"))
    assert summary["state"] == "FAILED"
    log = Path(summary["log"]).read_text()
    assert "cannot start" in log and "no-such-binary-xyz" in log


def test_budget_too_small_is_refused_up_front_with_the_estimate(workdir: Path, kit):
    spec = kit.spec(
        workdir,
        provider={"name": "local", "usd_per_hour": 3.6},
        expected_runtime="1h",
        budget_usd=1.0,
    )
    with pytest.raises(BudgetError) as err:
        submit(Store(), spec)
    assert "$3.60" in str(err.value) and "$1.00" in str(err.value)
    assert Store().jobs() == []


def test_budget_stops_the_attempt_so_it_saves(workdir: Path, kit):
    # $3.60/h = 0.1 cent a second; with the local provider's 30 s of grace kept in reserve,
    # the budget allows ~3 s of running, and the job would need 60 s
    spec = kit.spec(
        workdir,
        command="python standin.py 0 60",
        budget_usd=0.033,
        provider={"name": "local", "usd_per_hour": 3.6},
    )
    summary = kit.run(spec)
    assert summary["state"] == "FAILED"
    assert "budget" in summary["message"]
    assert summary["attempts"][-1]["reason"] == "budget"
    assert summary["attempts"][-1]["exit_code"] == 75  # it saved on the notice
    assert 0.002 < summary["cost_usd"] <= 0.033
    assert "saved on notice" in Path(summary["log"]).read_text()


def test_cancel_stops_the_attempt_and_leaves_no_process(workdir: Path, kit):
    store = Store()
    job = submit(store, kit.spec(workdir, command="python standin.py 0 60"))
    thread = _run_until_running(store, job.id)
    Store().request_cancel(job.id)
    thread.join(60)
    summary = job_summary(store, store.job(job.id))
    assert summary["state"] == "CANCELLED"
    [attempt] = summary["attempts"]
    assert attempt["reason"] == "cancelled" and attempt["end"] is not None
    assert not lock_held(Path(attempt["handle"]["dir"]) / "lock")
    # the stop is the controller's, not a platform's notice, and the log says so
    log = Path(summary["log"]).read_text()
    assert "stop requested: SIGTERM" in log and "interruption notice" not in log


def test_unreachable_provider_is_refused_at_submit(workdir: Path, monkeypatch, kit):
    monkeypatch.setenv("PATH", str(workdir))  # no scontrol anywhere
    with pytest.raises(ProviderUnavailableError, match="scontrol"):
        submit(Store(), kit.spec(workdir, provider="slurm"))


def test_control_plane_errors_are_not_preemptions(workdir: Path, monkeypatch, kit):
    # SLURM's own commands, answering as they do when slurmctld goes away after submission.
    bindir = workdir / "bin"
    bindir.mkdir()
    for name, body in {
        "scontrol": "exit 0",
        "sbatch": 'echo "sbatch: error: Unable to contact slurm controller" >&2; exit 1',
        "squeue": 'echo "squeue: error: Unable to contact slurm controller" >&2; exit 1',
    }.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    summary = kit.run(kit.spec(workdir, provider="slurm", control_plane_timeout="2s"))
    assert summary["state"] == "FAILED"
    assert "unreachable" in summary["message"] and "Unable to contact" in summary["message"]
    assert summary["preemptions"] == 0 and summary["errors"] == 0


def _crash_between_launch_and_handle(store: Store, job_id: str) -> LaunchRequest:
    """What a controller killed right after starting an attempt leaves behind."""
    job = store.job(job_id)
    attempt = store.open_attempt(
        job.id,
        provider="local",
        market="on-demand",
        zone="local",
        usd_per_hour=0,
        ondemand_usd_per_hour=0,
        time_scale=1,
    )
    store.update_job(job.id, state=JobState.LAUNCHING)
    ctl = Controller(store, job.id)
    req = ctl._request(job, attempt)
    make_provider("local", {}, epoch=job.created_at).launch(req)
    return req


def test_restart_adopts_an_attempt_whose_handle_was_lost(workdir: Path, kit):
    store = Store()
    job = submit(store, kit.spec(workdir, command="python standin.py 0 1"))
    _crash_between_launch_and_handle(store, job.id)
    Controller(store, job.id).run()
    summary = job_summary(store, store.job(job.id))
    assert summary["state"] == "SUCCEEDED"
    assert len(summary["attempts"]) == 1 and kit.runs(workdir) == 1  # adopted, not relaunched
    assert any(e["kind"] == "adopt" for e in store.events(job.id))


def test_restart_launches_an_attempt_recorded_but_never_started(workdir: Path, kit):
    store = Store()
    job = submit(store, kit.spec(workdir))
    store.open_attempt(
        job.id,
        provider="local",
        market="on-demand",
        zone="local",
        usd_per_hour=0,
        ondemand_usd_per_hour=0,
        time_scale=1,
    )
    store.update_job(job.id, state=JobState.LAUNCHING)
    Controller(store, job.id).run()
    assert store.job(job.id).state is JobState.SUCCEEDED
    assert len(store.attempts(job.id)) == 1 and kit.runs(workdir) == 1


def test_one_controller_per_job(workdir: Path, kit):
    from spotwise.control.ownership import controller_lock
    from spotwise.errors import ControlError

    store = Store()
    job = submit(store, kit.spec(workdir))
    with controller_lock(job), pytest.raises(ControlError, match="already has a running"):
        Controller(store, job.id).run()


def test_a_look_at_the_lock_never_turns_a_starting_controller_away(workdir: Path, kit):
    """``status``, the dashboard and a detached launch see whether a controller drives a job by
    taking its lock for an instant; a controller starting in that instant still gets the job."""
    from spotwise.control.ownership import controller_lock, embedded_alive

    store = Store()
    job = submit(store, kit.spec(workdir))
    stop = threading.Event()

    def look() -> None:
        while not stop.is_set():
            embedded_alive(job)

    looker = threading.Thread(target=look)
    looker.start()
    try:
        for _ in range(200):
            with controller_lock(job):
                pass
    finally:
        stop.set()
        looker.join()


def test_lost_machine_is_recovered(workdir: Path, kit):
    store = Store()
    job = submit(store, kit.spec(workdir, command="python standin.py 0 2"))
    thread = _run_until_running(store, job.id)
    handle = store.attempts(job.id)[0].handle
    assert handle is not None
    os.kill(handle["pid"], signal.SIGKILL)  # the machine vanishes without a word
    thread.join(60)
    summary = job_summary(store, store.job(job.id))
    assert summary["state"] == "SUCCEEDED"
    assert [a["reason"] for a in summary["attempts"]] == ["lost", "succeeded"]
