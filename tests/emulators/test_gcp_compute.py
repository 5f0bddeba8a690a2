"""The loopback Compute Engine double against the official google-cloud-compute client and the
API's own JSON, and the gcp provider's handling of its faults and of missing credentials."""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotwise.control.providers import LaunchRequest, Placement, make_provider
from spotwise.emulators.gcp_compute import GcpComputeEmulator
from spotwise.errors import ProviderUnavailableError
from spotwise.settings import GCP_COMPUTE_ENDPOINT

PROJECT = "spotwise-project"
OPTIONS = {
    "project": PROJECT,
    "zones": ["us-central1-a"],
    "s3": "s3://unused-bucket/jobs",
    "machine_type": "g2-standard-4",
    "poll_s": 0.1,
}


@pytest.fixture()
def double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcpComputeEmulator]:
    emu = GcpComputeEmulator(tmp_path / "gce", stop_grace_s=1.0, poll_s=0.05)
    monkeypatch.setenv(GCP_COMPUTE_ENDPOINT.name, emu.start())
    yield emu
    emu.stop()


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_an_insert_with_a_field_the_api_lacks_is_refused_in_googles_error_shape(double):
    url = f"{double.url}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances"
    status, doc = _post(url, {"name": "vm-1", "machineType": "g2-standard-4", "gpus": 1})
    assert status == 400 and doc["error"]["code"] == 400
    assert doc["error"]["errors"][0]["reason"] == "invalid" and "gpus" in doc["error"]["message"]
    assert double.live() == []


def _request(tmp_path: Path) -> LaunchRequest:
    return LaunchRequest(
        job_id="Faults.1",
        n=1,
        argv=(sys.executable, "-c", "import time; time.sleep(60)"),
        workdir=Path("/"),
        env={"SPOTWISE_PLATFORM": "none"},
        log_path=tmp_path / "job.log",
        attempt_dir=tmp_path / "attempts" / "1",
        placement=Placement("spot", "us-central1-a"),
    )


def test_5xx_is_retried_and_a_quota_error_is_no_capacity(double, tmp_path):
    from spotwise.errors import CapacityError

    provider = make_provider("gcp", OPTIONS, epoch=0.0, instance_type=None)
    double.fail("insert", "QUOTA_EXCEEDED", 1)
    with pytest.raises(CapacityError, match="QUOTA_EXCEEDED"):
        provider.launch(_request(tmp_path))
    assert double.live() == []
    double.fail("insert", "503", 2)
    handle = provider.launch(_request(tmp_path))  # the third try is served
    inserts = [r for r in double.requests if r[0] == "POST" and r[1].endswith("/instances")]
    assert [status for *_, status in inserts] == [200, 503, 503, 200]
    assert [h["id"] for h in provider.find("Faults.1", tmp_path / "attempts")] == [handle["id"]]
    assert provider.find("faults.1", tmp_path / "attempts") == []  # the exact id, not its label
    [vm] = [v.doc for v in double.vms.values()]
    s = vm.scheduling
    assert (s.provisioning_model, s.instance_termination_action) == ("SPOT", "DELETE")
    assert s.on_host_maintenance == "TERMINATE" and not s.automatic_restart
    assert dict(vm.labels) == {"spotwise-job": "faults_1", "spotwise-attempt": "1"}
    assert all("cloud-platform" not in scope for scope in vm.service_accounts[0].scopes)
    provider.terminate(handle)


def test_a_credential_in_the_jobs_env_never_reaches_the_vm(double, tmp_path):
    from dataclasses import replace

    from spotwise.errors import ConfigError

    provider = make_provider("gcp", OPTIONS, epoch=0.0, instance_type=None)
    req = _request(tmp_path)
    with pytest.raises(ConfigError, match="HF_TOKEN"):
        provider.launch(replace(req, env={**req.env, "HF_TOKEN": "hf_secret_value"}))
    assert double.live() == [] and not double.operations


def test_no_credentials_is_a_clear_error(tmp_path, monkeypatch):
    """Without the endpoint override and without Application Default Credentials (and no
    metadata server probed), the provider names both ways to give them."""
    monkeypatch.delenv(GCP_COMPUTE_ENDPOINT.name, raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    with pytest.raises(ProviderUnavailableError) as info:
        make_provider("gcp", OPTIONS, epoch=0.0, instance_type=None)
    assert "gcloud auth application-default login" in str(info.value)


def test_a_gs_store_is_the_vms_run_dir_and_report_target(double, tmp_path):
    """``store: gs://...``: checkpoints default under it, the startup script reports there;
    ``s3:`` (the old spelling) takes only s3://, and both at once is refused by name."""
    from spotwise.errors import ConfigError

    options = {**{k: v for k, v in OPTIONS.items() if k != "s3"}, "store": "gs://ckpt/jobs/"}
    provider = make_provider("gcp", options, epoch=0.0, instance_type=None)
    assert provider.features.checkpoints.default == "gs://ckpt/jobs/{job_id}/checkpoint"
    assert "az://" in provider.features.checkpoints.durable
    script = provider.startup_script(_request(tmp_path))
    assert "remote_boot report gs://ckpt/jobs/Faults.1/attempts/1" in script
    for change, named in [
        ({"s3": "gs://ckpt/jobs"}, "provider.gcp.s3: 'gs://ckpt/jobs' is not an object-store"),
        ({**options, "s3": "s3://b/jobs"}, "provider.gcp: both store and s3"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            make_provider("gcp", {**OPTIONS, **change}, epoch=0.0, instance_type=None)
