"""The emulators as the providers' own client libraries see them.

An emulator that a real SDK rejects rehearses nothing, so each one is checked here by the
official client of its platform, on 127.0.0.1, pointed at it the way each client documents:
google-auth (``GCE_METADATA_HOST`` / ``GCE_METADATA_IP``), botocore
(``AWS_EC2_METADATA_SERVICE_ENDPOINT``) and the ``ec2-metadata`` package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import urllib3
from botocore.session import Session
from botocore.utils import IMDSRegionProvider, InstanceMetadataRegionFetcher
from ec2_metadata import EC2Metadata

from spotwise.emulators import AwsImdsEmulator, GcpMetadataEmulator

# google-auth reads GCE_METADATA_HOST when it is imported, so it runs in a fresh interpreter
# with the variables set, as it would on a VM.
GOOGLE_AUTH_CLIENT = textwrap.dedent(
    """
    import json
    import google.auth
    import urllib3
    from google.auth.compute_engine import _metadata
    from google.auth.transport.urllib3 import Request

    request = Request(urllib3.PoolManager())
    out = {
        "ping": _metadata.ping(request),
        "is_on_gce": _metadata.is_on_gce(request),
        "id": _metadata.get(request, "instance/id"),
        "zone": _metadata.get(request, "instance/zone"),
        "machine_type": _metadata.get(request, "instance/machine-type"),
        "hostname": _metadata.get(request, "instance/hostname"),
        "preempted": _metadata.get(request, "instance/preempted"),
        "project": _metadata.get_project_id(request),
        "account": _metadata.get_service_account_info(request),
    }
    credentials, project = google.auth.default(request=request)
    credentials.refresh(request)
    out.update(default_project=project, credentials=type(credentials).__module__,
               email=credentials.service_account_email, token=credentials.token,
               valid=credentials.valid)
    print(json.dumps(out))
    """
)


def _google_auth(emu: GcpMetadataEmulator, tmp_path: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "GCE_"))}
    env.update(
        GCE_METADATA_HOST=emu.host_port,
        GCE_METADATA_IP=emu.host_port,
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),  # no user credentials get in the way
        HOME=str(tmp_path),
        GCE_METADATA_DETECT_RETRIES="1",
    )
    done = subprocess.run(
        [sys.executable, "-c", GOOGLE_AUTH_CLIENT],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_google_auth_takes_the_gcp_emulator_for_a_compute_engine_vm(tmp_path: Path) -> None:
    with GcpMetadataEmulator(
        port=0, zone="europe-west4-b", machine_type="a2-highgpu-1g", name="trainer"
    ) as emu:
        got = _google_auth(emu, tmp_path)
        assert emu.count("/", 200) >= 1  # the root probe was answered
    assert got["ping"] is True and got["is_on_gce"] is True
    assert got["zone"] == "projects/123456789012/zones/europe-west4-b"
    assert got["machine_type"] == "projects/123456789012/machineTypes/a2-highgpu-1g"
    assert got["hostname"] == "trainer.europe-west4-b.c.spotwise-project.internal"
    assert str(got["id"]).isdigit() and got["preempted"] == "FALSE"
    assert got["project"] == got["default_project"] == "spotwise-project"
    email = "123456789012-compute@developer.gserviceaccount.com"
    assert got["account"] == {
        "aliases": ["default"],
        "email": email,
        "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
    }
    assert got["credentials"] == "google.auth.compute_engine.credentials"
    assert got["email"] == email and got["valid"] is True
    assert str(got["token"]).startswith("emulated-")


def test_google_auth_sees_the_preemption(tmp_path: Path) -> None:
    with GcpMetadataEmulator(port=0) as emu:
        emu.trigger_notice()
        deadline = time.monotonic() + 5
        while emu.notice_visible_wall is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the notice is set by the emulator's timer thread
        assert _google_auth(emu, tmp_path)["preempted"] == "TRUE"


@pytest.fixture()
def imds_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """botocore reads IMDS settings from the environment and its config files: only ours."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return monkeypatch


@pytest.mark.parametrize("v2_required", [False, True], ids=["imds-v1-allowed", "imds-v2-required"])
def test_botocore_finds_its_region_through_the_token_flow(imds_env, v2_required: bool) -> None:  # type: ignore[no-untyped-def]
    with AwsImdsEmulator(port=0, region="eu-west-1", zone="eu-west-1c",
                         imdsv2_required=v2_required) as emu:  # fmt: skip
        imds_env.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", emu.url)
        if v2_required:
            imds_env.setenv("AWS_EC2_METADATA_V1_DISABLED", "true")
        region = IMDSRegionProvider(Session()).provide()
        assert region == "eu-west-1"
        assert emu.count("/latest/api/token", 200) == 1  # IMDSv2: a token first
        assert emu.count("/latest/meta-data/placement/availability-zone", 200) == 1
        fetcher = InstanceMetadataRegionFetcher(config={"ec2_metadata_service_endpoint": emu.url})
        assert fetcher.retrieve_region() == "eu-west-1"


def test_botocore_without_a_token_is_refused_when_v2_is_required(imds_env) -> None:  # type: ignore[no-untyped-def]
    with AwsImdsEmulator(port=0, imdsv2_required=True) as emu:
        emu.inject(403, on="/latest/api/token")  # the token endpoint blocked, e.g. by a hop limit
        imds_env.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", emu.url)
        assert IMDSRegionProvider(Session()).provide() is None  # v1 fallback gets 401
        assert emu.count("/latest/meta-data/placement/availability-zone", 401) == 1


def test_the_ec2_metadata_package_reads_identity_and_the_spot_notice() -> None:
    with AwsImdsEmulator(port=0, instance_type="g5.xlarge", region="us-west-2",
                         imdsv2_required=True) as emu:  # fmt: skip
        # ec2-metadata has no endpoint setting; its constructor takes the urllib3 pool it sends
        # through (``pool_manager``, since 3.0): a proxy pool carries its requests for
        # the link-local metadata address to the emulator on loopback, unchanged.
        md = EC2Metadata(pool_manager=urllib3.ProxyManager(emu.url))
        assert md.instance_type == "g5.xlarge"
        assert md.availability_zone == "us-west-2a"
        assert md.region == "us-west-2"  # from the instance identity document
        assert md.instance_id == emu.instance_id
        assert md.instance_identity_document["instanceType"] == "g5.xlarge"
        assert md.ami_id.startswith("ami-") and md.private_ipv4 == "10.0.0.12"
        assert md.private_hostname == "ip-10-0-0-12.us-west-2.compute.internal"
        assert md.instance_life_cycle == "spot"
        assert md.availability_zone_id is None  # not served: a 404, as the client allows
        assert md.spot_instance_action is None
        emu.trigger_notice()
        action = md.spot_instance_action
        assert action is not None and action.action == "terminate"
        ahead = (action.time - datetime.now(timezone.utc)).total_seconds()
        assert 100 < ahead <= 121
        assert emu.count("/latest/api/token", 200) == 1  # one token, reused (TTL 21600)
        assert emu.count("", 401) == 0
