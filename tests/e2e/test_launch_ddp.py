"""``examples/digits/job-ddp.yaml`` end to end: DDP on 2 nodes of the sim market, one node taken
away (notice on that node only), both ranks save the same step, the attempt is preempted (75
through torch's launcher on each node), the job resumes on 2 fresh nodes and ends with the same
weights as a run at world size 2 that was never interrupted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotwise.control.spec import load_spec

from .conftest import HASH, cli

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-ddp.yaml"


@pytest.mark.e2e
def test_ddp_job_on_two_sim_nodes_is_preempted_and_ends_with_identical_weights(tmp_path: Path):
    spec = load_spec(JOB)
    assert (spec.nodes, spec.procs_per_node) == (2, 1)
    argv = [
        a.replace("$SPOTWISE_CHECKPOINT_DIR", str(tmp_path / "baseline")) for a in spec.command[1:]
    ]
    argv[argv.index("--step-sleep") + 1] = "0"  # (the sleep only stretches the job in time)
    launcher = [sys.executable, "-m", "spotwise.runtime.launch", "--standalone"]
    # the same world size, never interrupted; first, so that it takes no CPU from the job's
    # start-up on a 2-core machine (the notice must find the ranks training)
    baseline = subprocess.run(
        [*launcher, "--nproc-per-node=2", "--no-python", sys.executable, *argv],
        cwd=spec.workdir,
        env={**os.environ, "SPOTWISE_PLATFORM": "none"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    launched = cli("launch", str(JOB), timeout=600)
    assert launched.returncode == 0, launched.stdout + launched.stderr

    [job] = json.loads(cli("jobs", "--json").stdout)
    status = json.loads(cli("status", job["id"], "--json").stdout)
    log = cli("logs", job["id"]).stdout
    assert status["state"] == "SUCCEEDED", log
    reasons = [a["reason"] for a in status["attempts"]]
    assert "preempted" in reasons and reasons[-1] == "succeeded", (reasons, log)
    preempted = next(a for a in status["attempts"] if a["reason"] == "preempted")
    assert preempted["exit_code"] == 75  # the ranks' 75 survived torch's launcher on both nodes
    for n in range(1, len(reasons) + 1):  # every attempt held both machines
        assert f"attempt {n} on sim spot" in log and log.count(f"attempt {n} on sim") == 2
    assert "attempt exit 75" in log
    assert HASH.findall(log)[-1] == HASH.findall(baseline.stdout)[-1]
