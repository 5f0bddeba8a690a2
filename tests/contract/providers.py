"""Factories of every Provider backend that the contract suite (``spotwise.testing``) runs
against here.

To add a provider, add one entry: ``name -> factory(request, tmp_path, plan) -> Backend``; the
plan's meaning is in :mod:`spotwise.testing.provider`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spotwise.control.providers import make_provider
from spotwise.testing import Backend, Plan

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

    from spotwise.emulators.gcp_compute import GcpComputeEmulator
    from spotwise.settings import GCP_COMPUTE_ENDPOINT

    endpoint = request.getfixturevalue("aws_env")
    bucket = f"contract-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    aws = {k: os.environ[k] for k in os.environ if k.startswith("AWS_")}
    double = GcpComputeEmulator(tmp / "gce", machine_env=aws, stop_grace_s=3.0, poll_s=0.1)
    request.getfixturevalue("monkeypatch").setenv(GCP_COMPUTE_ENDPOINT.name, double.start())
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
