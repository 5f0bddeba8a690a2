"""The server SIGKILLed in the middle of a job on the ``sim`` provider and started again: it
adopts the job by itself, which ends with the weights of a run never interrupted, on the one
attempt launched before the crash."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from spotwise.control.store import Store

from .conftest import Server, wait_until

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"
HASH = re.compile(r"final-weights-sha256: ([0-9a-f]{64})")
TRAIN = ["--steps", "100", "--save-every", "10", "--step-sleep", "0.08"]


def test_a_restarted_server_finishes_the_job_without_a_second_attempt(server, tmp_path: Path):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "za_v100_1.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 10}, "data": [1] * 2000})
    )
    job = textwrap.dedent(
        f"""
        name: digits
        command: python train.py --run-dir $SPOTWISE_CHECKPOINT_DIR {" ".join(TRAIN)}
        workdir: {DIGITS}
        market: spot
        provider:
          name: sim
          trace: {traces}
          zones: [za]
          time_compression: 10
          boot_s: 0
          spot_usd_per_hour: 1.0
          ondemand_usd_per_hour: 3.0
        env:
          PYTHONUNBUFFERED: "1"
        """
    ).encode()
    baseline = subprocess.Popen(
        [sys.executable, "train.py", "--run-dir", str(tmp_path / "baseline"), *TRAIN],
        cwd=DIGITS,
        env={**os.environ, "SPOTWISE_PLATFORM": "none"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _crash_and_restart(server, job, baseline)
    finally:
        if baseline.poll() is None:
            baseline.kill()
            baseline.wait()


def _crash_and_restart(server, job: bytes, baseline: subprocess.Popen[str]) -> None:
    first: Server = server()
    submitted = first.call("POST", "/api/v1/jobs", body=job)
    assert submitted.status == 201, submitted.body
    job_id = submitted.json()["id"]
    log = Store().job(job_id).log_path
    wait_until(lambda: log.exists() and "step 50/100" in log.read_text(), 120)
    first.kill()  # mid-training: the machine runs on, with nobody driving it

    second = server()
    wait_until(lambda: second.call("GET", f"/api/v1/jobs/{job_id}").json()["state"] == "SUCCEEDED")
    store = Store()
    attempts = store.attempts(job_id)
    assert [(a.n, a.reason) for a in attempts] == [(1, "succeeded")]  # adopted, not relaunched
    starts = [e for e in store.events(job_id) if e["kind"] == "controller"]
    assert len(starts) == 2  # driven by the first server, then by the second
    got = HASH.findall(second.call("GET", f"/api/v1/jobs/{job_id}/logs").body.decode())
    out, _ = baseline.communicate(timeout=120)
    assert baseline.returncode == 0
    assert got == HASH.findall(out)
