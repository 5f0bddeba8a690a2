"""``spotwise launch examples/digits/job-k8s.yaml`` on the loopback Kubernetes cluster: the first
pod's spot node is reclaimed mid-run, the attempt saves and exits 75, the next pod resumes, the
job SUCCEEDS with the same final weights as a run never interrupted, and no Job or pod is left.
A cluster that cannot run the job (no GPUs, no spot nodes) is refused before anything is created."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from spotwise.control.spec import load_spec
from spotwise.emulators.kubernetes import KubernetesEmulator, NodeSpec, pool_nodes

from .conftest import HASH, SPOTWISE, cli

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-k8s.yaml"


@pytest.mark.e2e
def test_k8s_job_survives_an_eviction_with_identical_weights(tmp_path: Path, uninterrupted):
    final_hash = uninterrupted(load_spec(JOB))
    with KubernetesEmulator(tmp_path / "cluster", flavour="gke", image=[ROOT]) as emu:
        env = {**os.environ, "KUBECONFIG": str(emu.kubeconfig)}
        launch = subprocess.Popen(
            [*SPOTWISE, "launch", str(JOB)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        # reclaim the first pod's node once it has committed a checkpoint (startup time on a
        # loaded machine varies too much for a fixed schedule)
        claim = tmp_path / "cluster" / "volumes" / "default" / "spotwise-checkpoints"
        deadline = time.monotonic() + 300
        while not list(claim.glob("*/step-*/manifest.json")):
            assert launch.poll() is None and time.monotonic() < deadline, launch.stdout
            time.sleep(0.2)
        [pod] = emu.store.select("pods")[0]
        emu.cluster.evict("default", pod["metadata"]["name"])
        out, _ = launch.communicate(timeout=600)
        assert launch.returncode == 0, out
        [job] = json.loads(cli("jobs", "--json", env=env).stdout)
        status = json.loads(cli("status", job["id"], "--json", env=env).stdout)
        leftovers = emu.leftovers()
    assert status["state"] == "SUCCEEDED"
    reasons = [a["reason"] for a in status["attempts"]]
    assert reasons[0] == "preempted" and reasons[-1] == "succeeded", reasons
    assert status["attempts"][0]["exit_code"] == 75  # it saved within its grace period
    assert all(a["market"] == "spot" for a in status["attempts"])
    assert 0 < status["cost_usd"] < status["ondemand_cost_usd"]
    assert leftovers == {"jobs": [], "pods": [], "processes": []}

    logs = cli("logs", job["id"], env=env).stdout
    # the next pod resumed from the claim: each pod has its own disk, gone with it
    resumed = [int(step) for step in re.findall(r"resumed from step (\d+)", logs)]
    assert resumed and resumed[0] > 0, logs[-3000:]
    got = HASH.findall(logs)
    assert len(got) == 1
    assert got[0] == final_hash()
    # the checkpoints lived on the claim, not in the pod
    claim = tmp_path / "cluster" / "volumes" / "default" / "spotwise-checkpoints" / job["id"]
    assert any(claim.iterdir())


@pytest.mark.parametrize(
    ("flavour", "gpus", "words"),
    [
        (
            "gke",
            0,
            "resources.gpu_count: 1 but no matching node of the cluster has 1 allocatable "
            "nvidia.com/gpu",
        ),
        ("plain", 1, "no node of the cluster carries the label(s) cloud.google.com/gke-spot=true"),
    ],
)
def test_a_cluster_without_gpus_or_spot_nodes_is_refused_before_launch(
    tmp_path, flavour, gpus, words
):
    nodes = pool_nodes(flavour, gpus_per_node=gpus)
    with KubernetesEmulator(tmp_path / "cluster", nodes=nodes) as emu:
        env = {**os.environ, "KUBECONFIG": str(emu.kubeconfig)}
        done = cli("launch", str(JOB), env=env)
        assert done.returncode == 2, done.stdout + done.stderr
        assert words in done.stderr
        assert emu.leftovers()["jobs"] == [] and emu.api.requests  # it asked, created nothing
        assert not any(method == "POST" for method, _, _ in emu.api.requests)
        assert json.loads(cli("jobs", "--json", env=env).stdout) == []


@pytest.mark.e2e
def test_controller_killed_while_launching_resumes_without_orphan_or_duplicate(tmp_path: Path):
    """The controller is SIGKILLed while its pod waits for a GPU; while it is down the pod
    runs and its node is reclaimed; ``spotwise resume`` adopts what it finds (no second Job for
    that attempt), relaunches and succeeds, leaving nothing in the cluster."""
    doc = yaml.safe_load(JOB.read_text())
    doc["command"] = doc["command"].replace("--steps 120", "--steps 40")
    doc["workdir"] = str(JOB.parent)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    nodes = [NodeSpec("spot-0", {"cloud.google.com/gke-spot": "true"}, gpus=1)]
    with KubernetesEmulator(tmp_path / "cluster", nodes=nodes, image=[ROOT]) as emu:
        env = {**os.environ, "KUBECONFIG": str(emu.kubeconfig)}
        api = config.new_client_from_config(str(emu.kubeconfig))
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        blocker = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "blocker"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 1,
                        "nodeSelector": {"cloud.google.com/gke-spot": "true"},
                        "containers": [
                            {
                                "name": "b",
                                "image": "x",
                                "command": ["python", "-c", "import time; time.sleep(300)"],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            }
                        ],
                    }
                },
            },
        }
        batch.create_namespaced_job("default", blocker)  # holds the only GPU
        detached = cli("launch", str(job_file), "--detach", env=env)
        assert detached.returncode == 0, detached.stderr
        job_id = detached.stdout.strip()

        def our_pods() -> list:
            return core.list_namespaced_pod(
                "default", label_selector=f"spotwise.dev/job={job_id}"
            ).items

        _wait_for(lambda: any(p.status.conditions for p in our_pods()))  # Pending: no GPU
        controller = _controller_pid(job_id)
        os.kill(controller, signal.SIGKILL)
        batch.delete_namespaced_job("blocker", "default", propagation_policy="Background")
        claim = tmp_path / "cluster" / "volumes" / "default" / "spotwise-checkpoints" / job_id
        _wait_for(lambda: list(claim.glob("step-*/manifest.json")))
        [pod] = our_pods()
        emu.cluster.evict("default", pod.metadata.name)  # the node goes while nobody watches
        _wait_for(lambda: our_pods()[0].status.phase == "Failed")

        resumed = cli("resume", job_id, "--quiet", timeout=300, env=env)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        status = json.loads(cli("status", job_id, "--json", env=env).stdout)
        created = [
            path
            for method, path, code in emu.api.requests
            if method == "POST" and path.endswith("/jobs") and code == 201
        ]
        leftovers = emu.leftovers()
    assert [a["reason"] for a in status["attempts"]] == ["preempted", "succeeded"]
    assert len(created) == 1 + 2  # the blocker, then one Job per attempt: no duplicate
    assert leftovers == {"jobs": [], "pods": [], "processes": []}
    assert "resumed from step" in cli("logs", job_id, env=env).stdout


def _wait_for(check, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _controller_pid(job_id: str) -> int:
    """The detached controller's pid (``spotwise resume JOB --quiet``, started by --detach)."""
    for _ in range(600):
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"resume" in argv and job_id.encode() in argv:
                return int(proc.name)
        time.sleep(0.1)
    raise AssertionError(f"no controller process for {job_id}")
