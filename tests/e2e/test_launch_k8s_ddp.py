"""``examples/digits/job-k8s-ddp.yaml`` on the loopback Kubernetes cluster: DDP (gloo, CPU) on
an Indexed Job of 2 pods behind a headless Service; one pod's node is reclaimed, both ranks
save the same step and every pod exits 75, the relaunch resumes on 2 fresh pods, and the final
weights equal those of a run at world size 2 never interrupted; nothing is left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwise.control.spec import load_spec
from spotwise.emulators.kubernetes import KubernetesEmulator, pool_nodes

from .conftest import HASH, SPOTWISE, cli

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-k8s-ddp.yaml"


@pytest.mark.e2e
def test_two_pod_ddp_loses_one_pod_every_rank_saves_and_the_weights_match(tmp_path: Path):
    spec = load_spec(JOB)
    assert (spec.nodes, spec.procs_per_node) == (2, 1)
    argv = [
        a.replace("$SPOTWISE_CHECKPOINT_DIR", str(tmp_path / "baseline")) for a in spec.command[1:]
    ]
    argv[argv.index("--step-sleep") + 1] = "0"  # (the sleep only stretches the job in time)
    baseline = subprocess.run(  # first: it takes no CPU from the pods' start-up
        [sys.executable, "-m", "spotwise.runtime.launch", "--standalone", "--nproc-per-node=2",
         "--no-python", sys.executable, *argv],
        cwd=spec.workdir, env={**os.environ, "SPOTWISE_PLATFORM": "none"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    nodes = pool_nodes("gke", spot=2, on_demand=0)
    with KubernetesEmulator(tmp_path / "cluster", nodes=nodes, image=[ROOT]) as emu:
        env = {**os.environ, "KUBECONFIG": str(emu.kubeconfig)}
        launch = subprocess.Popen(
            [*SPOTWISE, "launch", str(JOB)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        claim = tmp_path / "cluster" / "volumes" / "default" / "spotwise-checkpoints"
        deadline = time.monotonic() + 300
        while not list(claim.glob("*/step-*/manifest.json")):  # training, with a checkpoint
            assert launch.poll() is None and time.monotonic() < deadline, launch.stdout
            time.sleep(0.2)
        first = sorted(p["metadata"]["name"] for p in emu.store.select("pods")[0])
        assert [re.sub(r"-[a-z0-9]{5}$", "", n)[-2:] for n in first] == ["-0", "-1"], first
        emu.cluster.evict("default", first[1])  # rank 1's node is reclaimed
        out, _ = launch.communicate(timeout=600)
        assert launch.returncode == 0, out
        [job] = json.loads(cli("jobs", "--json", env=env).stdout)
        status = json.loads(cli("status", job["id"], "--json", env=env).stdout)
        logs = cli("logs", job["id"], env=env).stdout
        leftovers = emu.leftovers()
        services = emu.store.select("services")[0]
        exits = dict(emu.cluster.exits)
    assert status["state"] == "SUCCEEDED", logs[-3000:]
    assert [(a["reason"], a["exit_code"]) for a in status["attempts"]] == [
        ("preempted", 75),
        ("succeeded", 0),
    ]
    assert {exits[n] for n in first} == {75}, exits  # every pod (rank) of the attempt saved
    assert logs.count("attempt exit 75") == 2  # both launchers kept their ranks" 75
    resumed = [int(s) for s in re.findall(r"resumed from step (\d+)", logs)]
    assert resumed and resumed[0] > 0, logs[-3000:]
    assert HASH.findall(logs)[-1] == HASH.findall(baseline.stdout)[-1]
    assert status["cost_usd"] > 0
    assert leftovers == {"jobs": [], "pods": [], "processes": []} and services == []
