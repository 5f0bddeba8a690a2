"""An aws job that spans regions: each attempt is launched, watched, found and terminated in
its zone's region (one EC2 client per region), against moto's EC2 + S3 on loopback with the
real boto3; and the errors for region and zone names that do not fit."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from spotwise.control.providers import LaunchRequest, Phase, Placement, make_provider
from spotwise.errors import ConfigError

REGIONS = ("us-west-2", "us-east-1")


def _ec2(endpoint: str, region: str) -> Any:
    return boto3.client("ec2", endpoint_url=endpoint, region_name=region)


@pytest.fixture()
def two_regions(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A bucket, one AMI per region and options naming both regions."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    bucket = f"regions-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=aws_env).create_bucket(Bucket=bucket)
    images = {  # AMI ids differ per region
        r: _ec2(aws_env, r).register_image(
            Name=f"spotwise-{uuid.uuid4().hex[:6]}", RootDeviceName="/dev/xvda"
        )["ImageId"]
        for r in REGIONS
    }
    options = {
        "regions": list(REGIONS),
        "zones": ["us-west-2b", "us-east-1a"],
        "s3": f"s3://{bucket}/jobs",
        "image_id": images,
        "instance_type": "g4dn.xlarge",
        "poll_s": 0.1,
    }
    return {"endpoint": aws_env, "options": options}


def _req(tmp_path: Path, job_id: str, n: int, zone: str) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        n=n,
        argv=("python", "train.py"),
        workdir=tmp_path,
        env={},
        log_path=tmp_path / "log",
        attempt_dir=tmp_path / "attempts" / str(n),
        placement=Placement("spot", zone),
    )


def test_each_attempt_runs_in_the_region_of_its_zone(two_regions, tmp_path: Path):
    p = make_provider("aws", two_regions["options"], epoch=0.0, preflight=True)
    assert p.features.zones == ("us-west-2b", "us-east-1a")
    # each zone priced in its own region (the catalog's g4dn.xlarge on-demand price differs)
    west, east = (p.prices.of(Placement("on-demand", z)) for z in p.features.zones)
    assert west.usd_per_hour > 0 and east.usd_per_hour > 0
    job = f"j{uuid.uuid4().hex[:6]}"
    first = p.launch(_req(tmp_path, job, 1, "us-west-2b"))
    second = p.launch(_req(tmp_path, job, 2, "us-east-1a"))
    for handle, region, zone in (
        (first, "us-west-2", "us-west-2b"),
        (second, "us-east-1", "us-east-1a"),
    ):
        assert handle["region"] == region
        found = _ec2(two_regions["endpoint"], region).describe_instances(
            Filters=[{"Name": "tag:spotwise:job", "Values": [job]}]
        )["Reservations"]
        [inst] = [i for r in found for i in r["Instances"]]  # only this attempt is there
        assert inst["InstanceId"] == handle["id"]
        assert inst["Placement"]["AvailabilityZone"] == zone
        assert inst["ImageId"] == two_regions["options"]["image_id"][region]
        assert p.status(handle).phase in (Phase.STARTING, Phase.RUNNING)
    # a restarted controller finds both (each in its region) and terminates them there
    found = {(h["n"], h["id"], h["region"]) for h in p.find(job, tmp_path) if "volume_id" not in h}
    assert found == {(1, first["id"], "us-west-2"), (2, second["id"], "us-east-1")}
    for handle in (first, second):
        p.terminate(handle)
        [res] = _ec2(two_regions["endpoint"], handle["region"]).describe_instances(
            InstanceIds=[handle["id"]]
        )["Reservations"]
        assert res["Instances"][0]["State"]["Name"] in ("shutting-down", "terminated")
    assert [h for h in p.find(job, tmp_path) if "volume_id" not in h] == []


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"regions": ["us-west-2", "us-esat-1"]},
            ["provider.aws.regions", "unknown region 'us-esat-1'", "did you mean", "us-east-1"],
        ),
        (
            {"zones": ["us-west-2b", "eu-west-1a"]},
            ["provider.aws.zones", "['eu-west-1a']", "no region of provider.aws.regions"],
        ),
        (
            {"image_id": {"us-west-2": "ami-12345678"}},
            ["provider.aws.image_id", "no entry for ['us-east-1']", "us-west-2, us-east-1"],
        ),
        ({"region": "us-east-1"}, ["both region and regions"]),
    ],
)
def test_region_and_zone_names_that_do_not_fit_name_the_key(aws_env, change, words):
    options = {
        "regions": ["us-west-2", "us-east-1"],
        "zones": ["us-west-2b", "us-east-1a"],
        "s3": "s3://some-bucket/jobs",
        "image_id": "ami-12345678",
        "instance_type": "g4dn.xlarge",
        **change,
    }
    with pytest.raises(ConfigError) as info:
        make_provider("aws", options, epoch=0.0)
    text = str(info.value)  # the message and its hint
    for word in words:
        assert word in text, text
