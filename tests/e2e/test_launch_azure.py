"""``spotwise launch examples/digits/job-azure.yaml`` on the loopback Azure Resource Manager:
what ``spotwise emulate azure-compute`` runs (the ARM double whose VMs run their custom data
in roots of their own, the Azure Blob double for the job's ``az://`` store) in the test's
process, the controller in another driving the official azure-mgmt and azure-storage-blob
clients, real training, a real Scheduled Events Preempt and eviction, and the resume from Blob
Storage."""

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
from spotwise.emulators.azure_blob import AzureBlobEmulator
from spotwise.emulators.azure_compute import AzureComputeEmulator
from spotwise.settings import AZURE_ENDPOINT_URL

from .conftest import HASH, SPOTWISE, checkpoint_steps, cli, launch_detached

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-azure.yaml"

pytestmark = pytest.mark.e2e


@dataclass
class Azure:
    env: dict[str, str]  # what `spotwise emulate azure-compute` says to export
    arm: AzureComputeEmulator
    blob: AzureBlobEmulator

    def checkpoints(self) -> dict[str, set[int]]:
        """The steps each job has saved in az://spotwise-digits/jobs."""
        return checkpoint_steps(list(self.blob.containers["spotwise-digits"]))


@pytest.fixture()
def azure(tmp_path: Path) -> Iterator[Azure]:
    """What `spotwise emulate azure-compute` runs, in this process so that the test can evict
    a VM once it has saved: the Azure Blob double the job's az:// store is on (its development
    account in the VMs' environment, as their managed identity would reach it) and the ARM
    double."""
    blob = AzureBlobEmulator()
    blob.start()
    blob.add_bucket("spotwise-digits")
    arm = AzureComputeEmulator(
        tmp_path / "azure", notice_lead_s=30, stop_grace_s=10, machine_env=blob.env(), image=[ROOT]
    )
    env = {**os.environ, **blob.env(), AZURE_ENDPOINT_URL.name: arm.start()}
    for name in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_URL"):
        env.pop(name, None)
    try:
        yield Azure(env, arm, blob)
    finally:
        arm.stop()
        blob.stop()


def test_digits_on_azure_spot_survives_an_eviction_with_identical_weights(
    azure: Azure, tmp_path: Path, uninterrupted
):
    """The first VM create fails for capacity (the next placement is tried); the VM that runs
    is evicted once it has saved; the next one resumes from Blob Storage and ends with the
    weights of a run never interrupted; no VM, disk or NIC is left."""
    from spotwise.control.store import Store

    azure.arm.fail_next("ZonalAllocationFailed")  # the VM is left Failed, as ARM leaves it
    baseline = uninterrupted(load_spec(JOB))
    env = {**azure.env, "SPOTWISE_HOME": str(tmp_path / "home")}
    launch = subprocess.Popen(
        [*SPOTWISE, "launch", str(JOB)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while not (saved := azure.checkpoints()):  # the first VM has saved to Blob Storage
        assert launch.poll() is None and time.monotonic() < deadline, "no checkpoint saved"
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


def test_controller_killed_mid_launch_then_resumed_leaves_no_orphan_or_duplicate(
    azure: Azure, tmp_path: Path
):
    """SIGKILL the controller right after its VM exists; `spotwise resume` adopts that VM as
    attempt 1 (its name is the attempt's: a second create would be the same VM) and the job
    ends with one VM per attempt, its custom data free of the store's key, and none left."""
    import signal

    import yaml

    doc = yaml.safe_load(JOB.read_text())  # the same provider settings, a short command
    doc.update(command="python -c 'import time; time.sleep(10)'", workdir=str(JOB.parent))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    env = {**azure.env, "SPOTWISE_HOME": str(tmp_path / "home")}
    first = launch_detached(job_file, env)
    deadline = time.monotonic() + 180
    while not azure.arm.created:
        assert time.monotonic() < deadline and first.poll() is None, "no VM was created"
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)  # the VM runs; its controller is gone
    first.wait()
    [machine] = azure.arm.created
    custom = (azure.arm.workdir / machine / "custom-data").read_text()  # as cloud-init got it
    assert "AccountKey" not in custom and azure.blob.account_url in custom  # URL, not key
    [job] = json.loads(cli("jobs", "--json", env=env).stdout)

    resumed = cli("resume", job["id"], "--quiet", timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    status = json.loads(cli("status", job["id"], "--json", env=env).stdout)
    assert status["state"] == "SUCCEEDED", status
    assert azure.arm.created[0] == machine  # attempt 1 is the killed controller's VM, adopted
    assert len(azure.arm.created) == len(set(azure.arm.created)) == len(status["attempts"])
    deadline = time.monotonic() + 30
    while azure.arm.live():  # its delete completes in the double's next ticks
        assert time.monotonic() < deadline, azure.arm.live()
        time.sleep(0.2)
