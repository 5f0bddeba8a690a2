"""``spotwise emulate kubernetes`` and ``spotwise launch --dry-run`` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml
from kubernetes import client, config

from spotwise.emulators.kubernetes import KubernetesEmulator

ROOT = Path(__file__).resolve().parents[2]
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def test_emulate_kubernetes_prints_a_kubeconfig_the_official_client_uses(tmp_path: Path):
    proc = subprocess.Popen(
        [
            *SPOTWISE,
            "emulate",
            "kubernetes",
            "--dir",
            str(tmp_path),
            "--flavour",
            "aks",
            "--spot-nodes",
            "2",
            "--duration",
            "30",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "kubernetes API emulator listening on http://127.0.0.1:" in proc.stdout.readline()
        export = proc.stdout.readline().strip()
        assert export == f"export KUBECONFIG={tmp_path / 'kubeconfig'}"
        api = config.new_client_from_config(str(tmp_path / "kubeconfig"))
        nodes = client.CoreV1Api(api).list_node().items
        spot = [
            n
            for n in nodes
            if n.metadata.labels.get("kubernetes.azure.com/scalesetpriority") == "spot"
        ]
        assert len(spot) == 2 and all(n.spec.taints for n in spot)
        assert all(n.status.allocatable["nvidia.com/gpu"] == "1" for n in nodes)
    finally:
        proc.terminate()
        proc.wait(10)


def test_launch_dry_run_prints_the_job_and_creates_nothing(tmp_path: Path):
    with KubernetesEmulator(tmp_path / "cluster") as emu:
        env = {
            **os.environ,
            "KUBECONFIG": str(emu.kubeconfig),
            "AWS_SECRET_ACCESS_KEY": "controller-only",
        }
        done = subprocess.run(
            [*SPOTWISE, "launch", str(ROOT / "examples/digits/job-k8s.yaml"), "--dry-run"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert emu.api.requests == []  # a dry run contacts nothing
        jobs = json.loads(
            subprocess.run(
                [*SPOTWISE, "jobs", "--json"], capture_output=True, text=True, env=env, timeout=60
            ).stdout
        )
    [manifest] = list(yaml.safe_load_all(done.stdout))
    assert kubernetes_validate.validate(manifest, "1.31", strict=True)
    assert manifest["kind"] == "Job" and manifest["spec"]["backoffLimit"] == 0
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["python", "train.py"]
    assert "controller-only" not in done.stdout and jobs == []
    # the pod expands it (kubelet, from its env): the claim's path, not the controller's
    assert container["command"][2:4] == ["--run-dir", "$(SPOTWISE_CHECKPOINT_DIR)"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SPOTWISE_CHECKPOINT_DIR"] == "/checkpoints/digits-k8s-dryrun"


def test_dry_run_of_a_provider_without_manifests_says_so(tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text("command: python -c pass\n")
    done = subprocess.run(
        [*SPOTWISE, "launch", str(job), "--dry-run"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "provider 'local' creates no manifests to show" in done.stderr
