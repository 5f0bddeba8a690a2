"""``spotwise launch examples/digits/job-aws-ddp.yaml`` on the EC2 double: DDP over 2 instances
(gloo, CPU), rank 1's instance reclaimed with a real IMDS notice once the job has saved to S3,
75 on every rank, both nodes relaunched, the resume from S3, and the weights of a world-size-2
run never interrupted. The first launch finds no capacity for rank 1 after rank 0 is up: rank 0
is terminated (all or nothing) and the next zone is tried."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from spotwise.control.spec import load_spec
from spotwise.emulators.fault_proxy import Fault

from .conftest import (
    SPOTWISE,
    aws_client,
    check_two_node_job,
    ec2_double,
    ec2_instances,
    s3_checkpoints,
)

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-aws-ddp.yaml"

pytestmark = pytest.mark.e2e

# RunInstances of attempt 1's rank 1 (its Name tag): no capacity, once
NO_RANK_1 = Fault(
    "status",
    method="POST",
    body_contains="-1-node-1",
    status=500,
    code="InsufficientInstanceCapacity",
    message="InsufficientInstanceCapacity (injected)",
)


def _tags(instance: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def test_two_node_ddp_on_ec2_loses_a_node_and_ends_with_identical_weights(
    tmp_path: Path, uninterrupted
):
    spec = load_spec(JOB)
    assert (spec.nodes, spec.procs_per_node) == (2, 1)
    # a notice that outlasts a DDP save and both reports on a loaded runner (30 s measured; EC2
    # gives 120 s): a rank killed mid-save leaves its peer unable to save, the attempt 'lost'
    with ec2_double(tmp_path / "ec2", NO_RANK_1, notice_lead_s=60) as ec2:
        env = {**ec2.env, "SPOTWISE_HOME": str(tmp_path / "home")}
        earlier = set(s3_checkpoints(env))  # (jobs of the other clouds' tests)
        launch = subprocess.Popen(
            [*SPOTWISE, "launch", str(JOB)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 600
        while not (saved := s3_checkpoints(env, earlier)):  # both ranks train and have saved
            assert launch.poll() is None and time.monotonic() < deadline, "no checkpoint in S3"
            time.sleep(0.5)
        [job_id] = saved
        nodes = {_tags(i)["spotwise:rank"]: i for i in ec2_instances(env, job_id, live_only=True)}
        assert sorted(nodes) == ["0", "1"]
        ec2.plane.interrupt(nodes["1"]["InstanceId"])  # rank 1's spot notice now
        baseline = uninterrupted(spec)  # the same world size, never interrupted
        out, _ = launch.communicate(timeout=900)
        assert launch.returncode == 0, out

        home = tmp_path / "home"
        check_two_node_job(job_id, env, home, "aws", "InsufficientInstanceCapacity", baseline())
        # each attempt held both nodes in the job's placement group
        every = ec2_instances(env, job_id, live_only=False)
        by_attempt: dict[str, list[dict]] = {}
        for i in every:
            by_attempt.setdefault(_tags(i)["spotwise:attempt"], []).append(i)
        assert sorted(len(v) for v in by_attempt.values()) == [2, 3]  # (1 + 2 in attempt 1)
        for i in every:
            zone = i["Placement"]["AvailabilityZone"]
            assert i["Placement"]["GroupName"] == f"spotwise-{job_id}-{zone}"
            assert _tags(i)["spotwise:nodes"] == "2"
            assert f"spotwise-{job_id}" in {g["GroupName"] for g in i["SecurityGroups"]}
        assert ec2_instances(env, job_id, live_only=True) == []
        # the job's placement and security groups went with it
        ec2_api = aws_client("ec2", env)
        by_job = [{"Name": "tag:spotwise:job", "Values": [job_id]}]
        assert ec2_api.describe_placement_groups(Filters=by_job)["PlacementGroups"] == []
        assert ec2_api.describe_security_groups(Filters=by_job)["SecurityGroups"] == []
