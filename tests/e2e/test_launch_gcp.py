"""``spotwise launch examples/digits/job-gcp.yaml`` on loopback Google Cloud: what ``spotwise
emulate gcp-compute`` runs (the Compute Engine double, its VMs running their startup scripts in
roots of their own with a GCP metadata server each, the GCS double for the job's ``gs://``
store) in the test's process, the controller in another through the official
google-cloud-compute and google-cloud-storage clients, real training, a real Spot preemption
(notice, shutdown, ``compute.instances.preempted``, deletion) and the resume from GCS."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotwise.emulators.gcp_compute import GcpComputeEmulator
from spotwise.emulators.gcs import GcsEmulator
from spotwise.settings import GCP_COMPUTE_ENDPOINT

from .conftest import HASH, SPOTWISE, checkpoint_steps, cli, launch_detached

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "digits" / "job-gcp.yaml"
PREEMPTED = "compute.instances.preempted"

pytestmark = pytest.mark.e2e


@dataclass
class Gce:
    env: dict[str, str]  # what `spotwise emulate gcp-compute` says to export
    double: GcpComputeEmulator
    gcs: GcsEmulator

    def checkpoints(self, besides: set[str] | frozenset[str] = frozenset()) -> dict[str, set[int]]:
        """The steps each job has saved in gs://spotwise-digits/jobs."""
        return checkpoint_steps(list(self.gcs.buckets["spotwise-digits"]), besides)


@pytest.fixture(scope="module")
def gce(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gce]:
    """What `spotwise emulate gcp-compute` runs, in this process so that a test can preempt a
    VM once it has saved (a fixed schedule races the VM's start on a loaded machine), with a
    stockout on the first insert in us-central1-a, and the GCS double the job's gs:// store is
    on (its endpoint in the VMs' environment, as their service account would reach GCS)."""
    gcs = GcsEmulator()
    gcs.start()
    gcs.add_bucket("spotwise-digits")
    double = GcpComputeEmulator(
        tmp_path_factory.mktemp("gce"),
        notice_lead_s=5,
        stop_grace_s=10,
        machine_env=gcs.env(),
        image=[ROOT],
    )
    double.fail("insert", "ZONE_RESOURCE_POOL_EXHAUSTED", 1, zone="us-central1-a")
    env = {**os.environ, GCP_COMPUTE_ENDPOINT.name: double.start(), **gcs.env()}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    try:
        yield Gce(env, double, gcs)
    finally:
        double.stop()
        gcs.stop()


def test_digits_on_gcp_spot_survives_a_preemption_with_identical_weights(
    gce: Gce, tmp_path: Path, uninterrupted
):
    """A stockout in the first zone sends the job to the second; its VM is preempted once it
    has saved; the next VM resumes from the object store (each VM has its own disk, gone with
    it) and ends with the weights of a run never interrupted; no VM is left."""
    from spotwise.control.spec import load_spec
    from spotwise.control.store import Store

    baseline = uninterrupted(load_spec(JOB))
    env = {**gce.env, "SPOTWISE_HOME": str(tmp_path / "home")}
    earlier = set(gce.checkpoints())  # (jobs of the tests before this one)
    launch = subprocess.Popen(
        [*SPOTWISE, "launch", str(JOB)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while not (saved := gce.checkpoints(earlier)):  # the first VM has saved to GCS
        assert launch.poll() is None and time.monotonic() < deadline, "no checkpoint saved"
        time.sleep(0.5)
    [(job_id, steps)] = saved.items()
    [first] = gce.double.live()
    gce.double.preempt(first)  # instance/preempted now, the guest's shutdown, off 5 s later
    out, _ = launch.communicate(timeout=600)
    assert launch.returncode == 0, out

    status = json.loads(cli("status", job_id, "--json", env=env).stdout)
    reasons = [a["reason"] for a in status["attempts"]]
    assert status["state"] == "SUCCEEDED", status
    assert status["preemptions"] >= 1 and reasons[-1] == "succeeded", reasons
    assert all(a["market"] == "spot" and a["provider"] == "gcp" for a in status["attempts"])
    refused = [
        e["message"]
        for e in Store(tmp_path / "home").events(job_id)
        if e["kind"] == "launch-refused"
    ]
    assert len(refused) == 1 and "ZONE_RESOURCE_POOL_EXHAUSTED" in refused[0]  # next zone
    preempted = [op for _, op in gce.double.operations.values() if op.operation_type == PREEMPTED]
    assert [op.target_link.rsplit("/", 1)[-1] for op in preempted] == [first]

    logs = cli("logs", job_id, env=env).stdout
    resumed = [int(step) for step in re.findall(r"resumed from step (\d+)", logs)]
    assert resumed and resumed[0] >= min(steps) > 0, logs[-3000:]  # from the object store
    assert not (tmp_path / "home" / "jobs" / job_id / "checkpoint").exists()
    got = HASH.findall(logs)
    assert len(got) == 1 and got[0] == baseline()

    inserted = [
        op
        for _, op in gce.double.operations.values()
        if op.operation_type == "insert" and not op.error.errors
    ]
    assert len(inserted) == len(status["attempts"])  # one VM per attempt, no duplicates
    assert gce.double.live() == []  # nothing left running or billed


def test_bad_input_is_named_by_its_key_before_any_vm(
    gce: Gce, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """An unknown project (through the CLI: the message, no traceback), zone, machine type or
    a GPU the zone does not offer: refused at submit, naming the key, with nothing inserted."""
    import yaml

    from spotwise.control.providers import make_provider
    from spotwise.errors import ConfigError

    doc = yaml.safe_load(JOB.read_text())
    bad = {**doc, "provider": {**doc["provider"], "project": "someone-elses"}}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({**bad, "workdir": str(JOB.parent)}))
    before = len(gce.double.operations)
    out = cli("launch", str(job_file), env={**gce.env, "SPOTWISE_HOME": str(tmp_path)}, timeout=120)
    assert out.returncode != 0 and "provider.gcp.project" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr

    for key in (GCP_COMPUTE_ENDPOINT.name, "STORAGE_EMULATOR_HOST"):
        monkeypatch.setenv(key, gce.env[key])
    options = {k: v for k, v in doc["provider"].items() if k != "name"}
    for change, named in [
        ({"zones": ["us-central1-q"]}, "provider.gcp.zones"),
        ({"machine_type": "g2-standard-5"}, "provider.gcp.machine_type"),
        (
            {"machine_type": "n1-standard-8", "accelerator_type": "nvidia-h100-80gb"},
            "provider.gcp.accelerator_type",
        ),
        ({"store": "gs://no-such-bucket/jobs"}, "provider.gcp.store"),
        ({"store": "gcs://spotwise-digits/jobs"}, "provider.gcp.store"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            make_provider(
                "gcp",
                {**options, **change},
                epoch=0.0,
                instance_type=doc["resources"]["instance_type"],
                preflight=True,
            )
    assert len(gce.double.operations) == before  # nothing was inserted


def test_controller_killed_mid_launch_then_resumed_leaves_no_orphan_or_duplicate(
    gce: Gce, tmp_path: Path
):
    """SIGKILL the controller right after its VM exists; `spotwise resume` adopts that VM as
    attempt 1 (a second insert of the same attempt would meet the VM's name: 409) and the job
    ends with one VM per attempt and none left."""
    import signal

    import yaml

    doc = yaml.safe_load(JOB.read_text())  # the same provider settings, a short command
    doc.update(command="python -c 'import time; time.sleep(10)'", workdir=str(JOB.parent))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    env = {**gce.env, "SPOTWISE_HOME": str(tmp_path / "home")}
    before = set(gce.double.operations)
    first = launch_detached(job_file, env)
    deadline = time.time() + 180
    while not gce.double.live():
        assert time.time() < deadline and first.poll() is None, "no VM was inserted"
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)  # right after instances.insert: the VM exists
    first.wait()
    [machine] = gce.double.live()
    [job] = json.loads(cli("jobs", "--json", env=env).stdout)

    resumed = cli("resume", job["id"], "--quiet", timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    status = json.loads(cli("status", job["id"], "--json", env=env).stdout)
    assert status["state"] == "SUCCEEDED"
    inserted = [
        op.target_link.rsplit("/", 1)[-1]
        for name, (_, op) in gce.double.operations.items()
        if name not in before and op.operation_type == "insert" and not op.error.errors
    ]
    assert inserted[0] == machine  # attempt 1 is the killed controller's VM, adopted
    assert len(inserted) == len(set(inserted)) == len(status["attempts"])  # no duplicate
    assert gce.double.live() == []
