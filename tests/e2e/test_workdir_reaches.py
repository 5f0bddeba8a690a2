"""``workdir: pack:PATH``: the code of a job launched from another directory reaches its
machine on every provider and runs there, with what the ignore files leave out left out.

On ``aws`` (the EC2 double) and ``kubernetes`` (the loopback cluster) every machine has a root
of its own (``emulators/machine_root.py``) holding this Python and spotwise but not the job's
folder: the code can only have come through the archive in S3."""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import yaml

from spotwise.control.store import JobState, Store
from spotwise.emulators import machine_root

from .conftest import SPOTWISE, loopback_aws_env

pytestmark = pytest.mark.e2e

MAIN = """\
import os
print("cwd:", os.getcwd())
print("files:", ",".join(sorted(n for n in os.listdir(".") if not n.startswith(".spotwise"))))
print("data:", open("data/values.txt").read().strip())
"""
PACKED = "data,main.py"  # (.gitignore and .spotwiseignore start with a dot: listed apart)


def _project(root: Path) -> Path:
    code = root / "project"
    (code / "data").mkdir(parents=True)
    (code / "main.py").write_text(MAIN)
    (code / "data" / "values.txt").write_text("42 from the laptop\n")
    (code / "notes.log").write_text("left out by .gitignore\n")
    (code / "secret.env").write_text("left out by .spotwiseignore\n")
    (code / ".gitignore").write_text("*.log\n")
    (code / ".spotwiseignore").write_text("secret.env\n.gitignore\n.spotwiseignore\n")
    return code


def _launch(tmp_path: Path, doc: dict, env: dict[str, str]) -> tuple[str, str]:
    """``spotwise launch`` of a job file in jobs/ whose workdir is ../project, run from a
    third directory; the job's id and its log."""
    _project(tmp_path)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "job.yaml").write_text(
        yaml.safe_dump({"command": "python main.py", "workdir": "pack:../project", **doc})
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [*SPOTWISE, "launch", "../jobs/job.yaml"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    store = Store(Path(env["SPOTWISE_HOME"]))
    [job] = store.jobs()
    store.close()
    assert job.state is JobState.SUCCEEDED, job.message
    return job.id, (store.home / "jobs" / job.id / "job.log").read_text()


def _ran_the_project(log: str) -> str:
    assert f"files: {PACKED}\n" in log and "data: 42 from the laptop\n" in log, log[-3000:]
    return log.split("cwd: ", 1)[1].split("\n", 1)[0]


@pytest.mark.parametrize(
    "provider",
    [{"name": "local"}, {"name": "sim", "boot_s": 0.1}, {"name": "slurm"}],
    ids=["local", "sim", "slurm"],
)
def test_local_machines_run_the_unpacked_copy(tmp_path: Path, provider: dict, request):
    if provider["name"] == "slurm":
        request.getfixturevalue("slurm")  # a real slurmctld + slurmd on localhost
    home = tmp_path / "home"
    env = {**os.environ, "SPOTWISE_HOME": str(home)}
    job_id, log = _launch(tmp_path, {"market": "on-demand", "provider": provider}, env)
    cwd = Path(_ran_the_project(log))
    assert cwd == home / "jobs" / job_id / "attempts" / "1" / "workdir"  # not the project
    [archive] = (home / "workdirs").iterdir()  # content-addressed, beside the job's files
    assert archive.name.endswith(".tar.gz") and len(archive.name) == 64 + 7


@dataclass
class Aws:
    env: dict[str, str]  # what a user exports to reach it
    bucket: str


@pytest.fixture()
def aws(tmp_path: Path, moto_server: str) -> Aws:
    """The loopback S3/EC2 (moto) with a bucket of this test's own."""
    env = loopback_aws_env(moto_server, SPOTWISE_HOME=str(tmp_path / "home"))
    bucket = f"code-{uuid.uuid4().hex[:12]}"
    _client("s3", env).create_bucket(Bucket=bucket)
    return Aws(env, bucket)


def _client(service: str, env: dict[str, str]):
    return boto3.client(
        service,
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _archives(aws: Aws) -> list[str]:
    listed = _client("s3", aws.env).list_objects_v2(Bucket=aws.bucket)
    return [o["Key"] for o in listed.get("Contents", []) if "/workdirs/" in o["Key"]]


needs_root = pytest.mark.skipif(
    not machine_root.isolated(),
    reason="the doubles' machines see the host's files without a mount namespace (needs root)",
)


@needs_root
def test_an_ec2_instance_gets_the_code_from_s3(tmp_path: Path, aws: Aws):
    from spotwise.emulators.ec2 import Ec2DataPlane

    _client("iam", aws.env).create_instance_profile(InstanceProfileName=aws.bucket)
    # the instances' image: this Python and spotwise, not the job's folder
    plane = Ec2DataPlane(aws.env["AWS_ENDPOINT_URL"], workdir=tmp_path / "ec2", image=[]).start()
    provider = {
        "name": "aws",
        "region": "us-east-1",
        "zones": ["us-east-1a"],
        "image_id": "ami-03cf127a",
        "root_device": "/dev/xvda",
        "instance_profile": aws.bucket,
        "instance_type": "g4dn.xlarge",
        "s3": f"s3://{aws.bucket}/jobs",
        "poll_s": 0.5,
    }
    try:
        _, log = _launch(tmp_path, {"market": "on-demand", "provider": provider}, aws.env)
    finally:
        plane.stop()
    assert _ran_the_project(log) == "/tmp/spotwise-workdir"
    [key] = _archives(aws)  # beside the jobs' folders: s3://<bucket>/jobs/workdirs/
    assert key.startswith("jobs/workdirs/") and key.endswith(".tar.gz")


@needs_root
def test_a_pod_gets_the_code_from_s3(tmp_path: Path, aws: Aws):
    from spotwise.emulators.kubernetes import KubernetesEmulator

    reach = {k: aws.env[k] for k in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID")}
    doc = {
        "market": "on-demand",
        "checkpoint_dir": f"s3://{aws.bucket}/k8s/checkpoint",
        "env": {**reach, "AWS_SECRET_ACCESS_KEY": "testing", "SPOTWISE_PLATFORM": "none"},
        "provider": {"name": "kubernetes", "image": "python:3.11", "poll_s": 0.5},
    }
    with KubernetesEmulator(tmp_path / "cluster", flavour="plain", image=[]) as emu:
        env = {**aws.env, "KUBECONFIG": str(emu.kubeconfig)}
        _, log = _launch(tmp_path, doc, env)
        leftovers = emu.leftovers()
    assert _ran_the_project(log) == "/tmp/spotwise-workdir"
    [key] = _archives(aws)  # beside the checkpoint directory: s3://<bucket>/k8s/workdirs/
    assert key.startswith("k8s/workdirs/") and leftovers["pods"] == []
