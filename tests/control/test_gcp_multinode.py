"""Multi-node attempts on the gcp provider, against the loopback Compute Engine double through
the official google-cloud-compute client: rank 0 first with its internal IP in the others'
rendezvous, one attempt found again by label, the loss of a node ends the attempt, all or
nothing, and a rolled-back node's exit record never read as the next launch's."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotwise.control.providers import LaunchRequest, Placement, make_provider
from spotwise.control.providers.base import adoptable
from spotwise.control.providers.cloud_nodes import FoundNode, launches
from spotwise.emulators.gcp_compute import GcpComputeEmulator
from spotwise.emulators.gcs import GcsEmulator
from spotwise.errors import CapacityError
from spotwise.settings import GCP_COMPUTE_ENDPOINT

WAIT_S = 120.0  # generous: two guests start torch's launcher on a loaded runner


@pytest.fixture(scope="module")
def gce(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GcpComputeEmulator, dict]]:
    gcs = GcsEmulator()
    gcs.start()
    bucket = f"nodes-{uuid.uuid4().hex[:8]}"
    gcs.add_bucket(bucket)
    double = GcpComputeEmulator(
        tmp_path_factory.mktemp("gce"), machine_env=gcs.env(), stop_grace_s=3.0, poll_s=0.1
    )
    env = {GCP_COMPUTE_ENDPOINT.name: double.start(), **gcs.env()}
    options = {
        "project": "spotwise-project",
        "zones": ["us-central1-a", "us-central1-b"],
        "store": f"gs://{bucket}/jobs",
        "machine_type": "g2-standard-4",
        "image_family": "debian-12",
        "image_project": "debian-cloud",
        "poll_s": 0.1,
        "grace_s": 0.0,  # a node that exited 75 does not hold back stopping the others
    }
    try:
        yield double, {"env": env, "options": options}
    finally:
        double.stop()
        gcs.stop()


@pytest.fixture()
def provider(gce, monkeypatch: pytest.MonkeyPatch) -> Any:
    _, conf = gce
    for key, value in conf["env"].items():
        monkeypatch.setenv(key, value)
    return lambda: make_provider("gcp", conf["options"], epoch=0.0, instance_type=None)


def _req(tmp_path: Path, job_id: str, zone: str = "us-central1-a") -> LaunchRequest:
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


def _vm(double: GcpComputeEmulator, name: str) -> Any:
    with double._lock:
        return next(vm.doc for (_, n), vm in double.vms.items() if n == name)


def _script(double: GcpComputeEmulator, name: str) -> str:
    return {i.key: i.value for i in _vm(double, name).metadata.items}["startup-script"]


def _wait(what: str, done: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (got := done()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return got


def _gone(double: GcpComputeEmulator, job_id: str) -> bool:
    return not [n for n in double.live() if job_id in n]


def test_two_vms_are_one_attempt_found_again_and_a_lost_node_ends_it(gce, provider, tmp_path):
    double, _ = gce
    job = f"j{uuid.uuid4().hex[:6]}"
    p = provider()
    handle = p.launch(_req(tmp_path, job))
    names = [node["name"] for node in handle["nodes"]]
    for k, name in enumerate(names):
        labels = _vm(double, name).labels
        assert (labels["spotwise-rank"], labels["spotwise-nodes"]) == (str(k), "2")
        assert labels["spotwise-launch"] == handle["launch"] and name.endswith(f"-{k}")
    first, second = (_script(double, n) for n in names)
    port = handle["port"]
    assert f"--rdzv-endpoint=localhost:{port}" in first and "is_host=true" in first
    rank0_ip = _vm(double, names[0]).network_interfaces[0].network_i_p
    assert f"--rdzv-endpoint={rank0_ip}:{port}" in second and "is_host=false" in second
    assert f"/attempts/1/{handle['launch']}/node-1" in second  # this launch's records
    assert "spotwise.runtime.launch" in second and "--nnodes=2" in second

    again = provider()  # a controller restarted after a crash
    found = again.find(job, tmp_path / "attempts")
    assert len(found) == 1  # one attempt, not two VMs to sweep as orphans
    assert adoptable(found, 1) == {**found[0], "id": handle["id"], "nodes": handle["nodes"]}
    double.preempt(names[1])  # rank 1's VM is taken away
    status = _wait("the attempt never ended", lambda: _ended(again.status(found[0])))
    assert status.phase.value in ("lost", "exited") and status.exit_code != 0, status
    _wait("a node was left behind", lambda: _gone(double, job))  # the other was stopped
    assert again.find(job, tmp_path / "attempts") == []


def _ended(status: Any) -> Any:
    return status if status.phase.value not in ("starting", "running") else None


def test_two_vms_start_together_or_not_at_all_and_a_rolled_back_node_is_not_read(
    gce, provider, tmp_path
):
    """No capacity for rank 1 in the first zone deletes rank 0 (whose guest, shut down,
    reports under its own launch); the attempt's next launch in the other zone is neither
    that record nor that VM."""
    double, _ = gce
    job = f"j{uuid.uuid4().hex[:6]}"
    double.fail("insert", "ZONE_RESOURCE_POOL_EXHAUSTED", 1, zone="us-central1-a", name=r"-1$")
    p = provider()
    with pytest.raises(CapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        p.launch(_req(tmp_path, job))
    _wait("rank 0 was not rolled back", lambda: _gone(double, job))
    rolled_back = [
        op.target_link.rsplit("/", 1)[-1]
        for _, op in list(double.operations.values())
        if op.operation_type == "insert" and job in op.target_link and not op.error.errors
    ]
    assert len(rolled_back) == 1 and rolled_back[0].endswith("-0")
    # (its guest reported as the shutdown's SIGTERM ended it: under its own launch)
    old = rolled_back[0].split("-")[-2]
    assert _wait("no report", lambda: p.store.attempt(job, 1, (old, 0)).list("exit.json"))

    handle = p.launch(_req(tmp_path, job, zone="us-central1-b"))  # the same attempt, elsewhere
    assert handle["launch"] != old
    assert p.status(handle).phase.value in ("starting", "running")
    assert adoptable(provider().find(job, tmp_path), 1)["id"] == handle["id"]
    p.terminate(handle)
    _wait("a node was left behind", lambda: _gone(double, job))


def test_a_launch_whose_every_node_is_ending_is_not_adopted():
    def node(launch: str, rank: int, ending: bool) -> FoundNode:
        handle = {"n": 1, "id": f"{launch}{rank}", "job": "j", "zone": "z"}
        return FoundNode(handle, f"{launch}{rank}", rank, 2, launch, ending)

    rollback = [node("aa", 0, True)]  # rank 1 was never started
    live = [node("bb", 1, False), node("bb", 0, True)]
    [group] = launches([*rollback, *live])
    assert group["id"] == "spotwise-j-1-bb" and group["nodes"] == ["bb0", "bb1"]
