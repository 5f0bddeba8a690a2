"""The Kubernetes API double, driven by the official ``kubernetes`` client over loopback HTTP:
list + watch with resourceVersion (and 410 Expired), Jobs with podFailurePolicy, pods that are
real local processes, graceful deletion, evictions, scheduling on labels/taints/GPUs, secrets by
reference, logs, and the API's own error documents."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch

from spotwise.emulators import machine_root
from spotwise.emulators.kubernetes import KubernetesEmulator, NodeSpec

NS = "default"
# saves on SIGTERM by exiting 75, like spotwise.Run after a notice
SAVER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
    "print('started', flush=True)\n"
    "time.sleep(60)\n"
)
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Callable[..., tuple[KubernetesEmulator, Any, Any]]]:
    made: list[KubernetesEmulator] = []

    def make(**kwargs: Any) -> tuple[KubernetesEmulator, Any, Any]:
        emu = KubernetesEmulator(tmp_path / f"k{len(made)}", **kwargs)
        emu.start()
        made.append(emu)
        api = config.new_client_from_config(str(emu.kubeconfig))
        return emu, client.CoreV1Api(api), client.BatchV1Api(api)

    yield make
    for emu in made:
        emu.stop()
        assert emu.cluster.running() == []


def job(
    name: str,
    code: str,
    *,
    grace: int = 2,
    gpus: int = 1,
    spot: bool = True,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "train",
                "image": "python:3.11",
                "command": ["python", "-c", code],
                "env": env or [],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }
    if spot:
        pod["nodeSelector"] = {"cloud.google.com/gke-spot": "true"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": "train", "operator": "In", "values": [75]},
                    },
                    {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod},
        },
    }


def wait_for(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def the_pod(core: Any, app: str) -> Any:
    pods = core.list_namespaced_pod(NS, label_selector=f"app={app}").items
    return pods[0] if pods else None


def pod_log(core: Any, name: str) -> str:
    """The log as the API sent it (text/plain). Undecoded, because kubernetes-client 36 turns a
    preloaded text body into the repr of its bytes (kubernetes-client/python#2596)."""
    response = core.read_namespaced_pod_log(name, NS, _preload_content=False)
    assert response.headers["Content-Type"].startswith("text/plain")
    return response.data.decode()


def terminated(pod: Any) -> Any:
    statuses = pod.status.container_statuses if pod is not None else None
    return statuses[0].state.terminated if statuses else None


def test_watch_from_the_lists_resource_version_streams_the_pods_life(cluster):
    _emu, core, batch = cluster()
    batch.create_namespaced_job(NS, job("w1", "print('done')"))
    listed = core.list_namespaced_pod(NS, label_selector="app=w1")
    seen: list[tuple[str, str | None]] = []
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        NS,
        label_selector="app=w1",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=20,
    ):
        pod = event["object"]
        assert isinstance(pod, client.V1Pod)  # the client deserialized the stream's objects
        seen.append((event["type"], pod.status.phase))
        if pod.status.phase == "Succeeded":
            break
    assert ("MODIFIED", "Running") in seen and seen[-1] == ("MODIFIED", "Succeeded")
    assert terminated(the_pod(core, "w1")).exit_code == 0
    done = wait_for(
        lambda: [
            c
            for c in batch.read_namespaced_job("w1", NS).status.conditions or []
            if c.type == "Complete" and c.status == "True"
        ]
    )
    assert done[0].reason == "Completed"
    assert pod_log(core, the_pod(core, "w1").metadata.name) == "done\n"


def test_a_watch_from_a_version_no_longer_kept_gets_410_expired(cluster):
    _emu, core, batch = cluster(history=5)
    old = core.list_namespaced_pod(NS).metadata.resource_version
    for i in range(4):  # each job and pod makes several changes: old falls out of history
        batch.create_namespaced_job(NS, job(f"e{i}", "pass"))
    wait_for(lambda: all(terminated(the_pod(core, f"e{i}")) for i in range(4)))
    with pytest.raises(client.ApiException) as err:
        list(
            watch.Watch().stream(
                core.list_namespaced_pod, NS, resource_version=old, timeout_seconds=2
            )
        )
    assert err.value.status == 410 and "too old resource version" in err.value.reason


def test_eviction_sends_sigterm_sets_disruption_target_and_fails_the_job(cluster):
    emu, core, batch = cluster(evict_after_s=[0.5])
    batch.create_namespaced_job(NS, job("ev", SAVER))
    pod = wait_for(lambda: (p := the_pod(core, "ev")) is not None and terminated(p) and p)
    assert terminated(pod).exit_code == 75  # it saved in its grace period
    assert pod.status.phase == "Failed" and pod.status.reason == "Terminated"
    disruption = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert disruption[0].status == "True" and disruption[0].reason == "TerminationByKubelet"
    failed = wait_for(
        lambda: [
            c
            for c in batch.read_namespaced_job("ev", NS).status.conditions or []
            if c.type == "Failed"
        ]
    )
    assert failed[0].reason == "PodFailurePolicy" and "exit code 75" in failed[0].message
    # Kubernetes did not retry it: one pod only
    assert len(core.list_namespaced_pod(NS, label_selector="app=ev").items) == 1
    assert emu.cluster.evictions == [pod.metadata.name]


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(cluster):
    _emu, core, batch = cluster(evict_after_s=[0.3], evict_mode="delete")
    batch.create_namespaced_job(NS, job("st", STUBBORN, grace=1))
    wait_for(
        lambda: the_pod(core, "st") is not None and the_pod(core, "st").status.phase == "Running"
    )
    started = time.monotonic()
    # delete mode: the node is gone, so is the pod object (PodGC)
    wait_for(lambda: the_pod(core, "st") is None)
    assert 1.0 <= time.monotonic() - started < 10
    failed = wait_for(
        lambda: [
            c
            for c in batch.read_namespaced_job("st", NS).status.conditions or []
            if c.type == "Failed"
        ]
    )
    assert failed[0].reason == "PodFailurePolicy" and "DisruptionTarget" in failed[0].message


def test_deleting_a_job_orphans_its_pod_by_default_and_background_stops_it(cluster):
    emu, core, batch = cluster()
    batch.create_namespaced_job(NS, job("or", SAVER))
    wait_for(
        lambda: the_pod(core, "or") is not None and the_pod(core, "or").status.phase == "Running"
    )
    batch.delete_namespaced_job("or", NS)  # the batch API's default: Orphan
    time.sleep(0.3)
    orphan = the_pod(core, "or")
    assert orphan.status.phase == "Running" and not orphan.metadata.owner_references
    core.delete_namespaced_pod(orphan.metadata.name, NS)
    wait_for(lambda: the_pod(core, "or") is None)

    batch.create_namespaced_job(NS, job("bg", SAVER))
    wait_for(
        lambda: the_pod(core, "bg") is not None and the_pod(core, "bg").status.phase == "Running"
    )
    name = the_pod(core, "bg").metadata.name
    events: list[Any] = []
    w = watch.Watch()
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    batch.delete_namespaced_job("bg", NS, propagation_policy="Background")
    for event in w.stream(
        core.list_namespaced_pod,
        NS,
        label_selector="app=bg",
        resource_version=rv,
        timeout_seconds=20,
    ):
        events.append(event)
        if event["type"] == "DELETED":
            break
    assert events[0]["object"].metadata.deletion_timestamp is not None  # graceful first
    assert terminated(events[-1]["object"]).exit_code == 75  # it got SIGTERM and saved
    assert events[-1]["object"].metadata.name == name
    assert emu.leftovers() == {"jobs": [], "pods": [], "processes": []}


def test_scheduler_respects_selectors_taints_and_gpu_capacity(cluster):
    _emu, core, batch = cluster(
        nodes=[
            NodeSpec("cpu-only", {"cloud.google.com/gke-spot": "true"}),
            NodeSpec(
                "tainted",
                {"cloud.google.com/gke-spot": "true"},
                [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}],
                gpus=1,
            ),
        ]
    )
    batch.create_namespaced_job(NS, job("gp", "pass"))
    pod = wait_for(lambda: (p := the_pod(core, "gp")) is not None and p.status.conditions and p)
    cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert cond.status == "False" and cond.reason == "Unschedulable"
    assert "0/2 nodes are available" in cond.message
    assert "Insufficient nvidia.com/gpu" in cond.message and "untolerated taint" in cond.message
    events = core.list_namespaced_event(
        NS, field_selector=f"involvedObject.name={pod.metadata.name}"
    ).items
    assert [e.reason for e in events] == ["FailedScheduling"]


def test_secret_references_are_resolved_in_the_pod_and_a_missing_one_blocks_it(cluster):
    _emu, core, batch = cluster()
    core.create_namespaced_secret(
        NS,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="creds"), string_data={"token": "s3cr3t"}
        ),
    )
    assert core.read_namespaced_secret("creds", NS).data == {"token": "czNjcjN0"}
    ref = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    code = "import os; print(os.environ['TOKEN'], os.environ['ME'])"
    batch.create_namespaced_job(NS, job("se", code, env=ref))
    pod = wait_for(lambda: (p := the_pod(core, "se")) is not None and terminated(p) and p)
    assert pod_log(core, pod.metadata.name) == f"s3cr3t {pod.metadata.name}\n"

    missing = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]
    batch.create_namespaced_job(NS, job("ms", "pass", env=missing))
    pod = wait_for(
        lambda: (p := the_pod(core, "ms")) is not None and p.status.container_statuses and p
    )
    waiting = pod.status.container_statuses[0].state.waiting
    assert waiting.reason == "CreateContainerConfigError" and "nope" in waiting.message


def test_api_errors_are_status_documents_the_client_understands(cluster):
    emu, _core, batch = cluster()
    batch.create_namespaced_job(NS, job("dup", "pass"))
    with pytest.raises(client.ApiException) as err:
        batch.create_namespaced_job(NS, job("dup", "pass"))
    assert err.value.status == 409 and "already exists" in err.value.body
    with pytest.raises(client.ApiException) as err:
        batch.read_namespaced_job("absent", NS)
    status = json.loads(err.value.body)
    assert err.value.status == 404 and status["reason"] == "NotFound"
    assert status["message"] == 'jobs.batch "absent" not found'
    with pytest.raises(client.ApiException) as err:
        batch.create_namespaced_job("nosuchns", job("x", "pass"))
    assert err.value.status == 404
    stranger = client.ApiClient(client.Configuration(host=emu.url))
    stranger.configuration.api_key = {"authorization": "Bearer wrong"}
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(stranger).list_node()
    assert err.value.status == 401
    assert emu.kubeconfig.stat().st_mode & 0o077 == 0  # the token file is private


def test_pvc_volumes_are_host_directories_and_mount_paths_are_rewritten(cluster):
    emu, core, batch = cluster()
    manifest = job("pv", "import os; open(os.environ['OUT'] + '/f', 'w').write('x')")
    spec = manifest["spec"]["template"]["spec"]
    spec["volumes"] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "spotwise-checkpoints"}}
    ]
    spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/ckpt"}]
    spec["containers"][0]["env"] = [{"name": "OUT", "value": "/ckpt/run"}]
    (emu.state_dir / "volumes" / NS / "spotwise-checkpoints" / "run").mkdir(parents=True)
    batch.create_namespaced_job(NS, manifest)
    wait_for(lambda: terminated(the_pod(core, "pv")))
    assert terminated(the_pod(core, "pv")).exit_code == 0
    assert (
        emu.state_dir / "volumes" / NS / "spotwise-checkpoints" / "run" / "f"
    ).read_text() == "x"


# what a pod tries: read the controller's files, leave something on its disk, on its volume
PROBE = """
import json, os, sys
canary = sys.argv[1]
try:
    seen = open(canary).read()
except OSError as exc:
    seen = type(exc).__name__
found = {p: os.path.exists(p) for p in ("left-in-cwd", os.path.expanduser("~/left-in-home"))}
print(json.dumps({"canary": seen, "found": found, "cwd": os.getcwd(),
                  "volume": sorted(os.listdir("/checkpoints"))}), flush=True)
open("left-in-cwd", "w").write("x")
open(os.path.expanduser("~/left-in-home"), "w").write("x")
open("/checkpoints/" + os.environ["ATTEMPT"], "w").write("kept")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root (as here and in CI)")
def test_each_pod_has_its_own_root_where_only_the_volume_outlives_it(cluster, tmp_path):
    """The controller's SPOTWISE_HOME is unreachable from a pod; what a pod writes to its
    working directory or HOME is gone for the next pod; what it writes on its volume stays."""
    home = tmp_path / "controller-home"
    home.mkdir()
    (home / "canary").write_text("controller secret")
    emu, core, batch = cluster()
    assert machine_root.isolated()
    logs = []
    for attempt in ("1", "2"):
        body = job(f"probe-{attempt}", PROBE, env=[{"name": "ATTEMPT", "value": attempt}])
        spec = body["spec"]["template"]["spec"]
        spec["containers"][0]["command"] += [str(home / "canary")]
        spec["containers"][0]["workingDir"] = "/work/run"
        spec["containers"][0]["volumeMounts"] = [{"name": "c", "mountPath": "/checkpoints"}]
        spec["volumes"] = [
            {"name": "c", "persistentVolumeClaim": {"claimName": "spotwise-checkpoints"}}
        ]
        batch.create_namespaced_job(NS, body)
        pod = wait_for(
            lambda a=attempt: (
                (p := the_pod(core, f"probe-{a}")) is not None
                and p.status.phase == "Succeeded"
                and p
            )
        )
        logs.append(json.loads(pod_log(core, pod.metadata.name)))
    first, second = logs
    assert first["canary"] == second["canary"] == "FileNotFoundError"
    assert second["found"] == {"left-in-cwd": False, "/root/left-in-home": False}
    assert first["cwd"] == "/work/run" and first["volume"] == [] and second["volume"] == ["1"]
    claim = emu.state_dir / "volumes" / NS / "spotwise-checkpoints"
    assert sorted(p.name for p in claim.iterdir()) == ["1", "2"]
    assert not Path("/work/run").exists()  # nothing of the pod's disk reached the host
