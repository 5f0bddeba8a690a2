"""No EC2 instance runs unsupervised forever: on the EC2 double, an instance of a job with
``unsupervised_limit: 3s`` runs on while its controller renews the heartbeat in S3; the
controller SIGKILLed, the command under ``spotwise run`` gets the heartbeat's notice, the
attempt reports exit 75 and the instance shuts itself down (the sim test in tests/server resumes
such a job from its checkpoint)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import boto3
import pytest
import yaml

from spotwise.control.store import Store
from spotwise.emulators.ec2 import SHUTDOWN_REASON, Ec2DataPlane

from .conftest import launch_detached, loopback_aws_env

pytestmark = pytest.mark.e2e

LIMIT_S = 3.0
# after the limit: the watchdog's check (limit/6), the command's exit, the exit report's Python
# and the shutdown; generous for a loaded runner, and far below the command's own 600 s
MARGIN_S = 90.0


def _client(service: str, env: dict[str, str]):
    return boto3.client(
        service,
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _instances(env: dict[str, str], job_id: str) -> list[dict]:
    out = _client("ec2", env).describe_instances(
        Filters=[{"Name": "tag:spotwise:job", "Values": [job_id]}]
    )
    return [i for r in out["Reservations"] for i in r["Instances"]]


def test_an_instance_without_its_controller_stops_itself(tmp_path: Path, moto_server: str):
    env = loopback_aws_env(moto_server, SPOTWISE_HOME=str(tmp_path / "home"))
    bucket = f"watch-{uuid.uuid4().hex[:12]}"
    _client("s3", env).create_bucket(Bucket=bucket)
    _client("iam", env).create_instance_profile(InstanceProfileName=bucket)
    job = {
        "name": "unsupervised",
        "command": "python -m spotwise run -- sleep 600",
        "workdir": "remote:/tmp",
        "market": "on-demand",
        "unsupervised_limit": f"{LIMIT_S:g}s",
        "provider": {
            "name": "aws",
            "region": "us-east-1",
            "zones": ["us-east-1a"],
            "image_id": "ami-03cf127a",
            "root_device": "/dev/xvda",
            "instance_profile": bucket,
            "instance_type": "g4dn.xlarge",
            "s3": f"s3://{bucket}/jobs",
            "poll_s": 0.5,
        },
    }
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    plane = Ec2DataPlane(moto_server, workdir=tmp_path / "ec2", image=[]).start()
    controller = launch_detached(job_file, env)
    try:
        _kill_the_controller(env, bucket, plane, controller)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
        plane.stop()


def _kill_the_controller(
    env: dict[str, str], bucket: str, plane: Ec2DataPlane, controller: subprocess.Popen[bytes]
) -> None:
    s3 = _client("s3", env)
    deadline = time.monotonic() + 300  # (events: as fast as the machine allows)
    while not plane.machines:  # the instance booted its user-data
        assert time.monotonic() < deadline and controller.poll() is None, "no instance"
        time.sleep(0.1)
    [machine] = plane.machines.values()
    [job] = Store(Path(env["SPOTWISE_HOME"])).jobs()
    heartbeat = f"jobs/{job.id}/checkpoint/.spotwise-heartbeat.json"
    seen: set[bytes] = set()
    while len(seen) < 2 * LIMIT_S / 0.5:  # renewals every limit/6 over twice the limit
        assert time.monotonic() < deadline, "the controller does not renew the heartbeat"
        with contextlib.suppress(s3.exceptions.NoSuchKey):
            seen.add(s3.get_object(Bucket=bucket, Key=heartbeat)["Body"].read())
        time.sleep(0.1)
    assert machine.proc.poll() is None, "a supervised instance stopped"  # after 2x the limit
    controller.send_signal(signal.SIGKILL)  # a laptop closed for good
    controller.wait()
    killed = time.monotonic()
    while machine.proc.poll() is None:
        assert time.monotonic() - killed < LIMIT_S + MARGIN_S, "the instance runs on"
        time.sleep(0.1)
    attempt = f"jobs/{job.id}/attempts/1"
    record = json.loads(s3.get_object(Bucket=bucket, Key=f"{attempt}/exit.json")["Body"].read())
    assert record["exit_code"] == 75  # stopped as on a notice: a controller relaunches it
    output = s3.get_object(Bucket=bucket, Key=f"{attempt}/output.log")["Body"].read().decode()
    assert "notice from heartbeat (unsupervised)" in output, output
    deadline = time.monotonic() + 30
    while plane.machines[machine.instance_id].ended != "exited":  # (the plane's next poll)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    [instance] = _instances(env, job.id)
    assert instance["State"]["Name"] == "terminated"
    assert instance["StateReason"]["Code"] == SHUTDOWN_REASON[1]  # from inside, not by an API
