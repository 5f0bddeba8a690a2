"""``spotwise launch examples/digits/job-gcp-ddp.yaml`` on loopback Google Cloud: DDP over 2
Spot VMs of the Compute Engine double (gloo, CPU), rank 1's VM preempted (instance/preempted,
the guest's shutdown, ``compute.instances.preempted``, deletion) once the job has saved to the
GCS double, 75 on every rank, both nodes relaunched, the resume from ``gs://``, and the weights
of a world-size-2 run never interrupted. The first launch finds no capacity for rank 1 after
rank 0 is up: rank 0 is deleted (all or nothing) and the next zone is tried."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from spotwise.control.spec import load_spec
from spotwise.emulators.gcp_compute import GcpComputeEmulator
from spotwise.emulators.gcs import GcsEmulator
from spotwise.settings import GCP_COMPUTE_ENDPOINT

from .conftest import SPOTWISE, check_two_node_job, checkpoint_steps

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-gcp-ddp.yaml"

pytestmark = pytest.mark.e2e


def test_two_node_ddp_on_gce_loses_a_node_and_ends_with_identical_weights(
    tmp_path: Path, uninterrupted
):
    spec = load_spec(JOB)
    assert (spec.nodes, spec.procs_per_node) == (2, 1)
    gcs = GcsEmulator()
    gcs.start()
    gcs.add_bucket("spotwise-digits")
    # a notice that outlasts a DDP save and both reports on a loaded runner (Compute Engine
    # gives 30 s): a rank killed mid-save leaves its peer unable to save, the attempt 'lost'
    double = GcpComputeEmulator(
        tmp_path / "gce",
        notice_lead_s=60,
        stop_grace_s=10,
        machine_env=gcs.env(),
        image=[ROOT],
    )
    # rank 1's insert in the first zone: no capacity, once
    double.fail("insert", "ZONE_RESOURCE_POOL_EXHAUSTED", 1, zone="us-central1-a", name=r"-1$")
    env = {**os.environ, GCP_COMPUTE_ENDPOINT.name: double.start(), **gcs.env()}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
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
        while not (saved := checkpoint_steps(list(gcs.buckets["spotwise-digits"]))):
            assert launch.poll() is None and time.monotonic() < deadline, "no checkpoint in GCS"
            time.sleep(0.5)
        [job_id] = saved
        [rank1] = [name for name in double.live() if name.endswith("-1")]
        double.preempt(rank1)  # rank 1's notice now; off 60 s later unless it ends first
        baseline = uninterrupted(spec)  # the same world size, never interrupted
        out, _ = launch.communicate(timeout=900)
        assert launch.returncode == 0, out

        home = tmp_path / "home"
        check_two_node_job(job_id, env, home, "gcp", "ZONE_RESOURCE_POOL_EXHAUSTED", baseline())
        # each launch after the refused one held both nodes
        inserted = [
            op.target_link.rsplit("/", 1)[-1]
            for _, op in double.operations.values()
            if op.operation_type == "insert" and not op.error.errors
        ]
        assert len(inserted) == 5, inserted  # (rank 0 rolled back) + 2 + 2
        preempted = [
            op.target_link.rsplit("/", 1)[-1]
            for _, op in double.operations.values()
            if op.operation_type == "compute.instances.preempted"
        ]
        assert preempted == [rank1]
        assert double.live() == []  # nothing left running or billed
    finally:
        double.stop()
        gcs.stop()
