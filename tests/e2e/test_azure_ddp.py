"""``spotwise launch examples/digits/job-azure-ddp.yaml`` on the loopback Resource Manager: DDP
over 2 Spot VMs of the ARM double (gloo, CPU), rank 1's VM evicted (Scheduled Events Preempt,
then deleted) once the job has saved to the Azure Blob double, 75 on every rank, both nodes
relaunched, the resume from ``az://``, and the weights of a world-size-2 run never
interrupted. The first launch finds no capacity for rank 1 after rank 0 is up: rank 0 is
deleted (all or nothing) and the next zone is tried."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from spotwise.control.spec import load_spec
from spotwise.emulators.azure_blob import AzureBlobEmulator
from spotwise.emulators.azure_compute import AzureComputeEmulator
from spotwise.settings import AZURE_ENDPOINT_URL

from .conftest import SPOTWISE, check_two_node_job, checkpoint_steps

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-azure-ddp.yaml"

pytestmark = pytest.mark.e2e


def test_two_node_ddp_on_azure_loses_a_node_and_ends_with_identical_weights(
    tmp_path: Path, uninterrupted
):
    spec = load_spec(JOB)
    assert (spec.nodes, spec.procs_per_node) == (2, 1)
    blob = AzureBlobEmulator()
    blob.start()
    blob.add_bucket("spotwise-digits")
    # a notice that outlasts a DDP save and both reports on a loaded runner (Azure gives 30 s
    # at least): a rank killed mid-save leaves its peer unable to save, the attempt 'lost'
    arm = AzureComputeEmulator(
        tmp_path / "azure", notice_lead_s=60, stop_grace_s=10, machine_env=blob.env(), image=[ROOT]
    )
    # rank 1's create in the first launch: no capacity, once (the VM is left Failed, as ARM does)
    arm.fail_next("ZonalAllocationFailed", name=r"-1$")
    env = {**os.environ, **blob.env(), AZURE_ENDPOINT_URL.name: arm.start()}
    for name in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_URL"):
        env.pop(name, None)
    env["SPOTWISE_HOME"] = str(tmp_path / "home")
    try:
        launch = subprocess.Popen(
            [*SPOTWISE, "launch", str(JOB)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 600
        while not (saved := checkpoint_steps(list(blob.containers["spotwise-digits"]))):
            assert launch.poll() is None and time.monotonic() < deadline, "no checkpoint saved"
            time.sleep(0.5)
        [job_id] = saved
        [rank1] = [n[3:] for n in arm.live() if n.startswith("vm/") and n.endswith("-1")]
        arm.evict(rank1)  # rank 1's Preempt now; deleted 60 s later unless it ends first
        baseline = uninterrupted(spec)  # the same world size, never interrupted
        out, _ = launch.communicate(timeout=900)
        assert launch.returncode == 0, out

        home = tmp_path / "home"
        check_two_node_job(job_id, env, home, "azure", "ZonalAllocationFailed", baseline())
        # each launch after the refused one held both nodes
        assert len(arm.created) == 5, arm.created  # (rank 0 rolled back) + 2 + 2
        assert arm.preempted == [rank1]
        deadline = time.monotonic() + 60  # the last deletes complete in the double's ticks
        while arm.live():  # no VM, disk or NIC left
            assert time.monotonic() < deadline, arm.live()
            time.sleep(0.2)
    finally:
        arm.stop()
        blob.stop()
