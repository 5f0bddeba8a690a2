"""The ``kubernetes`` provider against the loopback cluster, through the official client: checks
before launch, an attempt's life seen by watching (running, evicted and saved, lost, stopped),
nothing left behind, and nothing of the controller's environment in the manifest."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from spotwise.control.launching import launch_request
from spotwise.control.providers import LaunchRequest, Phase, Placement
from spotwise.control.providers.kubernetes import KubernetesProvider
from spotwise.control.spec import Resources, parse_spec
from spotwise.emulators.kubernetes import KubernetesEmulator, NodeSpec, pool_nodes
from spotwise.errors import ConfigError, ProviderUnavailableError

SAVER = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('saving', flush=True), sys.exit(75)))\n"
    "ckpt = os.environ['SPOTWISE_CHECKPOINT_DIR']\n"
    "os.makedirs(ckpt, exist_ok=True)\n"
    "open(os.path.join(ckpt, 'saved'), 'w').write(os.environ['SPOTWISE_ATTEMPT'])\n"
    "print('ckpt', ckpt, flush=True)\n"
    "time.sleep(60)\n"
)
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"


@pytest.fixture()
def emu(tmp_path: Path) -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator(tmp_path / "cluster") as cluster:
        yield cluster
    assert cluster.cluster.running() == []


def provider(
    emu: KubernetesEmulator, *, gpu_count: int = 1, preflight: bool = True, **options: Any
) -> KubernetesProvider:
    opts = {
        "image": "python:3.11",
        "flavour": "gke",
        "kubeconfig": str(emu.kubeconfig),
        "checkpoint_pvc": "spotwise-checkpoints",
        "grace_s": 3,
        "poll_s": 0.1,
        **options,
    }
    return KubernetesProvider(
        opts,
        epoch=time.time(),
        instance_type=None,
        preflight=preflight,
        resources=Resources(gpu="T4", gpu_count=gpu_count),
    )


def request(
    p: KubernetesProvider, tmp_path: Path, code: str, n: int = 1, market: str = "spot"
) -> LaunchRequest:
    """Attempt ``n`` as the controller builds it (``launch_request``)."""
    spec = parse_spec(
        {
            "name": "digits",
            "command": ["python", "-c", code],
            "env": {"MY_SETTING": "42"},
            "provider": {"name": "fake"},
        },
        base_dir=tmp_path,
    )
    job_dir = tmp_path / "job"
    return launch_request(
        spec,
        p,
        "digits-0a1b2c",
        n,
        Placement(market, p.features.zones[0]),
        job_dir=job_dir,
        log_path=job_dir / "job.log",
    )


def wait_phase(
    p: KubernetesProvider, handle: dict[str, Any], phases: set[Phase], timeout: float = 30.0
):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = p.status(handle)
        if status.phase in phases:
            return status
        time.sleep(0.05)
    raise AssertionError(f"still {status} after {timeout}s")


def test_an_evicted_attempt_that_saved_reports_exit_75_and_leaves_nothing(emu, tmp_path):
    emu.cluster.evict_after_s = [1.0]
    p = provider(emu)
    req = request(p, tmp_path, SAVER)
    launched = time.time()
    handle = p.launch(req)
    assert p.find("digits-0a1b2c", req.attempt_dir.parent) == [handle]
    running = wait_phase(p, handle, {Phase.RUNNING})
    # the container's start, within the attempt's own window (Kubernetes keeps whole seconds);
    # "near now" would fail whenever the wall clock steps or the machine stalls after the answer
    assert running.running_at is not None
    assert int(launched) <= running.running_at <= time.time()
    ended = wait_phase(p, handle, {Phase.EXITED, Phase.LOST})
    assert (ended.phase, ended.exit_code) == (Phase.EXITED, 75)
    assert "saving" in req.log_path.read_text()
    # $SPOTWISE_CHECKPOINT_DIR is /checkpoints/<job> in the pod: on the claim, which outlives it
    claim = emu.state_dir / "volumes" / "default" / "spotwise-checkpoints"
    assert (claim / "digits-0a1b2c" / "saved").read_text() == "1"
    assert p.status(handle) == ended  # the outcome outlives the deleted Job
    deadline = time.monotonic() + 10
    while emu.leftovers() != {"jobs": [], "pods": [], "processes": []}:
        assert time.monotonic() < deadline, emu.leftovers()
        time.sleep(0.05)
    assert p.find("digits-0a1b2c", req.attempt_dir.parent) == []


def test_a_pod_killed_with_its_node_is_lost_with_the_disruption_reason(tmp_path):
    with KubernetesEmulator(tmp_path / "c", evict_after_s=[0.5], evict_mode="delete") as emu:
        p = provider(emu, grace_s=1)
        handle = p.launch(request(p, tmp_path, STUBBORN))
        ended = wait_phase(p, handle, {Phase.EXITED, Phase.LOST})
        assert ended.phase is Phase.LOST and ended.exit_code == 137
        assert "DeletionByPodGC" in ended.detail and "node shutdown" in ended.detail


def test_terminate_gives_the_pod_its_grace_and_removes_the_job(emu, tmp_path):
    p = provider(emu)
    req = request(p, tmp_path, SAVER)
    handle = p.launch(req)
    deadline = time.monotonic() + 30
    # the running pod's output reaches the job log while it runs (spotwise logs -f)
    while not (req.log_path.exists() and "ckpt" in req.log_path.read_text()):
        assert p.status(handle).phase in (Phase.STARTING, Phase.RUNNING)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    p.terminate(handle)
    p.terminate(handle)  # idempotent
    ended = wait_phase(p, handle, {Phase.EXITED, Phase.LOST})
    assert ended.exit_code == 75  # SIGTERM reached it and it saved
    # no line twice (a deleted pod's last words may go with it, as on a real cluster)
    assert req.log_path.read_text().count("ckpt") == 1
    deadline = time.monotonic() + 10
    while emu.leftovers()["pods"] or emu.leftovers()["jobs"]:
        assert time.monotonic() < deadline, emu.leftovers()
        time.sleep(0.05)


def test_a_relaunch_after_a_lost_answer_adopts_the_existing_job(emu, tmp_path):
    p = provider(emu)
    req = request(p, tmp_path, "print('once')")
    first = p.launch(req)
    assert p.launch(req) == first  # 409 AlreadyExists: the same attempt, not a second one
    ended = wait_phase(p, first, {Phase.EXITED, Phase.LOST})
    assert (ended.phase, ended.exit_code) == (Phase.EXITED, 0)
    assert req.log_path.read_text().count("once") == 1


def test_the_manifest_carries_the_jobs_env_but_not_the_controllers(emu, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "controller-only")
    p = provider(emu, secret_env={"HF_TOKEN": "hf/token"})
    manifest = p.manifest(request(p, tmp_path, "pass"))
    assert kubernetes_validate.validate(manifest, "1.31", strict=True)
    text = yaml.safe_dump(manifest)
    assert "controller-only" not in text and str(Path.home()) not in text
    env = {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["MY_SETTING"] == "42" and env["SPOTWISE_PLATFORM"] == "kubernetes"
    assert env["SPOTWISE_CHECKPOINT_DIR"] == "/checkpoints/digits-0a1b2c"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert manifest["spec"]["template"]["spec"]["containers"][0]["command"][0] == "python"


def test_an_unschedulable_pod_is_starting_with_the_schedulers_reason(tmp_path):
    nodes = [NodeSpec("spot-small", {"cloud.google.com/gke-spot": "true"}, gpus=1)]
    with KubernetesEmulator(tmp_path / "c", nodes=nodes) as emu:
        p = provider(emu, gpu_count=1)
        busy = p.launch(request(p, tmp_path, SAVER, n=1))
        wait_phase(p, busy, {Phase.RUNNING})
        waiting = p.launch(request(p, tmp_path, SAVER, n=2))
        deadline = time.monotonic() + 10
        while "Insufficient nvidia.com/gpu" not in p.status(waiting).detail:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert p.status(waiting).phase is Phase.STARTING
        for h in (busy, waiting):
            p.terminate(h)
            wait_phase(p, h, {Phase.EXITED, Phase.LOST})


@pytest.mark.parametrize(
    ("nodes", "options", "gpus", "words"),
    [
        (pool_nodes("gke", gpus_per_node=0), {}, 1, "resources.gpu_count: 1 but no matching node"),
        (
            pool_nodes("plain"),
            {},
            1,
            "cloud.google.com/gke-spot=true that provider.kubernetes.flavour asks for",
        ),
        (pool_nodes("gke"), {"node_selector": {"pool": "a100"}}, 1, "pool=a100"),
        (
            pool_nodes("gke"),
            {"checkpoint_pvc": "nope"},
            1,
            "provider.kubernetes.checkpoint_pvc: 'nope' does not exist",
        ),
        (
            pool_nodes("gke"),
            {"namespace": "research"},
            1,
            "provider.kubernetes.namespace: 'research' does not exist",
        ),
    ],
)
def test_a_cluster_that_cannot_run_the_job_is_refused_before_launch(
    tmp_path, nodes, options, gpus, words
):
    with KubernetesEmulator(tmp_path / "c", nodes=nodes) as emu:
        with pytest.raises(ConfigError) as err:
            provider(emu, gpu_count=gpus, **options)
        assert words in str(err.value)
        assert emu.leftovers()["jobs"] == []


def test_bad_kubeconfig_wrong_credentials_and_no_server_are_clear_errors(emu, tmp_path):
    with pytest.raises(ConfigError, match=r"provider\.kubernetes\.kubeconfig"):
        provider(emu, kubeconfig=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"provider\.kubernetes\.context: no context 'prod'"):
        provider(emu, context="prod")
    doc = yaml.safe_load(emu.kubeconfig.read_text())
    doc["users"][0]["user"]["token"] = "stale"
    stale = tmp_path / "stale-kubeconfig"
    stale.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProviderUnavailableError, match="rejected the credentials") as err:
        provider(emu, kubeconfig=str(stale))
    assert "stale" not in str(err.value)  # the token is never echoed
    doc["users"][0]["user"]["token"] = emu.token
    doc["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # nothing listens there
    gone = tmp_path / "gone-kubeconfig"
    gone.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProviderUnavailableError, match="cannot reach the Kubernetes API"):
        provider(emu, kubeconfig=str(gone))


def test_check_nodes_false_lets_a_pool_that_scales_from_zero_be_used(tmp_path):
    with KubernetesEmulator(tmp_path / "c", nodes=[]) as emu:
        with pytest.raises(ConfigError, match="check_nodes: false"):
            provider(emu)
        p = provider(emu, check_nodes=False)
        handle = p.launch(request(p, tmp_path, "pass"))
        deadline = time.monotonic() + 10
        while "0/0 nodes are available" not in (status := p.status(handle)).detail:
            assert status.phase is Phase.STARTING and time.monotonic() < deadline
            time.sleep(0.05)
        p.terminate(handle)
        assert wait_phase(p, handle, {Phase.EXITED, Phase.LOST}).phase is Phase.LOST
        assert emu.leftovers() == {"jobs": [], "pods": [], "processes": []}


def test_checkpoints_go_to_s3_or_the_claim_and_nowhere_else(emu, tmp_path):
    p = provider(emu, checkpoint_pvc=None)
    spec = parse_spec(
        {
            "command": "python train.py --run-dir $SPOTWISE_CHECKPOINT_DIR",
            "checkpoint_dir": "s3://bucket/runs/digits",
            "provider": {"name": "fake"},
        },
        base_dir=tmp_path,
    )
    req = launch_request(
        spec,
        p,
        "digits-0a1b2c",
        1,
        Placement("spot", p.features.zones[0]),
        job_dir=tmp_path / "job",
        log_path=tmp_path / "job" / "job.log",
    )
    manifest = p.manifest(req)
    pod = manifest["spec"]["template"]["spec"]
    # expanded by the kubelet, from the pod's env: never the controller's own path
    assert pod["containers"][0]["command"][-1] == "$(SPOTWISE_CHECKPOINT_DIR)"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["SPOTWISE_CHECKPOINT_DIR"] == "s3://bucket/runs/digits"
    assert "volumes" not in pod and "volumeMounts" not in pod["containers"][0]
    with pytest.raises(ConfigError, match="checkpoint_pvc") as info:
        request(p, tmp_path, "pass")  # no claim, no object store: it would die with the pod
    assert "checkpoint_dir is not set" in info.value.message
    assert emu.leftovers()["jobs"] == []


@pytest.mark.parametrize(
    ("given", "fine"),
    [
        ("/checkpoints/mine", True),
        ("s3://b/x", True),
        ("/data/mine", False),
        ("/checkpointsX", False),
    ],
)
def test_a_checkpoint_dir_off_the_claim_is_refused_at_submit(emu, tmp_path, given, fine):
    from spotwise.control.store import Store
    from spotwise.control.submission import submit

    spec = parse_spec(
        {
            "command": "python train.py --run-dir $SPOTWISE_CHECKPOINT_DIR",
            "checkpoint_dir": given,
            "resources": {"gpu": "T4", "gpu_count": 1},
            "provider": {
                "name": "kubernetes",
                "image": "python:3.11",
                "flavour": "gke",
                "kubeconfig": str(emu.kubeconfig),
                "checkpoint_pvc": "spotwise-checkpoints",
            },
        },
        base_dir=tmp_path,
    )
    store = Store()
    if fine:
        assert submit(store, spec).spec["checkpoint_dir"] == given
        return
    with pytest.raises(ConfigError) as info:
        submit(store, spec)
    assert f"checkpoint_dir: {given!r} is on the machine's own disk" in info.value.message
    assert "under /checkpoints/ (the volume claim 'spotwise-checkpoints'" in str(info.value)
    assert store.jobs() == []


def test_a_watch_nobody_reads_ends_and_a_read_keeps_it(emu):
    """A job's list+watch ends once its status is no longer asked for (a server that drove many
    jobs must not keep a watch per finished job open), while one that is read stays up."""
    import kubernetes
    from kubernetes import client, config

    from spotwise.control.providers.kubernetes import _Informer

    api = client.CoreV1Api(config.new_client_from_config(str(emu.kubeconfig)))
    kube = kubernetes
    read = _Informer(kube, api.list_namespaced_pod, "default", "spotwise.dev/job=a", idle_s=2)
    unread = _Informer(kube, api.list_namespaced_pod, "default", "spotwise.dev/job=b", idle_s=2)
    assert read.synced.wait(30) and unread.synced.wait(30)
    deadline = time.monotonic() + 60
    while unread.alive:
        assert time.monotonic() < deadline, "an unread watch is still open after 60 s"
        read.items()
        time.sleep(0.2)
    assert read.alive  # read every 0.2 s all along
    deadline = time.monotonic() + 60
    while read.alive:  # now unread too
        assert time.monotonic() < deadline, "the watch stayed open after its reads stopped"
        time.sleep(0.2)


@pytest.mark.parametrize("ended_by", ["deleted", "deleting", "failed"])
def test_of_two_pods_made_in_one_second_the_ended_one_is_the_attempts(ended_by: str):
    """Creation times are whole seconds: Kueue evicting a pod within a second of its start and
    admitting the Job again leaves two pods of one time. The attempt is the one that ended (its
    replacement came after), whichever name sorts first (in one CI run the replacement's did,
    and the eviction was never seen)."""
    from datetime import datetime, timezone

    from kubernetes.client import V1ObjectMeta, V1Pod, V1PodStatus

    from spotwise.control.providers.kubernetes import _first_pods

    second = datetime(2026, 12, 3, 3, 40, 12, tzinfo=timezone.utc)

    def pod(name: str, phase: str, deleting: bool = False) -> V1Pod:
        meta = V1ObjectMeta(
            name=name, creation_timestamp=second, deletion_timestamp=second if deleting else None
        )
        return V1Pod(metadata=meta, status=V1PodStatus(phase=phase))

    evicted = pod(
        "job-1-d051e", "Failed" if ended_by == "failed" else "Running", ended_by == "deleting"
    )
    replacement = pod("job-1-c128d", "Pending")
    gone = {"job-1-d051e"} if ended_by == "deleted" else set()
    for listed in ([evicted, replacement], [replacement, evicted]):
        assert [p.metadata.name for p in _first_pods(listed, gone)] == ["job-1-d051e"]
    later = pod("job-1-a0000", "Running")
    later.metadata.creation_timestamp = second.replace(second=13)
    assert _first_pods([later, replacement], set()) == [replacement]  # the earlier second wins


def test_a_pod_with_an_index_the_job_controller_never_writes_is_not_the_attempts():
    """Anyone may create a pod carrying the Job's labels: one whose completion index is not a
    small decimal number is left out, where reading it raised out of the controller."""
    from kubernetes.client import V1ObjectMeta, V1Pod

    from spotwise.control.providers.kubernetes import INDEX_LABEL, _first_pods

    def pod(name: str, index: str | None) -> V1Pod:
        labels = {"job-name": "job-1"} | ({} if index is None else {INDEX_LABEL: index})
        return V1Pod(metadata=V1ObjectMeta(name=name, labels=labels))

    odd = [
        pod(f"odd-{i}", text) for i, text in enumerate(["x", "-1", "1e3", "\u0663", "", "9" * 5000])
    ]
    pods = [*odd, pod("job-1-b", "1"), pod("job-1-a", None)]
    assert [p.metadata.name for p in _first_pods(pods, set())] == ["job-1-a", "job-1-b"]
