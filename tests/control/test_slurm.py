"""The slurm provider against a real slurmctld + slurmd on localhost (scripts/slurm-up.sh).

In CI (CI=true) a missing SLURM is a failure, never a skip.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spotwise.control.controller import Controller
from spotwise.control.store import JobState, Store
from spotwise.control.submission import submit
from spotwise.control.summary import job_summary

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "digits" / "train.py"
ARGS = ["--steps", "200", "--save-every", "10", "--step-sleep", "0.04"]
HASH = re.compile(r"final-weights-sha256: ([0-9a-f]{64})")

pytestmark = pytest.mark.slurm


def test_requeued_twice_finishes_with_the_uninterrupted_hash(slurm, tmp_path: Path, kit):
    spec = kit.spec(
        tmp_path,
        name="slurm-digits",
        provider={"name": "slurm", "signal_s": 30},
        command=["python", str(TRAIN), "--run-dir", str(tmp_path / "ckpt"), *ARGS],
    )
    # the uninterrupted run, meanwhile (it mostly overlaps SLURM's requeue delays)
    baseline = subprocess.Popen(
        [sys.executable, str(TRAIN), "--run-dir", str(tmp_path / "baseline"), *ARGS],
        stdout=subprocess.PIPE,
        text=True,
    )
    with kit.controller(spec, 300) as running:
        store, job, text = running.store, running.job, running.text
        for restarts in (0, 1):  # requeue once in the first run and once after a resume
            kit.wait(
                lambda r=restarts: (
                    text().count("resumed from step") == r
                    and re.search(r"step \d+/200", text().split("resumed from step")[-1])
                )
            )
            slurm_id = store.attempts(job.id)[-1].handle["slurm_job_id"]
            subprocess.run(["scontrol", "requeue", slurm_id], check=True, timeout=30)
            kit.wait(lambda r=restarts: len(store.attempts(job.id)) == r + 2)
    summary = job_summary(store, store.job(job.id))
    assert summary["state"] == JobState.SUCCEEDED.value, summary
    assert [a["reason"] for a in summary["attempts"]] == ["preempted", "preempted", "succeeded"]
    assert len({a["handle"]["slurm_job_id"] for a in summary["attempts"]}) == 1  # requeued
    assert text().count("resumed from step") == 2
    got = HASH.findall(text())[-1]

    out, _ = baseline.communicate(timeout=300)
    assert baseline.returncode == 0
    assert got == HASH.findall(out)[-1]


def test_exit_1_fails_without_retry_and_cancel_cleans_up(slurm, tmp_path: Path, kit):
    failing = kit.spec(
        tmp_path,
        name="slurm-fail",
        provider="slurm",
        command=["python", "-c", "import sys; sys.exit(1)"],
    )
    summary = kit.run(failing)
    assert summary["state"] == "FAILED" and [a["exit_code"] for a in summary["attempts"]] == [1]

    store = Store()
    job = submit(
        store, kit.spec(tmp_path, name="slurm-sleep", provider="slurm", command=["sleep", "300"])
    )
    thread = threading.Thread(target=lambda: Controller(Store(), job.id).run())
    thread.start()
    kit.wait(lambda: store.job(job.id).state is JobState.RUNNING)
    store.request_cancel(job.id)
    thread.join(120)
    assert store.job(job.id).state is JobState.CANCELLED
    slurm_id = store.attempts(job.id)[0].handle["slurm_job_id"]
    kit.wait(
        lambda: (
            subprocess.run(
                ["squeue", "-h", "-j", slurm_id], capture_output=True, text=True
            ).stdout.strip()
            == ""
        ),
        60,
    )
