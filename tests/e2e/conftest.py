"""What the e2e tests share: the CLI as a user runs it, the same training run, never
interrupted, to compare against, and the loopback S3 the cloud doubles' machines save to."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spotwise.control.spec import JobSpec

if TYPE_CHECKING:
    from spotwise.emulators.ec2 import Ec2DataPlane
    from spotwise.emulators.fault_proxy import Fault

HASH = re.compile(r"final-weights-sha256: ([0-9a-f]{64})")
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``spotwise ARGS`` in a fresh interpreter, as a user runs it, its output captured."""
    return subprocess.run(
        [*SPOTWISE, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture()
def uninterrupted(tmp_path: Path) -> Iterator[Callable[[JobSpec], Callable[[], str]]]:
    """``start(spec)`` runs the job's command locally in the background, with its own run
    directory and no interruption (at the job's world size, through torch's launcher: one
    node, as many ranks); calling what it returns waits and gives the final hash."""
    started: list[subprocess.Popen[str]] = []

    def start(spec: JobSpec) -> Callable[[], str]:
        run_dir = str(tmp_path / "uninterrupted")
        spec_argv = [a.replace("$SPOTWISE_CHECKPOINT_DIR", run_dir) for a in spec.command[1:]]
        if spec.world_size > 1:
            launcher = ["-m", "spotwise.runtime.launch", "--standalone"]
            argv = [*launcher, f"--nproc-per-node={spec.world_size}", "--no-python"]
            argv += [sys.executable, *spec_argv]
        else:
            argv = spec_argv
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=spec.workdir,
            env={**os.environ, "SPOTWISE_PLATFORM": "none"},
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)

        def final_hash() -> str:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0
            return HASH.findall(out)[-1]

        return final_hash

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def node_sections(log: str, n: int, cloud: str) -> list[str]:
    """Each node's output of attempt ``n`` of a multi-node job in its log (headed ``attempt n
    on <cloud> <machine> (node k)``)."""
    parts = re.split(rf"(?m)^\[spotwise\] attempt (\d+) on {cloud} \S+ \(node \d\)\n", log)
    return [text for num, text in zip(parts[1::2], parts[2::2], strict=True) if int(num) == n]


def check_two_node_job(
    job_id: str, env: dict[str, str], home: Path, cloud: str, refusal: str, baseline: str
) -> None:
    """A two-node job that lost one node: preempted (75 on every rank, each node's launcher
    kept it), then resumed on both nodes from what they saved in the object store (their disks
    are gone), with the uninterrupted run's weights; and all or nothing: attempt 1's rank 0 in
    the first zone went when rank 1 found no capacity there (one ``refusal``)."""
    from spotwise.control.store import Store

    status = json.loads(cli("status", job_id, "--json", env=env).stdout)
    log = cli("logs", job_id, env=env).stdout
    assert status["state"] == "SUCCEEDED", log[-3000:]
    assert [(a["reason"], a["exit_code"]) for a in status["attempts"]] == [
        ("preempted", 75),
        ("succeeded", 0),
    ], log[-3000:]
    first = node_sections(log, 1, cloud)
    assert len(first) == 2 and all("attempt exit 75" in s for s in first), log[-4000:]
    second = "".join(node_sections(log, 2, cloud))
    resumed = [int(s) for s in re.findall(r"resumed from step (\d+)", second)]
    assert resumed and resumed[0] > 0, log[-3000:]
    assert HASH.findall(log)[-1] == baseline
    refused = [e["message"] for e in Store(home).events(job_id) if e["kind"] == "launch-refused"]
    assert len(refused) == 1 and refusal in refused[0], refused


def aws_client(service: str, env: dict[str, str]) -> Any:
    """A boto3 client of the loopback AWS endpoint in ``env`` (fake credentials)."""
    import boto3

    return boto3.client(
        service,
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def s3_checkpoints(env: dict[str, str], besides: Collection[str] = ()) -> dict[str, set[int]]:
    """The steps of each job's checkpoints in S3 (``s3://spotwise-digits/jobs``, where the
    example jobs' machines save them), but for the jobs in ``besides`` (moto's state is one
    per test process: the other clouds' tests' jobs are there too)."""
    listed = aws_client("s3", env).list_objects_v2(Bucket="spotwise-digits", Prefix="jobs/")
    return checkpoint_steps((o["Key"] for o in listed.get("Contents", [])), besides)


def checkpoint_steps(keys: Iterable[str], besides: Collection[str] = ()) -> dict[str, set[int]]:
    """The steps of each job's checkpoints among a store's ``keys`` (``jobs/<id>/checkpoint/
    step-N/...``), but for the jobs in ``besides``."""
    found: dict[str, set[int]] = {}
    for key in keys:
        m = re.fullmatch(r"jobs/([^/]+)/checkpoint/step-(\d+)/.*", key)
        if m and m.group(1) not in besides:
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    return found


def ec2_instances(env: dict[str, str], job_id: str, live_only: bool) -> list[dict[str, Any]]:
    """The job's instances (found by tag), or those not yet terminated."""
    filters = [{"Name": "tag:spotwise:job", "Values": [job_id]}]
    if live_only:
        filters.append(
            {
                "Name": "instance-state-name",
                "Values": ["pending", "running", "shutting-down", "stopping"],
            }
        )
    out = aws_client("ec2", env).describe_instances(Filters=filters)
    return [i for r in out["Reservations"] for i in r["Instances"]]


@dataclass
class Ec2:
    env: dict[str, str]  # what `spotwise emulate ec2` says to export
    plane: Ec2DataPlane


@contextlib.contextmanager
def ec2_double(workdir: Path, *faults: Fault, notice_lead_s: float = 5) -> Iterator[Ec2]:
    """What `spotwise emulate ec2` runs, in this process so that a test can reclaim an
    instance when it has saved (an interruption on a fixed schedule races the instance's start
    on a loaded machine): moto's EC2 + S3 with the example jobs' bucket and instance profile,
    the data plane whose instances see only this checkout, this Python and S3, and a fault
    proxy in front with ``faults``."""
    from moto.server import ThreadedMotoServer

    from spotwise.emulators.ec2 import Ec2DataPlane
    from spotwise.emulators.fault_proxy import FaultProxy

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    moto = f"http://{host}:{port}"
    proxy = FaultProxy(moto)
    for fault in faults:
        proxy.add(fault)
    env = loopback_aws_env(proxy.url)
    aws_client("s3", env).create_bucket(Bucket="spotwise-digits")
    iam = aws_client("iam", env)
    with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):  # (moto: per process)
        iam.create_instance_profile(InstanceProfileName="spotwise-digits")
    root = Path(__file__).resolve().parents[2]
    plane = Ec2DataPlane(
        moto, workdir=workdir, notice_lead_s=notice_lead_s, stop_grace_s=10, image=[root]
    ).start()
    try:
        yield Ec2(env, plane)
    finally:
        plane.stop()
        proxy.close()
        server.stop()


def loopback_aws_env(endpoint: str, **extra: str) -> dict[str, str]:
    """This environment pointed at a loopback AWS with fake credentials (the user's own
    profile and session token removed, so nothing can reach a real account)."""
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        **extra,
    }
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(name, None)
    return env


def launch_detached(job_file: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``spotwise launch JOB`` in its own session, output discarded: a controller the test
    can SIGKILL as a closed laptop would end it."""
    return subprocess.Popen(
        [*SPOTWISE, "launch", str(job_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
