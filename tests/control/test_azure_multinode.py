"""Multi-node attempts on the azure provider, against the loopback Resource Manager double
through the official azure-mgmt clients: rank 0 first with its NIC's private IP in the others'
rendezvous, one attempt found again by tag, an eviction of a node ends the attempt, all or
nothing, and a rolled-back node's exit record never read as the next launch's."""

from __future__ import annotations

import base64
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotwise.control.providers import LaunchRequest, Placement, make_provider
from spotwise.control.providers.base import adoptable
from spotwise.emulators.azure_blob import AzureBlobEmulator
from spotwise.emulators.azure_compute import SUBSCRIPTION, AzureComputeEmulator
from spotwise.errors import CapacityError
from spotwise.settings import AZURE_ENDPOINT_URL

WAIT_S = 120.0  # generous: two guests start torch's launcher on a loaded runner


@pytest.fixture(scope="module")
def arm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AzureComputeEmulator, dict]]:
    blob = AzureBlobEmulator()
    blob.start()
    container = f"nodes-{uuid.uuid4().hex[:8]}"
    blob.add_bucket(container)
    double = AzureComputeEmulator(
        tmp_path_factory.mktemp("azure"),
        machine_env=blob.env(),
        notice_lead_s=5.0,
        stop_grace_s=3.0,
        provision_s=0.05,
    )
    env = {AZURE_ENDPOINT_URL.name: double.start(), **blob.env()}
    options = {
        "subscription_id": SUBSCRIPTION,
        "resource_group": "spotwise-rg",
        "region": "eastus",
        "zones": ["1", "2"],
        "vm_size": "Standard_NC4as_T4_v3",
        "image": "microsoft-dsvm:ubuntu-hpc:2204:latest",
        "subnet_id": "/subscriptions/x/resourceGroups/spotwise-rg/providers/"
        "Microsoft.Network/virtualNetworks/vnet/subnets/default",
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMultiNodeTestsOnly spotwise",
        "store": f"az://{container}/jobs",
        "poll_s": 0.1,
        "grace_s": 0.0,  # a node that exited 75 does not hold back stopping the others
    }
    try:
        yield double, {"env": env, "options": options}
    finally:
        double.stop()
        blob.stop()


@pytest.fixture()
def provider(arm, monkeypatch: pytest.MonkeyPatch) -> Any:
    _, conf = arm
    for name in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_URL"):
        monkeypatch.delenv(name, raising=False)
    for key, value in conf["env"].items():
        monkeypatch.setenv(key, value)
    return lambda: make_provider("azure", conf["options"], epoch=0.0, instance_type=None)


def _req(tmp_path: Path, job_id: str, zone: str = "eastus-1") -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        n=1,
        argv=(sys.executable, "-c", "import time; time.sleep(300)"),
        workdir=Path("/"),
        env={},
        log_path=tmp_path / "job.log",
        attempt_dir=tmp_path / "attempts" / "1",
        placement=Placement("spot", zone),
        nodes=2,
    )


def _doc(double: AzureComputeEmulator, name: str) -> dict[str, Any]:
    with double._lock:
        return next(vm.doc for vm in double.vms.values() if vm.name == name)


def _script(double: AzureComputeEmulator, name: str) -> str:
    return base64.b64decode(_doc(double, name)["properties"]["osProfile"]["customData"]).decode()


def _wait(what: str, done: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (got := done()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return got


def _gone(double: AzureComputeEmulator, job_id: str) -> bool:
    return not [n for n in double.live() if job_id in n]


def _ended(status: Any) -> Any:
    return status if status.phase.value not in ("starting", "running") else None


def test_two_vms_are_one_attempt_found_again_and_an_evicted_node_ends_it(arm, provider, tmp_path):
    double, _ = arm
    job = f"j{uuid.uuid4().hex[:6]}"
    p = provider()
    handle = p.launch(_req(tmp_path, job))
    names = handle["nodes"]
    for k, name in enumerate(names):
        tags = _doc(double, name)["tags"]
        assert (tags["spotwise-rank"], tags["spotwise-nodes"]) == (str(k), "2")
        assert tags["spotwise-launch"] == handle["launch"] and name.endswith(f"-{k}")
    first, second = (_script(double, n) for n in names)
    port = handle["port"]
    assert f"--rdzv-endpoint=localhost:{port}" in first and "is_host=true" in first
    nic = p.network.network_interfaces.get("spotwise-rg", f"{names[0]}-nic")  # rank 0's
    rank0_ip = nic.ip_configurations[0].private_ip_address
    assert f"--rdzv-endpoint={rank0_ip}:{port}" in second and "is_host=false" in second
    assert f"/attempts/1/{handle['launch']}/node-1" in second  # this launch's records
    assert "spotwise.runtime.launch" in second and "--nnodes=2" in second

    again = provider()  # a controller restarted after a crash
    found = again.find(job, tmp_path / "attempts")
    assert len(found) == 1  # one attempt, not two VMs to sweep as orphans
    assert adoptable(found, 1) == {**found[0], "id": handle["id"], "nodes": handle["nodes"]}
    double.evict(names[1])  # rank 1's VM: Preempt, then deleted
    status = _wait("the attempt never ended", lambda: _ended(again.status(found[0])))
    assert status.phase.value in ("lost", "exited") and status.exit_code != 0, status
    _wait("a node was left behind", lambda: _gone(double, job))  # the other was stopped
    assert again.find(job, tmp_path / "attempts") == []


def test_two_vms_start_together_or_not_at_all_and_a_rolled_back_node_is_not_read(
    arm, provider, tmp_path
):
    """No capacity for rank 1 deletes rank 0 (whose guest, shut down, may report under its
    own launch); the attempt's next launch in the other zone is neither that record nor that
    VM."""
    double, _ = arm
    job = f"j{uuid.uuid4().hex[:6]}"
    double.fail_next("ZonalAllocationFailed", name=rf"{job}-1-.*-1$")
    p = provider()
    with pytest.raises(CapacityError, match="ZonalAllocationFailed"):
        p.launch(_req(tmp_path, job))
    _wait("rank 0 was not rolled back", lambda: _gone(double, job))
    [rolled_back] = [n for n in double.created if job in n]  # (rank 1 never provisioned)
    assert rolled_back.endswith("-0")
    # what its guest reports when the shutdown's SIGTERM ends it (under its own launch)
    old = rolled_back.split("-")[-2]
    record = {"exit_code": 143, "started_at": 1.0, "ended_at": time.time(), "stopping": True}
    p.store.attempt(job, 1, (old, 0)).put("exit.json", json.dumps(record).encode())

    handle = p.launch(_req(tmp_path, job, zone="eastus-2"))  # the same attempt, elsewhere
    assert handle["launch"] != old
    assert p.status(handle).phase.value in ("starting", "running")
    assert adoptable(provider().find(job, tmp_path), 1)["id"] == handle["id"]
    p.terminate(handle)
    _wait("a node was left behind", lambda: _gone(double, job))
