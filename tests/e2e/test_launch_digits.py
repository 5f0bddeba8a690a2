"""The README's main job, end to end: ``spotwise launch examples/digits/job.yaml`` on the sim
provider, with real training, real notices and machine losses, and the same final weights as a
run that was never interrupted."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotwise.control.spec import load_spec

from .conftest import HASH, cli

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job.yaml"


@pytest.mark.e2e
def test_readme_main_job_survives_preemptions_with_identical_weights(tmp_path: Path):
    spec = load_spec(JOB)
    argv = [
        a.replace("$SPOTWISE_CHECKPOINT_DIR", str(tmp_path / "baseline")) for a in spec.command[1:]
    ]
    env = {**os.environ, "SPOTWISE_PLATFORM": "none"}
    baseline = subprocess.Popen(
        [sys.executable, *argv], cwd=spec.workdir, env=env, stdout=subprocess.PIPE, text=True
    )

    launched = cli("launch", str(JOB), timeout=600)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "on-demand" in launched.stdout and "saved $" in launched.stdout

    [job] = json.loads(cli("jobs", "--json").stdout)
    status = json.loads(cli("status", job["id"], "--json").stdout)
    assert status["state"] == "SUCCEEDED"
    reasons = [a["reason"] for a in status["attempts"]]
    assert reasons[-1] == "succeeded"
    assert status["preemptions"] >= 2, reasons
    assert all(r in ("preempted", "lost", "succeeded") for r in reasons)
    assert all(a["market"] == "spot" for a in status["attempts"])
    # a relaunch within the zone cooldown goes elsewhere than the zone just lost
    cooldown = spec.zone_cooldown_s
    for lost, nxt in itertools.pairwise(status["attempts"]):
        if nxt["start"] - lost["end"] < cooldown:
            assert nxt["zone"] != lost["zone"]
    assert 0 < status["cost_usd"] < status["ondemand_cost_usd"]
    assert status["cost_usd"] == pytest.approx(sum(a["cost_usd"] for a in status["attempts"]))

    logs = cli("logs", job["id"]).stdout
    assert "resumed from step" in logs
    got = HASH.findall(logs)
    assert len(got) == 1

    out, _ = baseline.communicate(timeout=300)
    assert baseline.returncode == 0
    assert got[0] == HASH.findall(out)[-1]
    # launch itself ends by showing the job's last output line: the hash
    assert f"last output line: final-weights-sha256: {got[0]}" in launched.stdout
