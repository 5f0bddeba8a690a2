"""``spotwise launch examples/digits/job-azure.yaml`` on the loopback Azure Resource Manager:
what ``spotwise emulate azure-compute`` runs (the ARM double whose VMs run their custom data
in roots of their own, moto's S3) in the test's process, the controller in another driving the
official azure-mgmt clients, real training, a real Scheduled Events Preempt and eviction, and
the resume from S3."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotwise.control.spec import load_spec
from spotwise.emulators.azure_compute import AzureComputeEmulator

from .conftest import HASH, SPOTWISE, aws_client, cli, s3_checkpoints

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-azure.yaml"

pytestmark = pytest.mark.e2e


@dataclass
class Azure:
    env: dict[str, str]  # what `spotwise emulate azure-compute` says to export
    arm: AzureComputeEmulator


@pytest.fixture()
def azure(tmp_path: Path) -> Iterator[Azure]:
    """What `spotwise emulate azure-compute` runs, in this process so that the test can evict
    a VM once it has saved: moto's S3 and the ARM double, whose first VM create fails with
    ZonalAllocationFailed (the VM is left Failed, as ARM leaves it)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    aws = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    arm = AzureComputeEmulator(
        tmp_path / "azure", notice_lead_s=30, stop_grace_s=10, machine_env=aws, image=[ROOT]
    )
    arm.fail_next("ZonalAllocationFailed")
    env = {**os.environ, **aws, "SPOTWISE_AZURE_ENDPOINT_URL": arm.start()}
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(name, None)
    aws_client("s3", env).create_bucket(Bucket="spotwise-digits")
    try:
        yield Azure(env, arm)
    finally:
        arm.stop()
        server.stop()


def test_digits_on_azure_spot_survives_an_eviction_with_identical_weights(
    azure: Azure, tmp_path: Path, uninterrupted
):
    """The first VM create fails for capacity (the next placement is tried); the VM that runs
    is evicted once it has saved; the next one resumes from S3 and ends with the weights of a
    run never interrupted; no VM, disk or NIC is left."""
    from spotwise.control.store import Store

    baseline = uninterrupted(load_spec(JOB))
    env = {**azure.env, "SPOTWISE_HOME": str(tmp_path / "home")}
    earlier = set(s3_checkpoints(env))  # (jobs of the tests before this one)
    launch = subprocess.Popen(
        [*SPOTWISE, "launch", str(JOB)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while not (saved := s3_checkpoints(env, earlier)):  # the first VM has saved to S3
        assert launch.poll() is None and time.monotonic() < deadline, "no checkpoint in S3"
        time.sleep(0.5)
    [(job_id, steps)] = saved.items()
    [first] = azure.arm.created
    azure.arm.evict(first)  # Preempt now, evicted 30 s later (as Azure gives)
    out, _ = launch.communicate(timeout=600)
    assert launch.returncode == 0, out

    status = json.loads(cli("status", job_id, "--json", env=env).stdout)
    reasons = [a["reason"] for a in status["attempts"]]
    assert status["state"] == "SUCCEEDED", status
    assert status["preemptions"] >= 1 and reasons[-1] == "succeeded", reasons
    assert all(a["market"] == "spot" and a["provider"] == "azure" for a in status["attempts"])
    assert azure.arm.preempted[:1] == [first]
    refused = [
        e["message"]
        for e in Store(tmp_path / "home").events(job_id)
        if e["kind"] == "launch-refused"
    ]
    assert len(refused) == 1 and "ZonalAllocationFailed" in refused[0]  # next placement

    logs = cli("logs", job_id, env=env).stdout
    resumed = [int(step) for step in re.findall(r"resumed from step (\d+)", logs)]
    assert resumed and resumed[0] >= min(steps) > 0, logs[-3000:]
    assert not (tmp_path / "home" / "jobs" / job_id / "checkpoint").exists()
    got = HASH.findall(logs)
    assert len(got) == 1 and got[0] == baseline()

    # one VM per attempt, no duplicate; nothing left running or allocated (the VM that failed
    # to allocate included): the last VM's delete completes in the double's next ticks
    assert len(azure.arm.created) == len(status["attempts"])
    deadline = time.monotonic() + 30
    while azure.arm.live():
        assert time.monotonic() < deadline, azure.arm.live()
        time.sleep(0.2)
