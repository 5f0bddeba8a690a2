"""``spotwise launch examples/digits/job-aws.yaml`` on loopback AWS: what ``spotwise emulate
ec2`` runs (moto's EC2 + S3, a fault proxy, the data plane running each instance's user-data in
a root directory of its own) in the test's process, the controller in another, real training,
a real IMDS spot notice and kill, and the resume from S3."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotwise.cli.emulate import parse_ec2_fault

from .conftest import (
    HASH,
    SPOTWISE,
    Ec2,
    aws_client,
    cli,
    ec2_double,
    ec2_instances,
    launch_detached,
    s3_checkpoints,
)

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-aws.yaml"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ec2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ec2]:
    """The EC2 double, whose RunInstances answers InsufficientInstanceCapacity twice (the dry
    run and one launch)."""
    fault = parse_ec2_fault("RunInstances=InsufficientInstanceCapacity:2")
    with ec2_double(tmp_path_factory.mktemp("ec2"), fault) as double:
        yield double


def _ec2_client(env: dict[str, str]):
    return aws_client("ec2", env)


def _tag(resource: dict, key: str) -> str:
    return next(t["Value"] for t in resource.get("Tags", []) if t["Key"] == key)


def _volumes(env: dict[str, str], job_id: str) -> list[dict]:
    return _ec2_client(env).describe_volumes(
        Filters=[{"Name": "tag:spotwise:job", "Values": [job_id]}]
    )["Volumes"]


def test_digits_on_ec2_spot_survives_an_interruption_with_identical_weights(
    ec2: Ec2, tmp_path: Path
):
    """The first instance is reclaimed once it has saved; the next one resumes from S3 (each
    instance has its own disk, gone with it, and the controller's is not on it) and ends with
    the weights of a run never interrupted."""
    from spotwise.control.spec import load_spec
    from spotwise.control.store import Store

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
    env = {**ec2.env, "SPOTWISE_HOME": str(tmp_path / "home")}
    earlier = set(s3_checkpoints(env))  # (jobs of the tests before this one)
    launch = subprocess.Popen(
        [*SPOTWISE, "launch", str(JOB)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while not (saved := s3_checkpoints(env, earlier)):  # the first instance has saved to S3
        assert launch.poll() is None and time.monotonic() < deadline, "no checkpoint in S3"
        time.sleep(0.5)
    [(job_id, steps)] = saved.items()
    [first] = ec2_instances(env, job_id, live_only=True)
    ec2.plane.interrupt(first["InstanceId"])  # spot notice now, killed 5 s later
    out, _ = launch.communicate(timeout=600)
    assert launch.returncode == 0, out

    [job] = json.loads(cli("jobs", "--json", env=env).stdout)
    status = json.loads(cli("status", job["id"], "--json", env=env).stdout)
    reasons = [a["reason"] for a in status["attempts"]]
    assert status["state"] == "SUCCEEDED", status
    assert status["preemptions"] >= 1 and reasons[-1] == "succeeded", reasons
    assert all(a["market"] == "spot" and a["provider"] == "aws" for a in status["attempts"])
    refused = [
        e["message"]
        for e in Store(tmp_path / "home").events(job["id"])
        if e["kind"] == "launch-refused"
    ]
    assert len(refused) == 1 and "InsufficientInstanceCapacity" in refused[0]  # next placement

    logs = cli("logs", job["id"], env=env).stdout
    # the next instance resumed from what the first saved to S3: the only place it could
    resumed = [int(step) for step in re.findall(r"resumed from step (\d+)", logs)]
    assert resumed and resumed[0] > 0, logs[-3000:]
    assert resumed[0] >= min(steps)  # from S3: it saved there before it was reclaimed
    local = tmp_path / "home" / "jobs" / job["id"] / "checkpoint"
    assert not local.exists()  # nothing was written on the controller's disk
    got = HASH.findall(logs)
    out, _ = baseline.communicate(timeout=300)
    assert baseline.returncode == 0 and len(got) == 1
    assert got[0] == HASH.findall(out)[-1]

    every = ec2_instances(env, job["id"], live_only=False)
    assert len(every) == len(status["attempts"])  # one instance per attempt, no duplicates
    # (the interrupted one ends as EC2 would have it: shut down from inside after saving and
    # reporting exit 75, or killed at the deadline with the spot StateReason)
    assert all(i.get("InstanceLifecycle") == "spot" for i in every)
    assert ec2_instances(env, job["id"], live_only=True) == []
    assert _volumes(env, job["id"]) == []  # encrypted roots went with their instances


def test_controller_killed_mid_launch_then_resumed_leaves_no_orphan_or_duplicate(
    ec2: Ec2, tmp_path: Path
):
    import yaml

    doc = yaml.safe_load(JOB.read_text())  # the same provider settings, a short command
    # (the workdir is on the instances' image: this checkout)
    # (long enough that the poll below, slow on a loaded machine, finds the instance running)
    doc.update(command="python -c 'import time; time.sleep(15)'", workdir=str(JOB.parent))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    env = {**ec2.env, "SPOTWISE_HOME": str(tmp_path / "home")}
    first = launch_detached(job_file, env)
    deadline = time.time() + 180
    job_id = ""
    while not job_id:  # the job is recorded before its first launch
        assert time.time() < deadline and first.poll() is None, "the job was never recorded"
        jobs = json.loads(cli("jobs", "--json", env=env).stdout or "[]")
        job_id = jobs[0]["id"] if jobs else ""
    while not ec2_instances(env, job_id, live_only=True):
        assert time.time() < deadline and first.poll() is None, "no instance was launched"
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)  # right after RunInstances: the instance is running
    first.wait()
    [machine] = ec2_instances(env, job_id, live_only=True)

    resumed = cli("resume", job_id, "--quiet", timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    status = json.loads(cli("status", job_id, "--json", env=env).stdout)
    assert status["state"] == "SUCCEEDED"
    # the killed controller's instance was adopted as attempt 1, not launched again; each
    # attempt (a spot interruption may add one) has exactly one instance
    every = ec2_instances(env, job_id, live_only=False)
    attempt_of = {i["InstanceId"]: _tag(i, "spotwise:attempt") for i in every}
    assert attempt_of[machine["InstanceId"]] == "1"
    assert sorted(attempt_of.values()) == [str(a["n"]) for a in status["attempts"]]
    assert ec2_instances(env, job_id, live_only=True) == [] and _volumes(env, job_id) == []
