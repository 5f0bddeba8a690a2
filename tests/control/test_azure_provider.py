"""The azure provider against the loopback Resource Manager double, through the official
azure-mgmt clients: capacity errors, throttling, bad input and secrets, before any VM runs."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotwise.control.providers import LaunchRequest, Placement, make_provider
from spotwise.emulators.azure_compute import SUBSCRIPTION, TOKEN, AzureComputeEmulator, check_shape
from spotwise.errors import CapacityError, ConfigError

OPTIONS = {
    "subscription_id": SUBSCRIPTION,
    "resource_group": "spotwise-rg",
    "region": "eastus",
    "zones": ["1", "2"],
    "vm_size": "Standard_NC4as_T4_v3",
    "image": "microsoft-dsvm:ubuntu-hpc:2204:latest",
    "subnet_id": "/subscriptions/x/resourceGroups/spotwise-rg/providers/"
    "Microsoft.Network/virtualNetworks/vnet/subnets/default",
    "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIProviderTestsOnly spotwise",
    "s3": "s3://spotwise-azure-tests/jobs",
}


@pytest.fixture(scope="module")
def arm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureComputeEmulator]:
    """One double for the module (the SDK's clients take seconds to build, once per URL)."""
    double = AzureComputeEmulator(tmp_path_factory.mktemp("azure"), provision_s=0.05)
    old = os.environ.get("SPOTWISE_AZURE_ENDPOINT_URL")
    os.environ["SPOTWISE_AZURE_ENDPOINT_URL"] = double.start()
    try:
        yield double
    finally:
        double.stop()
        if old is None:
            os.environ.pop("SPOTWISE_AZURE_ENDPOINT_URL", None)
        else:
            os.environ["SPOTWISE_AZURE_ENDPOINT_URL"] = old


def _request(tmp_path: Path, n: int = 1, env: dict[str, str] | None = None) -> LaunchRequest:
    return LaunchRequest(
        job_id="j-azure",
        n=n,
        argv=(sys.executable, "-c", "pass"),
        workdir=Path("/"),
        env=env or {},
        log_path=tmp_path / "job.log",
        attempt_dir=tmp_path / "attempts" / str(n),
        placement=Placement("spot", "eastus-1"),
    )


@pytest.mark.parametrize(
    "code", ["SkuNotAvailable", "OperationNotAllowed", "ZonalAllocationFailed"]
)
def test_capacity_errors_mean_no_capacity_and_leave_no_vm(
    arm: AzureComputeEmulator, tmp_path: Path, code: str
):
    provider = make_provider("azure", OPTIONS, epoch=0.0)
    arm.fail_next(code)
    with pytest.raises(CapacityError, match=code):
        provider.launch(_request(tmp_path))
    # an allocation failure leaves a Failed VM in ARM: the provider deletes it (with its disk
    # and NIC), which the double completes on its next tick
    deadline = time.monotonic() + 10
    while arm.live():
        assert time.monotonic() < deadline, arm.live()
        time.sleep(0.05)


def test_throttling_is_retried_by_the_sdk(arm: AzureComputeEmulator, tmp_path: Path):
    provider = make_provider("azure", OPTIONS, epoch=0.0)
    before = arm.count("/virtualMachines", 429)
    arm.inject("429", 2, on="/virtualMachines")
    assert provider.find("nobody", tmp_path) == []
    assert arm.count("/virtualMachines", 429) == before + 2


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"region": "atlantis"}, "provider.azure.region"),
        ({"vm_size": "Standard_Imaginary_v9"}, "provider.azure.vm_size"),
        ({"zones": ["7"]}, "provider.azure.zones"),
        ({"resource_group": "no-such-rg"}, "provider.azure.resource_group"),
    ],
)
def test_bad_settings_name_the_key_before_any_vm(
    arm: AzureComputeEmulator, change: dict[str, object], key: str
):
    created = len(arm.created) + len(arm.vms)
    with pytest.raises(ConfigError) as info:
        make_provider("azure", {**OPTIONS, **change}, epoch=0.0, preflight=True)
    assert key in str(info.value)
    assert len(arm.created) + len(arm.vms) == created


def test_a_missing_subscription_is_named():
    options = {k: v for k, v in OPTIONS.items() if k != "subscription_id"}
    with pytest.raises(ConfigError, match=r"provider\.azure\.subscription_id: required"):
        make_provider("azure", options, epoch=0.0)


def test_no_secret_goes_into_custom_data(arm: AzureComputeEmulator, tmp_path: Path):
    provider = make_provider("azure", OPTIONS, epoch=0.0)
    vms = len(arm.vms)
    with pytest.raises(ConfigError, match="AZURE_CLIENT_SECRET"):
        provider.launch(_request(tmp_path, env={"AZURE_CLIENT_SECRET": "s3cr3t"}))
    assert len(arm.vms) == vms
    body = provider.vm_body(_request(tmp_path, env={"HF_HOME": "/data"}), "eastus-1")  # type: ignore[attr-defined]
    assert TOKEN not in json.dumps(body)
    props = body["properties"]
    assert (props["priority"], props["evictionPolicy"], props["billingProfile"]) == (
        "Spot",
        "Delete",
        {"maxPrice": -1},
    )
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert body["tags"] == {"spotwise-job": "j-azure", "spotwise-attempt": "1"}


def test_the_double_refuses_what_the_sdk_model_does_not_know(arm: AzureComputeEmulator):
    from azure.mgmt.compute.models import VirtualMachine

    with pytest.raises(ValueError, match="evictionPolicyy"):
        check_shape(VirtualMachine, {"properties": {"evictionPolicyy": "Delete"}})
    url = (
        f"{arm.url}/subscriptions/{SUBSCRIPTION}/resourceGroups/spotwise-rg/providers/"
        "Microsoft.Compute/virtualMachines/vm1?api-version=2026-04-01"
    )
    body = {"location": "eastus", "properties": {"hardwareProfile": {"vmSize": "x"}, "spot": 1}}
    put = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"Authorization": "Bearer t", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(put, timeout=10)
    assert info.value.code == 400
    assert "properties.spot" in json.loads(info.value.read())["error"]["message"]


def test_a_disk_that_outlived_its_vm_is_found_by_tag_and_deleted(
    arm: AzureComputeEmulator, tmp_path: Path
):
    """A VM whose disk was kept (deleteOption Detach, made by hand) leaves it billed: the
    sweep finds it by the job's tag and deletes it; another job's disk is left alone."""
    provider = make_provider("azure", OPTIONS, epoch=0.0)
    for job in ("j-stray", "j-other"):
        arm.disks[("spotwise-rg", f"{job}-osdisk")] = {
            "name": f"{job}-osdisk",
            "location": "eastus",
            "tags": {"spotwise-job": job, "spotwise-attempt": "3"},
            "properties": {"diskState": "Unattached"},
        }
    [stray] = provider.find("j-stray", tmp_path / "attempts")
    assert (stray["n"], stray["id"], stray["kind"]) == (3, "j-stray-osdisk", "disk")
    provider.terminate(stray)
    assert provider.find("j-stray", tmp_path / "attempts") == []
    assert arm.live() == ["disk/j-other-osdisk"]
    arm.disks.clear()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"store": "az://c/jobs"}, "provider.azure: both store and s3"),
        ({"s3": "az://c/jobs"}, "provider.azure.s3: 'az://c/jobs' is not an object-store URI"),
        ({"s3": None, "store": "azure://c/jobs"}, "provider.azure.store: 'azure://c/jobs'"),
        ({"s3": None, "store": "az:///jobs"}, "provider.azure.store: URI 'az:///jobs' has no"),
        ({"s3": None}, "provider.azure.store: required"),
    ],
)
def test_a_bad_job_store_is_named_by_its_key(
    arm: AzureComputeEmulator, change: dict[str, object], named: str
):
    options = {k: v for k, v in {**OPTIONS, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        make_provider("azure", options, epoch=0.0)
    assert named in str(info.value)


def test_an_az_store_reaches_the_vm_by_its_account_url_never_its_key(
    arm: AzureComputeEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The VM's custom data names the store's account by URL (from the connection string the
    controller has) and holds no key; without any account the store's key is named."""
    from spotwise.emulators.azure_blob import AzureBlobEmulator

    options = {**{k: v for k, v in OPTIONS.items() if k != "s3"}, "store": "az://ckpt/jobs"}
    for name in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigError, match=r"provider\.azure\.store: az://ckpt/jobs names no"):
        make_provider("azure", options, epoch=0.0)
    blob = AzureBlobEmulator()  # (not started: only its development connection string)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", blob.connection_string())
    provider = make_provider("azure", options, epoch=0.0)
    custom = provider.custom_data(_request(tmp_path))  # type: ignore[attr-defined]
    assert f"export AZURE_STORAGE_ACCOUNT_URL={blob.account_url}" in custom
    assert "remote_boot report az://ckpt/jobs/j-azure/attempts/1" in custom
    assert "AccountKey" not in custom
    assert provider.features.checkpoints.default == "az://ckpt/jobs/{job_id}/checkpoint"
    with pytest.raises(ConfigError, match="AZURE_STORAGE_CONNECTION_STRING"):
        provider.launch(_request(tmp_path, env={"AZURE_STORAGE_CONNECTION_STRING": "x"}))
