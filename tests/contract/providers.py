"""Factories of every Provider backend that the contract suite runs against.

To add a provider, add one entry: ``name -> factory(request, tmp_path, plan) -> Backend``.
``plan[n - 1] = (exit_code, run_s)`` is what attempt ``n`` does: run for ``run_s`` seconds, then
exit with ``exit_code``; on SIGTERM (the notice) it exits 75, as the runtime does after its
emergency save. A real backend runs that as a process; the in-memory fake is scripted with it.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotwise.control.providers import LaunchRequest, Placement, Provider, make_provider

Plan = list[tuple[int, float]]

ATTEMPT = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("saved on notice", flush=True), sys.exit(75)))
print("attempt running", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    time.sleep(0.02)
sys.exit(int(sys.argv[1]))
"""


@dataclass
class Backend:
    provider: Provider
    tmp: Path
    plan: Plan
    job_id: str
    options: dict[str, Any]

    @property
    def attempts_dir(self) -> Path:
        return self.tmp / "attempts"

    def request(self, n: int, market: str = "on-demand") -> LaunchRequest:
        code, run_s = self.plan[n - 1]
        # as the controller does: a remote machine gets none of this host's environment
        env = dict(os.environ) if self.provider.features.same_host else {}
        env["SPOTWISE_PLATFORM"] = "none"
        return LaunchRequest(
            job_id=self.job_id,
            n=n,
            argv=(sys.executable, "-c", ATTEMPT, str(code), str(run_s)),
            # a remote machine has its image's directories, none of this host's
            workdir=self.tmp if self.provider.features.same_host else Path("/"),
            env=env,
            log_path=self.tmp / "job.log",
            attempt_dir=self.attempts_dir / str(n),
            placement=Placement(market, self.provider.features.zones[0]),
            grace_s=5.0,
        )


Factory = Callable[[pytest.FixtureRequest, Path, Plan], Backend]


def _made(name: str, options: dict[str, Any], tmp: Path, plan: Plan) -> Backend:
    provider = make_provider(name, options, epoch=0.0, instance_type=None)
    return Backend(provider, tmp, plan, uuid.uuid4().hex[:8], options)


def _slurm(request: pytest.FixtureRequest, tmp: Path, plan: Plan) -> Backend:
    request.getfixturevalue("slurm")  # tests/conftest.py: started, failed under CI, or skipped
    return _made("slurm", {"signal_s": 30}, tmp, plan)


_AMI: list[str] = []


def _aws(request: pytest.FixtureRequest, tmp: Path, plan: Plan) -> Backend:
    """moto (EC2 + S3) on loopback with the EC2 data-plane emulator running the instances."""
    import boto3

    from spotwise.emulators.ec2 import Ec2DataPlane

    endpoint = request.getfixturevalue("aws_env")
    bucket = f"contract-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    if not _AMI:  # listing moto's AMIs takes seconds: once per session
        ec2 = boto3.client("ec2", endpoint_url=endpoint)
        _AMI.append(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    ami = _AMI[0]
    plane = Ec2DataPlane(endpoint, workdir=tmp / "ec2", stop_grace_s=3.0, poll_s=0.1).start()
    request.addfinalizer(plane.stop)
    options = {
        "region": "us-east-1",
        "s3": f"s3://{bucket}/jobs",
        "image_id": ami,
        "zones": ["us-east-1a", "us-east-1b"],
        "instance_type": "g4dn.xlarge",
        "poll_s": 0.1,
        "grace_s": 5.0,
    }
    return _made("aws", options, tmp, plan)


def _azure(request: pytest.FixtureRequest, tmp: Path, plan: Plan) -> Backend:
    """The loopback Resource Manager double (its VMs run their custom data in roots of their
    own) and moto's S3 for the exit records, driven by the official azure-mgmt clients."""
    import boto3

    from spotwise.emulators.azure_compute import SUBSCRIPTION, AzureComputeEmulator

    endpoint = request.getfixturevalue("aws_env")
    bucket = f"contract-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    arm = AzureComputeEmulator(
        tmp / "azure",
        stop_grace_s=3.0,
        provision_s=0.1,
        machine_env={k: os.environ[k] for k in os.environ if k.startswith("AWS_")},
    )
    request.getfixturevalue("monkeypatch").setenv("SPOTWISE_AZURE_ENDPOINT_URL", arm.start())
    request.addfinalizer(arm.stop)
    options = {
        "subscription_id": SUBSCRIPTION,
        "resource_group": "spotwise-rg",
        "region": "eastus",
        "zones": ["1", "2"],
        "vm_size": "Standard_NC4as_T4_v3",
        "image": "microsoft-dsvm:ubuntu-hpc:2204:latest",
        "subnet_id": "/subscriptions/x/resourceGroups/spotwise-rg/providers/"
        "Microsoft.Network/virtualNetworks/vnet/subnets/default",
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIContractSuiteOnly spotwise",
        "s3": f"s3://{bucket}/jobs",
        "poll_s": 0.1,
        "grace_s": 5.0,
    }
    return _made("azure", options, tmp, plan)


def _gcp(request: pytest.FixtureRequest, tmp: Path, plan: Plan) -> Backend:
    """The loopback Compute Engine double (official SDK clients) running each VM's startup
    script; its run dir on moto's S3."""
    import boto3

    from spotwise.control.providers.gcp import ENDPOINT_ENV
    from spotwise.emulators.gcp_compute import GcpComputeEmulator

    endpoint = request.getfixturevalue("aws_env")
    bucket = f"contract-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    double = GcpComputeEmulator(tmp / "gce", s3_endpoint=endpoint, stop_grace_s=3.0, poll_s=0.1)
    request.getfixturevalue("monkeypatch").setenv(ENDPOINT_ENV, double.start())
    request.addfinalizer(double.stop)
    options = {
        "project": "spotwise-project",
        "zones": ["us-central1-a", "us-central1-b"],
        "s3": f"s3://{bucket}/jobs",
        "machine_type": "g2-standard-4",
        "image_family": "debian-12",
        "image_project": "debian-cloud",
        "poll_s": 0.1,
        "grace_s": 5.0,
    }
    return _made("gcp", options, tmp, plan)


def _kubernetes(request: pytest.FixtureRequest, tmp: Path, plan: Plan) -> Backend:
    """The loopback Kubernetes API double; its pods are local processes (CPU-only GKE nodes)."""
    from spotwise.emulators.kubernetes import KubernetesEmulator, pool_nodes

    cluster = KubernetesEmulator(tmp / "k8s", nodes=pool_nodes("gke", gpus_per_node=0))
    cluster.start()
    request.addfinalizer(cluster.stop)
    options = {
        "image": "python:3.11",
        "flavour": "gke",
        "kubeconfig": str(cluster.kubeconfig),
        "checkpoint_pvc": "spotwise-checkpoints",
        "grace_s": 5.0,
        "poll_s": 0.1,
    }
    return _made("kubernetes", options, tmp, plan)


BACKENDS: dict[str, Factory] = {
    "aws": _aws,
    "azure": _azure,
    "fake": lambda request, tmp, plan: _made(
        "fake",
        {"exits": [c for c, _ in plan], "run_s": [s for _, s in plan], "boot_s": 0.05},
        tmp,
        plan,
    ),
    "gcp": _gcp,
    "kubernetes": _kubernetes,
    "local": lambda request, tmp, plan: _made("local", {}, tmp, plan),
    "sim": lambda request, tmp, plan: _made("sim", {"boot_s": 0.05}, tmp, plan),
    "slurm": _slurm,
}
