"""A 2-task SLURM job (one node, two ranks through torch's launcher under srun), requeued once:
the ranks save on SLURM's SIGTERM, the job's exit is 75, the requeued run resumes and finishes.

Needs the local slurmctld (scripts/slurm-up.sh); in CI a missing SLURM is a failure, not a skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from spotwise.control.store import JobState
from spotwise.control.summary import job_summary

TOY = Path(__file__).with_name("ddp_toy.py")
pytestmark = pytest.mark.slurm


def test_two_task_job_requeued_once_saves_on_both_ranks_and_finishes(slurm, workdir: Path, kit):
    shutil.copy(TOY, workdir)
    spec = kit.spec(
        workdir,
        name="slurm-ddp",
        provider={"name": "slurm", "signal_s": 30},
        command="python ddp_toy.py 60 0.1",
        procs_per_node=2,
    )
    with kit.controller(spec, 240) as running:
        store, job, text = running.store, running.job, running.text
        kit.wait(lambda: "rank 0/2 starts at step 0" in text() and "rank 1/2 starts" in text())
        time.sleep(1.0)
        slurm_id = store.attempts(job.id)[-1].handle["slurm_job_id"]
        batch = (Path(store.job(job.id).dir) / "attempts" / "1" / "batch.sh").read_text()
        subprocess.run(["scontrol", "requeue", slurm_id], check=True, timeout=30)
        kit.wait(lambda: len(store.attempts(job.id)) == 2)
    summary = job_summary(store, store.job(job.id))
    out = text()
    assert summary["state"] == JobState.SUCCEEDED.value, out
    assert [a["reason"] for a in summary["attempts"]] == ["preempted", "succeeded"], out
    assert len({a["handle"]["slurm_job_id"] for a in summary["attempts"]}) == 1  # requeued
    # the ranks' 75 came through torch's launcher and srun (SLURM requeues by itself, so the
    # controller records no exit code for the requeued run)
    assert "task 0: Exited with exit code 75" in out, out
    assert (
        "srun --export=ALL --ntasks=1" in batch
        and "spotwise.runtime.launch --nproc-per-node=2" in batch
    )
    # the ranks share one output file, so their lines may run together
    saved = re.findall(r"rank \d/2 saved at step (\d+)", out)
    assert len(saved) == 2 and saved[0] == saved[1] and 0 < int(saved[0]) < 60, out
    assert f"rank 0/2 starts at step {saved[0]}" in out and "rank 1/2 done at step 60" in out
