"""``spotwise launch examples/digits/job-aws.yaml`` on loopback AWS: ``spotwise emulate ec2``
(moto's EC2 + S3 with the data-plane emulator running each instance's user-data) in one
process, the controller in another, real training, a real IMDS spot notice and kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import HASH, SPOTWISE, cli

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-aws.yaml"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ec2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The emulator as a user starts it; yields the environment it says to export."""
    home = tmp_path_factory.mktemp("ec2")
    # the first instance gets a spot notice 12 s after it starts, and is killed 5 s later;
    # RunInstances answers InsufficientInstanceCapacity twice (the dry run and one launch)
    proc = subprocess.Popen(
        [
            *SPOTWISE,
            "emulate",
            "ec2",
            "--port",
            "0",
            "--bucket",
            "spotwise-digits",
            "--interrupt-after",
            "12",
            "--notice-lead",
            "5",
            "--stop-grace",
            "10",
            "--fault",
            "RunInstances=InsufficientInstanceCapacity:2",
            "--workdir",
            str(home),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    env = {**os.environ}
    assert "ec2 emulator listening on http://127.0.0.1:" in proc.stdout.readline()
    for _ in range(5):
        name, _, value = proc.stdout.readline().strip().removeprefix("export ").partition("=")
        env[name] = value
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(name, None)
    import boto3

    boto3.client(
        "iam",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_instance_profile(InstanceProfileName="spotwise-digits")
    try:
        yield env
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def _ec2_client(env: dict[str, str]):
    import boto3

    return boto3.client(
        "ec2",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _instances(env: dict[str, str], job_id: str, live_only: bool) -> list[dict]:
    filters = [{"Name": "tag:spotwise:job", "Values": [job_id]}]
    if live_only:
        filters.append(
            {
                "Name": "instance-state-name",
                "Values": ["pending", "running", "shutting-down", "stopping"],
            }
        )
    out = _ec2_client(env).describe_instances(Filters=filters)
    return [i for r in out["Reservations"] for i in r["Instances"]]


def _tag(resource: dict, key: str) -> str:
    return next(t["Value"] for t in resource.get("Tags", []) if t["Key"] == key)


def _volumes(env: dict[str, str], job_id: str) -> list[dict]:
    return _ec2_client(env).describe_volumes(
        Filters=[{"Name": "tag:spotwise:job", "Values": [job_id]}]
    )["Volumes"]


def test_digits_on_ec2_spot_survives_an_interruption_with_identical_weights(
    ec2: dict[str, str], tmp_path: Path
):
    from spotwise.control.spec import load_spec

    spec = load_spec(JOB)
    argv = [
        a.replace("$SPOTWISE_CHECKPOINT_DIR", str(tmp_path / "baseline")) for a in spec.command[1:]
    ]
    baseline = subprocess.Popen(
        [sys.executable, *argv],
        cwd=spec.workdir,
        env={**os.environ, "SPOTWISE_PLATFORM": "none"},
        stdout=subprocess.PIPE,
        text=True,
    )
    env = {**ec2, "SPOTWISE_HOME": str(tmp_path / "home")}
    launched = cli("launch", str(JOB), timeout=600, env=env)
    assert launched.returncode == 0, launched.stdout + launched.stderr

    [job] = json.loads(cli("jobs", "--json", env=env).stdout)
    status = json.loads(cli("status", job["id"], "--json", env=env).stdout)
    reasons = [a["reason"] for a in status["attempts"]]
    assert status["state"] == "SUCCEEDED", status
    assert status["preemptions"] >= 1 and reasons[-1] == "succeeded", reasons
    assert all(a["market"] == "spot" and a["provider"] == "aws" for a in status["attempts"])
    from spotwise.control.store import Store

    refused = [
        e["message"]
        for e in Store(tmp_path / "home").events(job["id"])
        if e["kind"] == "launch-refused"
    ]
    assert len(refused) == 1 and "InsufficientInstanceCapacity" in refused[0]  # next placement

    logs = cli("logs", job["id"], env=env).stdout
    assert "resumed from step" in logs
    got = HASH.findall(logs)
    out, _ = baseline.communicate(timeout=300)
    assert baseline.returncode == 0 and len(got) == 1
    assert got[0] == HASH.findall(out)[-1]

    every = _instances(env, job["id"], live_only=False)
    assert len(every) == len(status["attempts"])  # one instance per attempt, no duplicates
    # (the interrupted one ends as EC2 would have it: shut down from inside after saving and
    # reporting exit 75, or killed at the deadline with the spot StateReason)
    assert all(i.get("InstanceLifecycle") == "spot" for i in every)
    assert _instances(env, job["id"], live_only=True) == []
    assert _volumes(env, job["id"]) == []  # encrypted roots went with their instances


def test_controller_killed_mid_launch_then_resumed_leaves_no_orphan_or_duplicate(
    ec2: dict[str, str], tmp_path: Path
):
    import yaml

    doc = yaml.safe_load(JOB.read_text())  # the same provider settings, a short command
    doc.update(command="python -c 'import time; time.sleep(3)'", workdir=str(tmp_path))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    env = {**ec2, "SPOTWISE_HOME": str(tmp_path / "home")}
    first = subprocess.Popen(
        [*SPOTWISE, "launch", str(job_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    job_id = ""
    while not job_id or not _instances(env, job_id, live_only=True):
        assert time.time() < deadline and first.poll() is None, "no instance was launched"
        jobs = json.loads(cli("jobs", "--json", env=env).stdout or "[]")
        job_id = jobs[0]["id"] if jobs else ""
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)  # right after RunInstances: the instance is running
    first.wait()
    [machine] = _instances(env, job_id, live_only=True)

    resumed = cli("resume", job_id, "--quiet", timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    status = json.loads(cli("status", job_id, "--json", env=env).stdout)
    assert status["state"] == "SUCCEEDED"
    # the killed controller's instance was adopted as attempt 1, not launched again; each
    # attempt (a spot interruption may add one) has exactly one instance
    every = _instances(env, job_id, live_only=False)
    attempt_of = {i["InstanceId"]: _tag(i, "spotwise:attempt") for i in every}
    assert attempt_of[machine["InstanceId"]] == "1"
    assert sorted(attempt_of.values()) == [str(a["n"]) for a in status["attempts"]]
    assert _instances(env, job_id, live_only=True) == [] and _volumes(env, job_id) == []
