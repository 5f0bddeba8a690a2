"""Multi-node attempts and Kueue on the ``kubernetes`` provider, against the loopback cluster
through the official client: an Indexed Job of 2 pods behind a headless Service whose ranks meet
at rank 0 (real torch launcher, gloo), the loss of one pod ending the attempt with 75 on every
pod, all-or-nothing placement, no orphan Service; and a job queued by Kueue, admitted, evicted
(preempted, saved, relaunched) and finished, its wait for admission not billed."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client, config

from spotwise.control.launching import launch_request
from spotwise.control.providers import Phase, Placement
from spotwise.control.providers.kubernetes import KubernetesProvider
from spotwise.control.spec import Resources, parse_spec
from spotwise.emulators.kubernetes import KubernetesEmulator, NodeSpec, pool_nodes
from spotwise.errors import CapacityError

from .conftest import controller_thread, wait_until

TOY = Path(__file__).with_name("ddp_toy.py")
SPOT = {"cloud.google.com/gke-spot": "true"}
# counts steps, saves every 5 to the claim, saves and exits 75 on SIGTERM, resumes from the save
STEPPER = """
import json, os, signal, sys, time
path = os.path.join(os.environ["SPOTWISE_CHECKPOINT_DIR"], "step.json")
os.makedirs(os.path.dirname(path), exist_ok=True)
step = json.load(open(path))["step"] if os.path.exists(path) else 0
print(f"starts at step {step}", flush=True)
noticed = []
signal.signal(signal.SIGTERM, lambda *_: noticed.append(1))
def save():
    json.dump({"step": step}, open(path + ".tmp", "w"))
    os.replace(path + ".tmp", path)
while step < int(sys.argv[1]):
    if noticed:
        save()
        print(f"saved at step {step}", flush=True)
        sys.exit(75)
    time.sleep(0.05)
    step += 1
    if step % 5 == 0:
        save()
print(f"done at step {step}", flush=True)
"""


def provider(emu: KubernetesEmulator, gpus: int = 1, **options: Any) -> KubernetesProvider:
    opts = {
        "image": "python:3.11",
        "flavour": "gke",
        "kubeconfig": str(emu.kubeconfig),
        "checkpoint_pvc": "spotwise-checkpoints",
        "grace_s": 20,
        "poll_s": 0.1,
        **options,
    }
    resources = Resources(gpu="T4", gpu_count=gpus)
    return KubernetesProvider(
        opts, epoch=time.time(), instance_type=None, preflight=True, resources=resources
    )


def two_node_request(p: KubernetesProvider, workdir: Path, command: str) -> Any:
    spec = parse_spec(
        {"name": "ddp", "command": command, "nodes": 2, "provider": {"name": "fake"}},
        base_dir=workdir,
    )
    job_dir = workdir / "job"
    return launch_request(
        spec, p, "ddp-0a1b2c", 1, Placement("spot", p.features.zones[0]),
        job_dir=job_dir, log_path=job_dir / "job.log",
    )  # fmt: skip


def wait_ended(p: KubernetesProvider, handle: dict[str, Any], timeout: float = 240.0) -> Any:
    deadline = time.monotonic() + timeout
    while (status := p.status(handle)).phase not in (Phase.EXITED, Phase.LOST):
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return status


def test_two_pods_meet_at_rank_0_and_losing_one_ends_both_with_75(tmp_path: Path):
    shutil.copy(TOY, tmp_path)
    nodes = pool_nodes("gke", spot=2, on_demand=0)
    with KubernetesEmulator(tmp_path / "cluster", nodes=nodes, image=[tmp_path]) as emu:
        p = provider(emu, capacity_wait_s=30)
        req = two_node_request(p, tmp_path, "python ddp_toy.py 2000 0.05")
        service, job = p.manifests(req)
        for manifest in (service, job):
            assert kubernetes_validate.validate(manifest, "1.31", strict=True)
        handle = p.launch(req)
        name = handle["id"]
        command = " ".join(job["spec"]["template"]["spec"]["containers"][0]["command"])
        assert f"--rdzv-endpoint={name}-0.{name}:29500" in command
        assert "--node-rank=$(JOB_COMPLETION_INDEX)" in command
        # both ranks run, their rendezvous at pod 0's name (the double: 127.0.0.1, own port)
        wait_until(lambda: p.status(handle).phase is Phase.RUNNING and req.log_path.exists()
                   and "rank 1/2 starts" in req.log_path.read_text(), 240)  # fmt: skip
        pods = sorted(emu.store.select("pods")[0], key=lambda o: o["metadata"]["name"])
        assert [o["spec"]["hostname"] for o in pods] == [f"{name}-0", f"{name}-1"]
        assert p.status(handle).phase is Phase.RUNNING
        emu.cluster.evict("default", pods[1]["metadata"]["name"])  # rank 1's node goes
        ended = wait_ended(p, handle)
        leftovers = emu.leftovers()
        services = emu.store.select("services")[0]
        exits = {n: emu.cluster.exits.get(n) for n in (o["metadata"]["name"] for o in pods)}
    assert (ended.phase, ended.exit_code) == (Phase.EXITED, 75), ended
    assert set(exits.values()) == {75}, exits  # every pod's launcher kept its rank's 75
    log = req.log_path.read_text()
    assert "rank 0/2 saved at step" in log and "rank 1/2 saved at step" in log
    assert leftovers == {"jobs": [], "pods": [], "processes": []} and services == []


def test_two_pods_that_do_not_fit_start_none_and_are_no_capacity(tmp_path: Path):
    nodes = [NodeSpec("spot-0", SPOT, gpus=1), NodeSpec("spot-1", SPOT, gpus=0)]
    with KubernetesEmulator(tmp_path / "cluster", nodes=nodes) as emu:
        p = provider(emu, capacity_wait_s=0.5)
        with pytest.raises(CapacityError) as caught:
            p.launch(two_node_request(p, tmp_path, "python -c pass"))
        pods = emu.store.select("pods")[0]
        bound = [o for o in pods if o["spec"].get("nodeName")]
        leftovers = emu.leftovers()
        services = emu.store.select("services")[0]
    assert "0 of the 2 pods" in caught.value.message
    assert "Insufficient nvidia.com/gpu" in caught.value.message  # the scheduler's own words
    assert bound == [] and emu.cluster.exits == {}  # the one GPU was never taken by half of it
    assert leftovers["jobs"] == [] and services == []


def test_a_service_left_by_a_cut_off_launch_is_found_and_swept(tmp_path: Path):
    with KubernetesEmulator(tmp_path / "cluster", nodes=pool_nodes("gke", spot=2)) as emu:
        p = provider(emu)
        req = two_node_request(p, tmp_path, "python -c pass")
        service, _ = p.manifests(req)
        api = config.new_client_from_config(str(emu.kubeconfig))
        client.CoreV1Api(api).create_namespaced_service("default", service)  # then: crash
        [found] = p.find("ddp-0a1b2c", req.attempt_dir.parent)
        assert (found["n"], found["id"]) == (1, service["metadata"]["name"])
        assert wait_ended(p, found).phase is Phase.LOST  # its Job never came
        assert emu.store.select("services")[0] == []
        assert p.find("ddp-0a1b2c", req.attempt_dir.parent) == []


def test_kueue_queues_admits_evicts_and_the_job_finishes_unbilled_while_queued(tmp_path: Path):
    (tmp_path / "stepper.py").write_text(STEPPER)
    nodes = [NodeSpec("spot-0", SPOT, gpus=1)]
    quota = {"cpu": "1", "nvidia.com/gpu": "1"}
    with KubernetesEmulator(
        tmp_path / "cluster", nodes=nodes, image=[tmp_path], kueue_quota=quota
    ) as emu:
        api = config.new_client_from_config(str(emu.kubeconfig))
        batch = client.BatchV1Api(api)
        batch.create_namespaced_job("default", _blocker())  # admitted first: holds the quota
        wait_until(lambda: not batch.read_namespaced_job("blocker", "default").spec.suspend, 60)
        spec = parse_spec(
            {
                "name": "queued",
                "command": "python stepper.py 80",
                "market": "spot",
                "zone_cooldown": 0,
                "resources": {"gpu": "T4", "gpu_count": 1},
                "provider": {
                    "name": "kubernetes",
                    "image": "python:3.11",
                    "flavour": "gke",
                    "kubeconfig": str(emu.kubeconfig),
                    "checkpoint_pvc": "spotwise-checkpoints",
                    "kueue": {"queue": "spotwise"},
                    "usd_per_hour": 3600.0,  # $1 a second: the billed time is plain to see
                    "grace_s": 10,
                    "poll_s": 0.2,
                },
            },
            base_dir=tmp_path,
        )
        with controller_thread(spec, join_s=240) as run:
            wait_until(lambda: "insufficient unused quota" in run.store.job(run.job.id).message)
            queued_seen = time.time()
            assert run.store.job(run.job.id).state.value == "LAUNCHING"
            time.sleep(1.0)  # queued for a while: none of it is billed
            freed_at = time.time()
            batch.delete_namespaced_job("blocker", "default", propagation_policy="Background")
            claim = tmp_path / "cluster" / "volumes" / "default" / "spotwise-checkpoints"
            wait_until(lambda: (claim / run.job.id / "step.json").exists())
            # the controller copies a running pod's output every few seconds; a pod deleted
            # between two copies takes its output with it (as on a real cluster), so the
            # eviction waits until the first attempt's start is in the job log
            wait_until(lambda: "starts at step 0" in run.text())
            [ours] = [j for j in batch.list_namespaced_job("default").items]
            emu.kueue.evict("default", ours.metadata.name)  # a higher-priority workload came
            wait_until(lambda: run.store.job(run.job.id).state.terminal, 240)
            attempts = run.store.attempts(run.job.id)
            events = [e["message"] for e in run.store.events(run.job.id)]
            log = run.text()
        leftovers = emu.leftovers()
        workloads = emu.store.select("workloads")[0]
    assert run.store.job(run.job.id).state.value == "SUCCEEDED", log
    assert [(a.reason, a.exit_code) for a in attempts] == [("preempted", 75), ("succeeded", 0)], (
        log,
        events,
    )
    assert any("evicted by Kueue" in m and "Preempted" in m for m in events), events
    assert any("queued: waiting for admission by Kueue (LocalQueue spotwise)" in m for m in events)
    # the first attempt is billed from its admission, not from its launch
    assert attempts[0].started_at > queued_seen and attempts[0].started_at >= freed_at - 1.0
    resumed = [int(line.split()[-1]) for line in log.splitlines() if "starts at step" in line]
    assert resumed[0] == 0 and resumed[-1] > 0 and "done at step 80" in log
    assert leftovers == {"jobs": [], "pods": [], "processes": []} and workloads == []


def _blocker() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "blocker", "labels": {"kueue.x-k8s.io/queue-name": "spotwise"}},
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": SPOT,
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "b",
                            "image": "x",
                            "command": ["python", "-c", "import time; time.sleep(300)"],
                            "resources": {
                                "requests": {"cpu": "1"},
                                "limits": {"nvidia.com/gpu": "1"},
                            },
                        }
                    ],
                }
            },
        },
    }
