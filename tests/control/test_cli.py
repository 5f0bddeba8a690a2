"""The job commands as a user runs them (a real ``spotwise`` process per command)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwise.control.ownership import controller_alive, controller_lock
from spotwise.control.store import Store
from spotwise.control.submission import submit

from .conftest import make_spec

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOTWISE, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_launch_status_jobs_logs_cancel(workdir: Path):
    job_file = workdir / "job.yaml"
    job_file.write_text("name: cli\ncommand: python standin.py 75,0\nprovider: local\n")
    launched = _cli("launch", str(job_file))
    assert launched.returncode == 0, launched.stderr
    assert "SUCCEEDED" in launched.stdout and "1 preempted" in launched.stdout

    [row] = json.loads(_cli("jobs", "--json").stdout)
    status = json.loads(_cli("status", row["id"][:6], "--json").stdout)
    assert status["id"] == row["id"] and status["state"] == "SUCCEEDED"
    assert status["command"] == "python standin.py 75,0"
    first, second = status["attempts"]
    assert first["reason"] == "preempted" and second["reason"] == "succeeded"
    for a in status["attempts"]:
        assert {"start", "end", "reason", "market", "zone", "cost_usd"} <= set(a)
        assert a["end"] >= a["start"]
    assert status["cost_usd"] == 0.0

    logs = _cli("logs", row["id"]).stdout
    assert logs.count("final-weights-sha256: standin") == 2
    assert "attempt 2 on local" in logs
    assert "already SUCCEEDED" in _cli("cancel", row["id"]).stdout
    table = _cli("jobs").stdout
    assert row["id"][:6] in table and "SUCCEE" in table


def test_detach_then_cancel(workdir: Path):
    job_file = workdir / "job.yaml"
    job_file.write_text("name: bg\ncommand: python standin.py 0 120\n")
    detached = _cli("launch", "--detach", str(job_file))
    assert detached.returncode == 0, detached.stderr
    job_id = detached.stdout.strip()
    assert controller_alive(Store().job(job_id))  # returned once its controller held the job
    cancelled = _cli("cancel", job_id)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout
    status = json.loads(_cli("status", job_id, "--json").stdout)
    assert status["state"] == "CANCELLED"
    assert all(a["end"] is not None for a in status["attempts"])


def test_cancel_waits_for_the_controller_that_holds_the_job_and_drives_it_once_that_one_is_gone(
    workdir: Path,
):
    """A cancel that finds another controller on the job (one starting as it looks) waits for
    that one instead of failing on its lock, and ends the job itself if that one goes away."""
    store = Store()
    job = submit(store, make_spec(workdir, command="python standin.py 0 120"))
    with controller_lock(job):  # (this test stands in for that other controller)
        cancel = subprocess.Popen([*SPOTWISE, "cancel", job.id], stdout=subprocess.PIPE, text=True)
        while not store.job(job.id).cancel_requested:
            assert cancel.poll() is None, "cancel returned before it asked for the cancel"
            time.sleep(0.05)
        assert cancel.poll() is None  # waiting for the lock's holder, not failing on it
    out, _ = cancel.communicate(timeout=120)
    assert cancel.returncode == 0 and f"job {job.id} CANCELLED" in out
    assert store.job(job.id).state.value == "CANCELLED"


def test_bad_job_file_is_one_clear_error(tmp_path: Path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("command: train\nmarket: cheapest\n")
    out = _cli("launch", str(job_file))
    assert out.returncode == 2
    assert out.stderr.startswith("error:")
    assert "market" in out.stderr and "spot, on-demand, auto" in out.stderr
    assert "Traceback" not in out.stderr
    missing = _cli("status", "nope")
    assert missing.returncode == 2 and "spotwise jobs" in missing.stderr


@pytest.mark.parametrize(
    ("lines", "needles"),
    [
        (
            ["deadline: 2020-01-01T00:00:00Z"],
            ["deadline: 2020-01-01T00:00:00Z is in the past", "(now: 20"],
        ),
        (
            ["policy: uniform-progres"],
            ["policy: unknown policy 'uniform-progres'", "did you mean uniform-progress?"],
        ),
        (
            ["policy: greedyy", "provider: {name: sim, time_compression: 600}"],
            ["policy: unknown policy 'greedyy'", "did you mean greedy?"],
        ),
        (["workdir: nowhere"], ["workdir: ", "nowhere does not exist"]),
    ],
    ids=["past-deadline", "policy-local", "policy-sim", "workdir"],
)
def test_launch_refuses_bad_input_before_recording_a_job(workdir: Path, lines, needles):
    job_file = workdir / "job.yaml"
    job_file.write_text("\n".join(["command: python standin.py 0", *lines]) + "\n")
    out = _cli("launch", str(job_file))
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("error:") and "Traceback" not in out.stderr
    for needle in needles:
        assert needle in out.stderr
    assert "deadline_s" not in out.stderr and "PosixPath" not in out.stderr
    assert Store().jobs() == []  # nothing was recorded
    assert not (workdir / "runs").exists()  # and nothing ran


def test_a_job_recorded_with_a_field_now_refused_is_named_not_a_traceback(workdir: Path):
    """A store written by an older spotwise can hold a job whose file breaks a rule added since
    (here a non-finite duration): resuming it names the job, the field and the way out."""
    from spotwise.control.spec import load_spec

    job_file = workdir / "job.yaml"
    job_file.write_text("name: old\ncommand: python standin.py 0\nprovider: local\n")
    stored = load_spec(job_file).model_dump(mode="json")
    stored["restart_backoff_s"] = float("nan")
    job = Store().create_job("old", stored, str(job_file))
    resumed = _cli("resume", job.id, "--quiet")
    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert f"job {job.id} was recorded with a job file this spotwise no longer accepts" in (
        resumed.stderr
    )
    assert "restart_backoff_s" in resumed.stderr and f"spotwise cancel {job.id}" in resumed.stderr
    cancelled = _cli("cancel", job.id)  # what the hint says: nothing ran, so nothing to stop
    assert cancelled.returncode == 0 and f"job {job.id} CANCELLED" in cancelled.stdout
